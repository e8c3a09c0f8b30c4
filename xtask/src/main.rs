//! Developer automation for rocebus: set-up, soft-RoCE guests, tests,
//! benchmarks and the demo. Run as `cargo xtask <command>`.

mod bench;
mod books;
mod check_build;
mod demo;
mod fuzz;
mod ipc;
mod md_fanout;
mod md_instructions;
mod md_repair;
mod rc_instructions;
mod reference;
mod self_contained;
mod setup;
mod test;
mod test_lint;
mod venue;
mod verdict;
mod vm;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask",
    about = "rocebus developer tasks: set-up, soft-RoCE guests, tests, benchmarks, demo",
    long_about = "rocebus developer tasks.\n\nThe build machines have no RDMA in their kernel, so \
RDMA code runs inside qemu guests booting a stock Debian kernel with the soft-RoCE driver \
(rdma_rxe). `setup` prepares everything; `vm` runs any command in one or two guests; `test` runs \
the host tests and then the RDMA tests in the guests."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Install the Debian packages (as root), fetch the guest kernel and build the initramfs (cached).
    Setup,
    /// Boot soft-RoCE guest(s) and run CMD in each; exits with CMD's status.
    ///
    /// Each guest sees the host's filesystem read-only (plus tmpfs /tmp), has rxe0 on eth0 at
    /// 198.18.0.{1,2,3,4} (GID index 1; guest 0's peer is guest 1, every other guest's peer is
    /// guest 0) and exports ROCEBUS_GUEST_INDEX, ROCEBUS_HOSTS,
    /// ROCEBUS_GUEST_ADDR, ROCEBUS_PEER_ADDR, ROCEBUS_RDMA_DEVICE, ROCEBUS_GID_INDEX and
    /// ROCEBUS_OUT (a folder the host can read afterwards).
    ///
    /// Two guests are linked directly, three or four through one emulated switch (a host-side
    /// learning-free switch in xtask: unicast by destination MAC, multicast flooded). With two
    /// guests or more, if the link between them dropped packets by itself (the host's UDP
    /// RcvbufErrors/InErrors grew during the run), says so and exits with 75 (inconclusive)
    /// when CMD succeeded.
    Vm {
        /// Number of guests: 1 (timing), 2 linked guests (cross-host, loss tests), or 3-4 on
        /// one switch (several subscribers).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=4))]
        hosts: u8,
        /// netem spec applied to each guest's eth0 egress, e.g. "loss 5%".
        #[arg(long)]
        netem: Option<String>,
        /// Seconds before a guest that has not finished is killed.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
        /// vCPUs per guest (default 2 with one guest, 1 with several).
        #[arg(long)]
        cpus: Option<u8>,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Host tests for the whole workspace, then the RDMA tests in soft-RoCE guests.
    ///
    /// Ends with `softroce: N passed, M failed` and fails when N is 0 or M is not 0.
    Test {
        /// Skip the host tests (run only the RDMA tests).
        #[arg(long)]
        rdma_only: bool,
        /// Only RDMA tests whose name contains this string.
        #[arg(long)]
        filter: Option<String>,
        /// Skip the bounded fuzzing run (done by default after the host tests).
        #[arg(long)]
        no_fuzz: bool,
    },
    /// A rocebus harness against its perftest counterpart, alternating rounds in one guest.
    ///
    /// Benchmarks: rc-latency (vs ib_write_lat), rc-throughput (vs ib_write_bw), md-throughput
    /// (vs ib_send_bw -c UD), md-latency (vs ib_send_lat -c UD), gateway-rtt (next to
    /// ib_write_lat). Ends with e.g. `rc-latency: p50 ratio X.XX, p99 ratio Y.YY`.
    /// rc-latency and md-latency also run perftest, each round, at the bytes rocebus puts on
    /// the wire for one message (the 80-byte frame, the 90-byte datagram) and print the ratio
    /// against it too: what the bytes cost apart from what the code costs.
    ///
    /// Orders-path scale: rc-fanin (one active connection among N = 1, 16, 64, 256 idle ones;
    /// ends with `rc-fanin: N=256 p50 ratio X, p99 ratio Y` against N = 1) and
    /// rc-fanin-throughput (4 senders into one receiver vs ib_write_bw -q 4).
    ///
    /// Market data at scale, in 2 to 4 guests: md-repair (repair datagrams per lost datagram
    /// with 1, 2 and 3 subscribers, multicast repair and unicast only; first, on the host, the
    /// bytes of repair per byte of request two admitted peers get, against the stated
    /// bound) and md-fanout
    /// (publisher CPU per message, multicast and RC fan-out, 1, 2 and 4 subscribers).
    ///
    /// rc-instructions: user-space instructions per one-way message of the orders path against
    /// ib_write_lat, counted by callgrind in the guest (clients under callgrind, echoes native;
    /// runs of -n round trips, default 5000, and twice as many; set-up and waiting excluded).
    /// Ends with `rc-instructions: rocebus X, perftest Y per one-way message`. md-instructions:
    /// the same for the market-data path (md-latency's ping-pong, `rocebus-bench md-ping`)
    /// against ib_send_lat -c UD -g; ends with `md-instructions: rocebus X, perftest Y per
    /// one-way message`.
    ///
    /// On the host, no RDMA needed: gateway-journal (orders/s per journal fsync policy, tmpfs
    /// and disk) and gateway-restart (open + replay of a journal of -n orders, default 1M);
    /// books (feed-handler's decode + books against itch-book's over a generated day of -n
    /// messages, default 5M, 500 symbols; ends with `books: ratio X` and `books-memory: ratio
    /// Y`); ipc (the shared-memory transport against Aeron's aeron:ipc, Aeron C built from
    /// source; ends with `ipc-latency: p50 ratio X, p99 ratio Y` and `ipc-throughput: ratio Z`).
    Bench {
        /// Which benchmark.
        name: String,
        /// Alternating rounds (each: rocebus, then perftest); default 10 for latency, 5 for
        /// throughput (3 for the host-only gateway-journal and gateway-restart).
        #[arg(long)]
        rounds: Option<u32>,
        /// Message size in bytes.
        #[arg(long, short = 's', default_value_t = 64)]
        size: usize,
        /// Iterations per round (default per benchmark).
        #[arg(long, short = 'n')]
        iterations: Option<u64>,
        /// md-latency, md-throughput: add a third run to every round, rocebus with every
        /// datagram tagged (`auth.datagram_tag`) on both sides, right after the untagged
        /// one; prints `NAME --datagram-tag: ...` against perftest and against plain rocebus
        /// beside the usual line, so the tag's cost is measured in the same guest.
        #[arg(long)]
        datagram_tag: bool,
        /// rc-latency, rc-throughput, md-latency, md-throughput: add a third run to every
        /// round, rocebus with its registered memory on 2 MiB huge pages (`--hugepages on`,
        /// an error if there are too few), right after the plain run on 4 KiB pages; the
        /// guest reserves huge pages first (vm.nr_hugepages). Prints `NAME --hugepages on:
        /// ...` against perftest and against the 4 KiB run beside the usual line.
        #[arg(long, conflicts_with = "datagram_tag")]
        hugepages: bool,
        /// rc-latency: `c` adds a third run to every round, the same ping-pong through the
        /// C API (`bench/c/rc_latency.c`, built with the system's C compiler against
        /// `ffi/include/rocebus.h` and the release static library `librocebus_ffi.a`),
        /// right after the Rust harness. Prints `rc-latency --api c: ...` against perftest
        /// and against the Rust harness beside the usual line. rc-instructions: `c` counts
        /// the C harness's client (`rc_latency --ping`) against the Rust one (`rc-ping`),
        /// both under callgrind against the same echo; ends with `rc-instructions --api c:
        /// ratio X`.
        #[arg(long, value_enum, default_value_t = bench::Api::Rust, conflicts_with_all = ["datagram_tag", "hugepages"])]
        api: bench::Api,
        /// 2: run the harness's `--server` in one guest and its `--client` in a second
        /// linked guest, against perftest's server and client on the same two guests
        /// (rc-latency, rc-throughput, md-latency, md-throughput). Emulated: ratios only.
        #[arg(long, default_value_t = 1)]
        hosts: u8,
        /// rc-latency: instead of the comparison with perftest, the cost of a flood of
        /// connect requests (the `rc-flood` harness, in one guest): rounds of a healthy
        /// peer's handshake time (plain, and through the cookie a listener under load
        /// demands) and the ping-pong's p50/p99, each quiet and while
        /// `core/tests/attackers/cm_flood.py` (pyverbs) floods the listener with this many
        /// connect requests per second (0: as fast as it can); prints the ratios flood /
        /// quiet and the listener's time per refused request. --rounds default 3, -n is
        /// the ping-pong's round trips per phase (default 5000).
        #[arg(long, value_name = "RATE", conflicts_with_all = ["datagram_tag", "hugepages"])]
        flood: Option<u32>,
        /// End with one more line: a JSON object `{"bench": NAME, "lines": [...], "figures":
        /// {HEAD: {NAME: VALUE, ...}, ...}}` holding the closing lines and the figures read
        /// from them (`"rc-latency": {"p50 ratio": 1.02, "p99 ratio": 1.01}`); the host-only
        /// harnesses (gateway-journal, gateway-restart, admission-cost) end with
        /// `rocebus-bench --json`'s object instead.
        #[arg(long)]
        json: bool,
    },
    /// The main job: the whole pipeline on soft-RoCE, then the latency report.
    ///
    /// feed-handler replay → feed-handler → UD multicast (or shared memory, with
    /// `--market-data ipc`) → sample-engine → RC → order-gateway → venue → fills back,
    /// for a bounded time with a progress line per
    /// second; then the report (market-data latency, order round trip, counts), `.hgrm`
    /// files, PNG/SVG plots and the `rocebus stat` output taken mid-run, in --out.
    Demo {
        /// Seconds of trading.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Output folder (report, .hgrm, plots, logs).
        #[arg(long, default_value = "demo-out")]
        out: PathBuf,
        /// The venue behind the gateway.
        #[arg(long, value_enum, default_value_t = demo::Venue::Sim)]
        venue: demo::Venue,
        /// ITCH messages per second the exchange replays.
        #[arg(long, default_value_t = 2000)]
        rate: u64,
        /// Orders per second the engine sends (default: configs/demo/sample-engine.toml's).
        #[arg(long)]
        order_rate: Option<u64>,
        /// How market data reaches the engine: the RDMA multicast bus, or the feed handler's
        /// shared-memory streams (the engine runs on the feed handler's host).
        #[arg(long, value_enum, default_value_t = demo::MarketData::Rdma)]
        market_data: demo::MarketData,
    },
    /// Write the generated CLI and configuration reference (docs/reference/: every binary's
    /// --help from its clap definitions, every serde configuration struct's keys and doc
    /// comments); with --check, fail if the checked-in files differ (`test` runs the check).
    Reference {
        /// Compare instead of writing.
        #[arg(long)]
        check: bool,
    },
    /// Check that the verbs binding (rdma-sys) builds with every libclang installed here.
    ///
    /// Builds rdma-sys once per /usr/lib/llvm-N (library and headers) with LIBCLANG_PATH
    /// pointing at it and checks that all generate the same bindings (seconds once bindgen is
    /// built). With --trixie, instead builds the rocebus crate in a Debian trixie chroot
    /// (libclang 19, Debian's rustc 1.85) from crates vendored here, offline: as root, a few
    /// minutes the first time (the chroot is cached under ~/.cache/rocebus).
    ///
    /// With --embed, instead builds and runs a scratch engine crate in a temporary directory
    /// outside the repository that depends on rocebus by path, with no [patch], against
    /// libclang 19 (what `test` runs): embedding from another workspace works.
    CheckBuild {
        /// Build in a Debian trixie chroot instead of checking this host's libclangs.
        #[arg(long, conflicts_with = "embed")]
        trixie: bool,
        /// Build a scratch engine outside the workspace that depends on rocebus by path.
        #[arg(long)]
        embed: bool,
        /// With --embed: the rocebus crate to depend on (default: this checkout's core/).
        #[arg(long, requires = "embed")]
        rocebus: Option<PathBuf>,
        /// Debian mirror for debootstrap (default: debootstrap's own).
        #[arg(long, requires = "trixie")]
        mirror: Option<String>,
    },
    /// The deterministic simulator (order-gateway's `simulator` module), release build:
    /// the gateway against simulated engines, venue, network, disk damage and clock.
    ///
    /// Prints one replay line per failing seed, seeds/second and the faults injected per
    /// 1,000 seeds; fails if any seed broke an invariant.
    Sim {
        /// Replay this one seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Number of seeds to run from --base.
        #[arg(long, default_value_t = 10_000)]
        seeds: u64,
        /// First seed of a --seeds run.
        #[arg(long, default_value_t = 0)]
        base: u64,
        /// Only the faults today's journal format is known to handle (what CI runs).
        #[arg(long)]
        known_journal_limits: bool,
    },
    /// Run every cargo-fuzz target for a bounded time (installs cargo-fuzz if missing).
    Fuzz {
        /// Seconds of fuzzing per target.
        #[arg(long, default_value_t = fuzz::DEFAULT_SECONDS)]
        seconds: u64,
        /// Only this target (a name from `cargo fuzz list`).
        #[arg(long)]
        target: Option<String>,
    },
}

