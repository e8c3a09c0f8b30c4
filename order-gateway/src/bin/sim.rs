//! `order-gateway-sim`: runs the deterministic simulator ([`order_gateway::simulator`]).
//! `cargo xtask sim` builds it in release mode and runs it.

use std::time::Instant;

use clap::Parser;
use order_gateway::simulator::{run_seed, SimConfig, Summary};

#[derive(Parser, Debug)]
#[command(about = "Runs the gateway against simulated engines, venue, network, disk and clock")]
struct Args {
    /// Run this one seed (replays a failure).
    #[arg(long)]
    seed: Option<u64>,
    /// Number of seeds to run from --base.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// First seed of a --seeds run.
    #[arg(long, default_value_t = 0)]
    base: u64,
    /// Steps per seed.
    #[arg(long, default_value_t = SimConfig::default().steps)]
    steps: u32,
    /// Only the faults today's journal format is known to handle (what CI runs).
    #[arg(long)]
    known_journal_limits: bool,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let base_cfg = if args.known_journal_limits {
        SimConfig::known_journal_limits()
    } else {
        SimConfig::default()
    };
    let cfg = SimConfig {
        steps: args.steps,
        ..base_cfg
    };
    let (base, n) = match args.seed {
        Some(s) => (s, 1),
        None => (args.base, args.seeds),
    };
    let t = Instant::now();
    let mut summary = Summary::default();
    for seed in base..base + n {
        let r = run_seed(seed, &cfg);
        if let Err(f) = &r {
            println!("FAIL {f}");
        } else if std::env::var_os("SIM_REFUSALS").is_some() {
            if let Ok(r) = &r {
                if let Some(w) = &r.refused {
                    println!(
                        "REFUSED {seed}: {}",
                        w.chars().take(160).collect::<String>()
                    );
                }
            }
        } else if args.seed.is_some() {
            println!("seed {seed}: ok {r:?}");
        }
        summary.add(r);
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{} seeds ({}..{}) in {secs:.1} s: {:.1} seeds/s; {} failed, {} ended in a correct \
         refusal of a damaged journal, {} restarts",
        summary.seeds,
        base,
        base + n,
        summary.seeds as f64 / secs.max(1e-9),
        summary.failures.len(),
        summary.refused,
        summary.restarts
    );
    println!(
        "faults injected per 1,000 seeds:\n{}",
        summary.faults_per_1000()
    );
    if summary.failures.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
