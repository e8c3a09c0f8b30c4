//! `rocebus-bench`: the benchmark harnesses. Each subcommand runs one side or
//! both sides of a measurement on an RDMA device and ends with one
//! machine-readable line, `RESULT key=value ...`, that `cargo xtask bench`
//! parses and sets beside perftest's figures from the same guest.

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "rocebus-bench",
    about = "rocebus latency and throughput harnesses (run under `cargo xtask bench`)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Orders path ping-pong: one-way latency (RTT/2) percentiles, like ib_write_lat.
    RcLatency(rocebus_bench::rc::RcArgs),
    /// Orders path one-way message rate with batching, like ib_write_bw.
    RcThroughput(rocebus_bench::rc::RcArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::RcLatency(a) => rocebus_bench::rc::latency(&a),
        Cmd::RcThroughput(a) => rocebus_bench::rc::throughput(&a),
    }
}
