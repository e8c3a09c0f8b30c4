//! `rocebus-bench`: the benchmark harnesses. Each subcommand runs one side or
//! both sides of a measurement on an RDMA device and ends with one
//! machine-readable line, `RESULT key=value ...`, that `cargo xtask bench`
//! parses and sets beside perftest's figures from the same guest.

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "rocebus-bench", about = "rocebus latency and throughput harnesses (run under `cargo xtask bench`)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    // Subcommands are added by each harness module (rc.rs, md.rs, ...).
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {}
}
