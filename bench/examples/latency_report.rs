//! Writes a sample latency report from synthetic data, to see the formats:
//! `cargo run -p rocebus-bench --example latency_report -- OUT_DIR`.

use hdrhistogram::Histogram;
use rocebus_bench::report::{
    plot_percentiles_with, summary_table, write_hgrm_file, PlotFormat, Reference, ReportError,
    Summary,
};

/// A deterministic long-tailed distribution around `base_ns`.
fn synthetic(base_ns: u64, n: u64) -> Result<Histogram<u64>, ReportError> {
    let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).map_err(ReportError::Histogram)?;
    for i in 1..=n {
        // Tail grows as 1/(1-q): q = i/n.
        let q = i as f64 / (n as f64 + 1.0);
        h.saturating_record(base_ns + (base_ns as f64 * 0.05 / (1.0 - q)) as u64);
    }
    Ok(h)
}

fn main() -> Result<(), ReportError> {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "target/latency-report".to_string());
    let ours = synthetic(2_000, 200_000)?;
    let theirs = synthetic(1_600, 200_000)?;
    println!(
        "{}",
        summary_table(&[
            ("rocebus", Summary::of(&ours)),
            ("ib_write_lat", Summary::of(&theirs))
        ])
    );
    write_hgrm_file(format!("{out}/rocebus.hgrm"), &ours)?;
    write_hgrm_file(format!("{out}/ib_write_lat.hgrm"), &theirs)?;
    let series = [("rocebus", &ours), ("ib_write_lat", &theirs)];
    // perftest's median as the floor the series are read against.
    let floor = Reference {
        label: "ib_write_lat p50 (floor)",
        ns: theirs.value_at_quantile(0.5),
    };
    for (ext, format) in [("png", PlotFormat::Png), ("svg", PlotFormat::Svg)] {
        plot_percentiles_with(
            format!("{out}/latency.{ext}"),
            format,
            "round trip (synthetic)",
            &series,
            Some(floor),
        )?;
    }
    println!("wrote {out}/rocebus.hgrm, ib_write_lat.hgrm, latency.png, latency.svg");
    Ok(())
}
