//! What a run says: the report text, the machine-readable `RESULT` line, and the files
//! (`.hgrm`, PNG and SVG plots) written at the end.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use rocebus_engine::proto::RejectReason;

use super::md::{BusCounts, MdCounts};
use super::orders::OrderCounts;
use super::CLOCK_NAME;
use crate::report::{
    plot_percentiles_with, summary_table, write_hgrm_file, PlotFormat, Reference, Summary,
};

/// Everything the report says.
#[derive(Debug)]
pub struct Outcome {
    /// Seconds of trading.
    pub seconds: f64,
    /// Orders per second scheduled.
    pub rate: u64,
    /// Market-data view (counts and latency).
    pub md: MdCounts,
    /// Bus totals.
    pub bus: BusCounts,
    /// Order-path counts.
    pub orders: OrderCounts,
    /// Rejects by reason code.
    pub rejects_by_reason: Vec<(RejectReason, u64)>,
    /// Market-data latency histogram.
    pub md_latency: Histogram<u64>,
    /// Order round-trip histogram.
    pub rtt: Histogram<u64>,
}

/// This host's raw-verbs floor, measured by perftest just before the run (the demo's
/// `floor-write.txt` and `floor-send.txt`): drawn on the plots as reference lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Floors {
    /// `ib_write_lat`'s median one-way latency, ns.
    pub write_p50_ns: Option<u64>,
    /// `ib_send_lat -c UD`'s median one-way latency, ns.
    pub send_p50_ns: Option<u64>,
}

impl Outcome {
    /// The report text.
    pub fn report(&self) -> String {
        let mut s = String::new();
        let line = |s: &mut String, t: String| {
            s.push_str(&t);
            s.push('\n');
        };
        line(
            &mut s,
            format!("rocebus demo report ({:.1} s of trading)", self.seconds),
        );
        line(&mut s, format!("clock: {CLOCK_NAME}"));
        line(
            &mut s,
            format!(
                "order round trip: intended send time on a fixed {} orders/s schedule -> venue ack back in the engine \
                 (coordinated omission corrected)",
                self.rate
            ),
        );
        line(
            &mut s,
            "market data: exchange packet arrival at the host (kernel stamp of the packet the feed handler reads) -> engine handler".into(),
        );
        let mut rows = Vec::new();
        if !self.md_latency.is_empty() {
            rows.push(("market data", Summary::of(&self.md_latency)));
        }
        if !self.rtt.is_empty() {
            rows.push(("order round trip", Summary::of(&self.rtt)));
        }
        if !rows.is_empty() {
            s.push_str(&summary_table(&rows));
        }
        if self.md_latency.is_empty() {
            line(
                &mut s,
                "market data latency: not measured (no exchange packet seen by the probe: \
                 market_data.exchange_feed unset, or no CAP_NET_RAW)"
                    .into(),
            );
        }

        let b = &self.bus;
        line(
            &mut s,
            format!(
                "market data: {} messages delivered ({} BBOs of traded symbols), {} gaps, {} recovered, \
                 {} unrecovered, {} snapshots, {} malformed, {} without a packet stamp",
                b.delivered, self.md.bbo_traded, b.gaps, b.recovered, b.unrecoverable, b.snapshots,
                self.md.malformed, self.md.unstamped
            ),
        );
        let o = &self.orders;
        line(
            &mut s,
            format!(
                "orders: {} sent, {} acks, {} fills, {} rejects, {} canceled, {} skipped (no quote), \
                 {} back-pressured, {} bad responses",
                o.sent, o.acks, o.fills, o.rejects, o.canceled, o.skipped_no_quote, o.back_pressured,
                o.bad_responses
            ),
        );
        for (reason, n) in &self.rejects_by_reason {
            line(&mut s, format!("  rejects {reason:?}: {n}"));
        }
        s
    }

    /// One machine-readable line, `RESULT key=value ...`, for `cargo xtask demo` and tests.
    pub fn result_line(&self) -> String {
        let q = |h: &Histogram<u64>, p: f64| {
            if h.is_empty() {
                0
            } else {
                h.value_at_quantile(p)
            }
        };
        format!(
            "RESULT md_messages={} md_gaps={} md_recovered={} md_unrecoverable={} md_latency_count={} \
             md_p50_ns={} md_p99_ns={} orders={} acks={} fills={} rejects={} rtt_count={} rtt_p50_ns={} \
             rtt_p99_ns={} rtt_max_ns={}",
            self.bus.delivered,
            self.bus.gaps,
            self.bus.recovered,
            self.bus.unrecoverable,
            self.md_latency.len(),
            q(&self.md_latency, 0.5),
            q(&self.md_latency, 0.99),
            self.orders.sent,
            self.orders.acks,
            self.orders.fills,
            self.orders.rejects,
            self.rtt.len(),
            q(&self.rtt, 0.5),
            q(&self.rtt, 0.99),
            self.rtt.max(),
        )
    }

