//! `sample-engine`: the demo's trading engine (market data in over UD multicast, or shared
//! memory on the feed handler's host; orders out over RC to the order gateway). The logic is
//! in `rocebus_bench::demo`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use rocebus::counters::default_dir;
use rocebus_bench::demo::{run, EngineConfig, Floors, RunOptions};
use rocebus_bench::report::perftest_p50_ns;

/// A sample trading engine on rocebus: subscribes to the feed handler's normalized market
/// data, joins the book of its symbols on a fixed schedule through the order gateway, and
/// measures market-data latency and the order round trip (HdrHistogram, coordinated omission
/// corrected, CLOCK_MONOTONIC).
///
/// Prints a progress line every second and the report at the end; with `--out` it also
/// writes report.txt, result.txt, `.hgrm` files and PNG/SVG percentile plots there. Counters
/// are live in `$ROCEBUS_DIR/sample-engine.counters` (`rocebus stat`).
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Configuration file (configs/demo/sample-engine.toml documents every key).
    #[arg(short, long, default_value = "configs/demo/sample-engine.toml")]
    config: PathBuf,
    /// Seconds of trading once connected.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Folder for the report, `.hgrm` files and plots.
    #[arg(long)]
    out: Option<PathBuf>,
    /// `ib_write_lat`'s output on this host (a file): its median is drawn on the order
    /// round-trip plot as the floor.
    #[arg(long, value_name = "FILE")]
    floor_write: Option<PathBuf>,
    /// `ib_send_lat -c UD`'s output on this host (a file): its median is drawn on the
    /// market-data plot as the floor.
    #[arg(long, value_name = "FILE")]
    floor_send: Option<PathBuf>,
    /// Orders per second (overrides `strategy.orders_per_second`).
    #[arg(long)]
    orders_per_second: Option<u64>,
    /// Check the configuration file and exit.
    #[arg(long)]
    check: bool,
}

fn main() -> std::process::ExitCode {
    rocebus_bin_support::main(|| engine().map(|()| std::process::ExitCode::SUCCESS))
}

fn engine() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Warnings, and the transport settings and the GID of the gateway connection, as every
    // service logs them; the rest is the engine's own lines.
    rocebus_bin_support::init_logging("warn,rocebus::rdma_settings=info")?;
    let mut cfg =
        EngineConfig::load(&cli.config).context("fix the configuration file and start again")?;
    if let Some(rate) = cli.orders_per_second {
        anyhow::ensure!(
            (1..=1_000_000).contains(&rate),
            "--orders-per-second must be 1 to 1000000"
        );
        cfg.strategy.orders_per_second = rate;
    }
    if cli.check {
        println!("{}: ok", cli.config.display());
        return Ok(());
    }
    let opts = RunOptions {
        duration: Duration::from_secs(cli.seconds),
        progress: Duration::from_secs(1),
        counters_dir: Some(default_dir()),
    };
    let outcome = run(&cfg, &opts)?;
    match &cli.out {
        // Whoever asked for the files prints the report (cargo xtask demo does).
        Some(dir) => {
            let floor = |f: &Option<PathBuf>| {
                f.as_ref()
                    .and_then(|p| std::fs::read_to_string(p).ok())
                    .and_then(|t| perftest_p50_ns(&t))
            };
            let floors = Floors {
                write_p50_ns: floor(&cli.floor_write),
                send_p50_ns: floor(&cli.floor_send),
            };
            let files = outcome
                .write(dir, &floors)
                .with_context(|| format!("write the report into {}", dir.display()))?;
            println!(
                "sample-engine: wrote the report and {} files into {}",
                files.len(),
                dir.display()
            );
        }
        None => {
            print!("{}", outcome.report());
            println!("{}", outcome.result_line());
        }
    }
    Ok(())
}