/// `cargo xtask vm`'s status when the command succeeded but the two-guest
/// link dropped packets by itself (sysexits' EX_TEMPFAIL: try again).
const EXIT_INCONCLUSIVE: i32 = 75;

/// The workspace root (xtask lives one level below it): from the
/// `CARGO_MANIFEST_DIR` that `cargo xtask` (`cargo run`) sets when it
/// starts us, else the one this binary was built from. The build-time
/// path alone is wrong whenever one target directory serves several
/// checkouts: cargo does not rebuild an up-to-date xtask for another
/// checkout, which then built and tested the first checkout's code.
pub fn workspace_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|d| d.join("Cargo.toml").is_file())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

fn main() -> std::process::ExitCode {
    rocebus_bin_support::main(|| run().map(|()| std::process::ExitCode::SUCCESS))
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.cmd {
        Cmd::Setup => {
            setup::setup()?;
        }
        Cmd::Vm {
            hosts,
            netem,
            timeout,
            cpus,
            cmd,
        } => {
            let img = setup::guest_image().context("guest image (run `cargo xtask setup`)")?;
            let line = cmd
                .iter()
                .map(|w| vm::shell_quote(w))
                .collect::<Vec<_>>()
                .join(" ");
            let opts = vm::VmOptions {
                hosts,
                netem,
                timeout: Duration::from_secs(timeout),
                cpus,
                ..Default::default()
            };
            let out = vm::run(&img, &root, &line, &opts)?;
            if let Some(why) = out.link.as_ref().and_then(vm::LinkDrops::inconclusive) {
                eprintln!("xtask vm: {why}");
                if out.status() == 0 {
                    std::process::exit(EXIT_INCONCLUSIVE);
                }
            }
            std::process::exit(out.status());
        }
        Cmd::Test {
            rdma_only,
            filter,
            no_fuzz,
        } => {
            test::run(&root, rdma_only, filter.as_deref(), !no_fuzz)?;
        }
        Cmd::Bench {
            name,
            rounds,
            size,
            iterations,
            datagram_tag,
            hugepages,
            api,
            hosts,
            flood,
            json,
        } => {
            if let Some(rate) = flood {
                if name != "rc-latency" || hosts != 1 || api != bench::Api::Rust {
                    anyhow::bail!(
                        "--flood applies to rc-latency in one guest (no --hosts 2, no --api c)"
                    );
                }
                bench::run_flood(&root, rate, rounds, size, iterations)?;
                if json {
                    println!("{}", verdict::json(&name));
                }
                return Ok(());
            }
            let variant = if datagram_tag {
                "--datagram-tag"
            } else if hugepages {
                bench::HUGEPAGES_VARIANT
            } else if api == bench::Api::C {
                bench::C_API_VARIANT
            } else {
                ""
            };
            let host_only = bench::HOST_ONLY.contains(&name.as_str());
            let opts = bench::BenchOptions {
                rounds,
                size,
                iterations,
                variant,
                hosts,
                harness_json: json && host_only,
            };
            bench::run(&root, &name, &opts)?;
            if json && !host_only {
                println!("{}", verdict::json(&name));
            }
        }
        Cmd::Demo {
            seconds,
            out,
            venue,
            rate,
            order_rate,
            market_data,
        } => {
            demo::run(
                &root,
                &demo::DemoOptions {
                    seconds,
                    out,
                    venue,
                    rate,
                    order_rate,
                    market_data,
                },
            )?;
        }
        Cmd::Reference { check } => reference::run(&root, check)?,
        Cmd::CheckBuild {
            trixie,
            embed,
            rocebus,
            mirror,
        } => {
            if embed {
                let core = rocebus.unwrap_or_else(|| root.join("core"));
                check_build::embed(&root, &core)?;
            } else if trixie {
                check_build::debian(&root, "trixie", mirror.as_deref())?;
            } else {
                check_build::host(&root, false)?;
            }
        }
        Cmd::Sim {
            seed,
            seeds,
            base,
            known_journal_limits,
        } => {
            let mut args = vec![
                "run".to_owned(),
                "--release".into(),
                "-q".into(),
                "-p".into(),
                "order-gateway".into(),
                "--bin".into(),
                "order-gateway-sim".into(),
                "--".into(),
            ];
            match seed {
                Some(s) => args.extend(["--seed".into(), s.to_string()]),
                None => args.extend([
                    "--seeds".into(),
                    seeds.to_string(),
                    "--base".into(),
                    base.to_string(),
                ]),
            }
            if known_journal_limits {
                args.push("--known-journal-limits".into());
            }
            let status =
                std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
                    .args(&args)
                    .current_dir(&root)
                    .status()
                    .context("run cargo for the simulator")?;
            if !status.success() {
                anyhow::bail!(
                    "the simulator found broken invariants: replay a seed with the line it printed"
                );
            }
        }
        Cmd::Fuzz { seconds, target } => {
            fuzz::run(&root, seconds, target.as_deref())?;
        }
    }
    Ok(())
}
