//! `rocebus-bench`: the benchmark harnesses. Each subcommand runs one side or
//! both sides of a measurement on an RDMA device and ends with one
//! machine-readable line, `RESULT key=value ...`, that `cargo xtask bench`
//! parses and sets beside perftest's figures from the same guest.

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

mod admission;
mod feed;
mod gateway;
mod journal;
mod tagcost;

#[derive(Parser, Debug)]
#[command(
    name = "rocebus-bench",
    about = "rocebus latency and throughput harnesses (run under `cargo xtask bench`)"
)]
struct Cli {
    /// End with one more line: a JSON object `{"bench": NAME, "figures": {...}}` holding the
    /// figures of the `RESULT` line (and of harnesses without one).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Orders path ping-pong: one-way latency (RTT/2) percentiles, like ib_write_lat.
    RcLatency(rocebus_bench::rc::RcArgs),
    /// Orders path one-way message rate with batching, like ib_write_bw.
    RcThroughput(rocebus_bench::rc::RcArgs),
    /// Orders path ping-pong client, one process: -n round trips and nothing else (run under
    /// callgrind by `cargo xtask bench rc-instructions`).
    RcPing(rocebus_bench::rc::PingArgs),
    /// Orders path echo for rc-ping, the other process: echoes until the client disconnects.
    RcPong(rocebus_bench::rc::PingArgs),
    /// Instructions per round trip from three callgrind profiles of a ping-pong client
    /// (N, 2N, and 2N slowed down): set-up and waiting excluded.
    CallgrindAccount(rocebus_bench::callgrind::AccountArgs),
    /// Orders path fan-in: one-way latency of one active engine among N connected idle ones.
    RcFanin(rocebus_bench::rc::FanInArgs),
    /// Orders path fan-in: four senders into one receiver, total messages per second (vs ib_write_bw -q 4).
    RcFaninThroughput(rocebus_bench::rc::RcArgs),
    /// Market data: 64-byte messages per second over UD multicast, zero unrecovered loss (vs ib_send_bw -c UD).
    MdThroughput(rocebus_bench::md::MdArgs),
    /// Market data: publish-to-handler latency, ping-pong over two groups (vs ib_send_lat -c UD -g, two groups).
    MdLatency(rocebus_bench::md::MdArgs),
    /// Market data ping-pong client (md-latency's, echo in a second process): -n round trips
    /// and nothing else (run under callgrind by `cargo xtask bench md-instructions`).
    MdPing(rocebus_bench::md::MdArgs),
    /// Market data: time to recover one lost datagram, in RC round trips.
    MdRecovery(rocebus_bench::md::MdArgs),
    /// Market data: publisher CPU per message, multicast vs RC fan-out, 1/2/4 subscribers.
    MdFanout(rocebus_bench::fanout::FanoutArgs),
    /// Shared memory: ping-pong round trip between two spinning threads (vs Aeron's aeron:ipc).
    IpcLatency(rocebus_bench::ipc::IpcArgs),
    /// Shared memory: 64-byte messages per second, one publisher to one subscriber.
    IpcThroughput(rocebus_bench::ipc::IpcArgs),
    /// The floor under ipc-latency: a bare ping-pong of one word in each of two cache lines
    /// between the same two pinned cores (two line transfers a round trip, nothing else).
    IpcFloor(rocebus_bench::ipc::IpcArgs),
    /// Order gateway: engine → gateway (risk, journal, FIX) → in-process venue → engine, over RC.
    GatewayRtt(gateway::GatewayRttArgs),
    /// Order gateway journal, on the host: orders/s per fsync policy (group, never,
    /// every_n), on tmpfs and on disk, one and 16 orders per service turn.
    GatewayJournal(journal::GatewayJournalArgs),
    /// Order gateway restart: writes a journal of N orders, times open + replay.
    GatewayRestart(journal::GatewayRestartArgs),
    /// One timed open + replay of a journal (the child process of gateway-restart).
    #[command(hide = true)]
    GatewayReplay(journal::GatewayReplayArgs),
    /// Feed handler end to end: MoldUDP64 packet received (UDP) → ITCH → book → bus → subscriber handler.
    FeedE2e(feed::FeedE2eArgs),
    /// Runs a command with multicast groups joined at the IP level (and, in a
    /// one-host guest, eth0's egress sunk): what perftest's multicast mode
    /// needs on RoCE v2 to take the same path as rocebus.
    WithGroups(rocebus_bench::md::WithGroupsArgs),
    /// Per-datagram tag (SipHash-2-4, `auth::DatagramKey::tag`/`verify`) cost on this CPU, no
    /// RDMA: ns per tag and per verify for md-path datagram sizes, beside keyed BLAKE3's.
    TagCost(tagcost::TagCostArgs),
    /// An orders listener's cost per connect request before it answers anything (first
    /// proof, cookie, admission), for each kind of request a flood brings; no RDMA.
    AdmissionCost(admission::AdmissionCostArgs),
    /// Orders path under a flood of connect requests from a pyverbs stranger
    /// (`core/tests/attackers/cm_flood.py`): a healthy peer's handshake time (plain and
    /// through the cookie) and the ping-pong's latency, quiet and flooded, in alternating
    /// rounds; the listener's time per refused request.
    RcFlood(rocebus_bench::flood::RcFloodArgs),
}