    /// Writes `report.txt`, `result.txt`, the `.hgrm` files and the PNG and SVG plots of
    /// each measured path into `dir`, each plot with its perftest floor from `floors` as a
    /// reference line when measured; returns the files written.
    pub fn write(&self, dir: &Path, floors: &Floors) -> anyhow::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut files = Vec::new();
        let mut put = |name: &str, text: &str| -> anyhow::Result<()> {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
            files.push(p);
            Ok(())
        };
        put("report.txt", &self.report())?;
        put("result.txt", &(self.result_line() + "\n"))?;
        for (stem, title, h, floor) in [
            (
                "md-latency",
                "market data: exchange packet arrival -> engine handler",
                &self.md_latency,
                floors.send_p50_ns.map(|ns| Reference {
                    label: "ib_send_lat -c UD p50 (one UD send, floor)",
                    ns,
                }),
            ),
            (
                "order-rtt",
                "order round trip: intended send -> venue ack -> engine",
                &self.rtt,
                floors.write_p50_ns.map(|ns| Reference {
                    label: "ib_write_lat p50 (one RDMA WRITE, floor)",
                    ns,
                }),
            ),
        ] {
            if h.is_empty() {
                continue;
            }
            let hgrm = dir.join(format!("{stem}.hgrm"));
            write_hgrm_file(&hgrm, h)?;
            files.push(hgrm);
            for (ext, format) in [("png", PlotFormat::Png), ("svg", PlotFormat::Svg)] {
                let p = dir.join(format!("{stem}.{ext}"));
                plot_percentiles_with(&p, format, title, &[("rocebus demo", h)], floor)?;
                files.push(p);
            }
        }
        Ok(files)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::LatencyRecorder;

    #[test]
    fn outcome_writes_report_hgrm_and_plots() {
        let mut rtt = LatencyRecorder::new().unwrap();
        for i in 0..1000u64 {
            rtt.record(1_000_000, 1_000_000 + 20_000 + i * 10);
        }
        let out = Outcome {
            seconds: 3.0,
            rate: 100,
            md: MdCounts {
                messages: 5,
                ..MdCounts::default()
            },
            bus: BusCounts {
                delivered: 5,
                ..BusCounts::default()
            },
            orders: OrderCounts {
                sent: 1000,
                acks: 1000,
                fills: 1000,
                rejects: 2,
                ..OrderCounts::default()
            },
            rejects_by_reason: vec![(RejectReason::PriceCollar, 2)],
            md_latency: LatencyRecorder::new().unwrap().into_histogram(),
            rtt: rtt.into_histogram(),
        };
        let text = out.report();
        assert!(text.contains("CLOCK_MONOTONIC"), "{text}");
        assert!(text.contains("order round trip"), "{text}");
        assert!(text.contains("PriceCollar: 2"), "{text}");
        assert!(text.contains("not measured"), "{text}");
        let line = out.result_line();
        assert!(line.starts_with("RESULT md_messages=5 "), "{line}");
        assert!(
            line.contains(" acks=1000 ") && line.contains(" rtt_count=1000 "),
            "{line}"
        );
        let dir = tempfile::tempdir().unwrap();
        let floors = Floors {
            write_p50_ns: Some(9_000),
            send_p50_ns: None,
        };
        match out.write(dir.path(), &floors) {
            Ok(files) => {
                let svg = std::fs::read_to_string(dir.path().join("order-rtt.svg")).unwrap();
                assert!(svg.contains("ib_write_lat p50"), "the floor line is named");
                for f in [
                    "report.txt",
                    "result.txt",
                    "order-rtt.hgrm",
                    "order-rtt.png",
                    "order-rtt.svg",
                ] {
                    let p = dir.path().join(f);
                    assert!(files.contains(&p), "{f} not listed");
                    assert!(std::fs::metadata(&p).unwrap().len() > 0, "{f} empty");
                }
                assert!(!dir.path().join("md-latency.hgrm").exists());
            }
            // Without a font (fonts-dejavu-core) plots cannot be drawn: that must be the
            // only reason, and the text files must be there.
            Err(e) => {
                assert!(format!("{e:#}").contains("font"), "{e:#}");
                assert!(dir.path().join("order-rtt.hgrm").exists());
            }
        }
    }
}