fn main() -> std::process::ExitCode {
    rocebus_bin_support::main(|| run().map(|()| std::process::ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let matches = Cli::command().get_matches();
    let name = matches.subcommand_name().unwrap_or_default().to_owned();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let json = cli.json;
    harness(cli.cmd)?;
    if json {
        println!("{}", rocebus_bench::report::json_line(&name));
    }
    Ok(())
}

fn harness(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::RcLatency(a) => rocebus_bench::rc::latency(&a),
        Cmd::RcThroughput(a) => rocebus_bench::rc::throughput(&a),
        Cmd::RcPing(a) => rocebus_bench::rc::ping(&a),
        Cmd::RcPong(a) => rocebus_bench::rc::pong(&a),
        Cmd::CallgrindAccount(a) => rocebus_bench::callgrind::report(&a),
        Cmd::RcFanin(a) => rocebus_bench::rc::fanin(&a),
        Cmd::RcFaninThroughput(a) => rocebus_bench::rc::fanin_throughput(&a),
        Cmd::MdThroughput(a) => rocebus_bench::md::throughput(&a),
        Cmd::MdLatency(a) => rocebus_bench::md::latency(&a),
        Cmd::MdPing(a) => rocebus_bench::md::ping(&a),
        Cmd::MdRecovery(a) => rocebus_bench::md::recovery(&a),
        Cmd::MdFanout(a) => rocebus_bench::fanout::run(&a),
        Cmd::IpcLatency(a) => rocebus_bench::ipc::latency(&a),
        Cmd::IpcThroughput(a) => rocebus_bench::ipc::throughput(&a),
        Cmd::IpcFloor(a) => rocebus_bench::ipc::floor(&a),
        Cmd::GatewayRtt(a) => gateway::run(&a),
        Cmd::GatewayJournal(a) => journal::run(&a),
        Cmd::GatewayRestart(a) => journal::restart(&a),
        Cmd::GatewayReplay(a) => journal::replay(&a),
        Cmd::FeedE2e(a) => feed::run(&a),
        Cmd::TagCost(a) => tagcost::run(&a),
        Cmd::AdmissionCost(a) => admission::run(&a),
        Cmd::RcFlood(a) => rocebus_bench::flood::run(&a),
        Cmd::WithGroups(a) => {
            let status = rocebus_bench::md::with_groups(&a)?;
            std::process::exit(status.code().unwrap_or(1));
        }
    }
}
