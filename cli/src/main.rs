//! `rocebus`: operator tools. `rocebus stat` shows every component's counters live, prints
//! them in the Prometheus text format, or serves them over HTTP for Prometheus to scrape.
//! `rocebus record` writes what a market-data channel delivers to a DBN file.
//!
//! Counters directory: `--dir`, else `$ROCEBUS_DIR`, else `/dev/shm/rocebus`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use http::{Limits, MetricsServer, METRICS_PATH};
use rocebus::counters::hw::SYSFS_ROOT;
use rocebus::counters::stat::{discover, render_prometheus, render_table, Snapshot};
use rocebus::counters::{default_dir, DIR_ENV};

mod doctor;
mod http;
mod record;

#[derive(Debug, Parser)]
#[command(name = "rocebus", version, about = "rocebus operator tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the counters of running (and exited) rocebus processes and of the RDMA device.
    Stat(StatArgs),
    /// Record what market-data channels deliver to a DBN file (Databento Binary Encoding).
    ///
    /// Waits for each channel's publisher, then subscribes to the channels of a market-data
    /// configuration (the feed handler's own
    /// config, whose `[market_data]` table is read, or a bare rocebus market-data file such as
    /// configs/md.toml) like any subscriber: gaps are recovered over RC, a late join starts
    /// from the publisher's snapshot. Every delivered normalized message becomes one DBN
    /// record (BBO and level changes as MBP-1, trades, status); snapshots are recorded as
    /// delivered (flag F_SNAPSHOT); exchange feed losses and the bus's own unrecoverable
    /// losses become ErrorMsg records a DBN reader sees. docs/feed-handler.md's "Record and replay"
    /// section has the conventions; `feed-handler replay FILE.dbn` publishes a recording again.
    ///
    /// Stops on SIGINT or SIGTERM (or after --duration), finishing the file (a `.zst` name
    /// is Zstandard-compressed) and printing the counts; progress goes to stderr.
    Record(record::RecordArgs),
    /// Print a random key for a secret or token (`[service.orders] token`, `[auth] secret`,
    /// `[[risk.engines]] token`): BITS bits from the OS generator, as hex.
    ///
    /// Secrets must be random keys: anyone who captured one handshake can test guesses
    /// offline, so the gateway refuses tokens with fewer than 128 bits of key material and
    /// the shipped sample values. Engine tokens hold at most 32 bytes: use `--bits 128`.
    Keygen(KeygenArgs),
    /// Check this host for the configs given: RDMA device and port, GID table, MTU,
    /// memlock, huge pages, isolated cores, CPU governor, NUMA, IRQ affinity, PFC and ECN.
    ///
    /// Prints PASS, WARN or FAIL per item with the fix (docs/deploy.md explains each);
    /// exits 1 if anything failed, 0 otherwise. Reads /sys and /proc and runs the read-only
    /// `mlnx_qos -i IF` or `dcb pfc show` when installed; changes nothing.
    Doctor(doctor::DoctorArgs),
}

#[derive(Debug, clap::Args)]
struct KeygenArgs {
    /// Bits of the key (128 to 256, a multiple of 8).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(128..=256))]
    bits: u16,
}

#[derive(Debug, clap::Args)]
struct StatArgs {
    /// Directory of `*.counters` files [default: $ROCEBUS_DIR, else /dev/shm/rocebus].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Components to show instead of the whole directory: a NAME (`order-gateway`,
    /// `feed-handler`: the file NAME.counters in the directory) or a PATH to a counters file
    /// (anything with a `/` or ending in `.counters`). With `--once` or `--prometheus`, a
    /// component that cannot be read makes the command exit 1 after printing the others.
    #[arg(value_name = "NAME|PATH")]
    files: Vec<PathBuf>,
    /// Refresh interval in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    interval: u64,
    /// Print once and exit (no screen clearing, no rates).
    #[arg(long)]
    once: bool,
    /// Print the Prometheus text exposition format once and exit.
    #[arg(long, conflicts_with_all = ["listen", "json"])]
    prometheus: bool,
    /// Print one JSON object once and exit: `components` (each file's `component`, `pid`,
    /// `running`, `start_unix_ns`, `path` and `counters` with `id`, `label`, `kind`,
    /// `value`), `errors` (files that could not be read, with `path` and `error`) and
    /// `rdma` (the device's counters). Exit codes as for `--once`.
    #[arg(long, conflicts_with = "listen")]
    json: bool,
    /// Serve the Prometheus text format on http://ADDR/metrics (read afresh at each
    /// scrape) until SIGINT or SIGTERM; port 0 picks a free port. The address served is
    /// printed on stdout.
    #[arg(long, value_name = "ADDR", conflicts_with = "once")]
    listen: Option<SocketAddr>,
    /// Root of the RDMA sysfs tree (for tests and containers).
    #[arg(long, default_value = SYSFS_ROOT, hide = true)]
    sysfs: PathBuf,
}

fn main() -> ExitCode {
    rocebus_bin_support::main(run)
}

fn run() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
        Command::Stat(args) => stat(&args).map(|()| ExitCode::SUCCESS),
        Command::Record(args) => {
            // Warnings, and the transport settings and GID it receives on (as every service
            // logs them); progress is its own lines.
            rocebus_bin_support::init_logging(record::LOG_FILTER)?;
            record::record(&args).map(|()| ExitCode::SUCCESS)
        }
        Command::Keygen(args) => {
            if args.bits % 8 != 0 {
                bail!("--bits {} is not a multiple of 8", args.bits);
            }
            println!("{}", rocebus::auth::generate_secret(usize::from(args.bits)));
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor(args) => doctor::doctor(&args),
    }
}

/// A component NAME (`order-gateway`) is its counters file in `dir`; a PATH (with a `/`, or
/// ending in `.counters`) is taken as it is.
fn component_path(dir: &Path, arg: &Path) -> PathBuf {
    let s = arg.as_os_str().to_string_lossy();
    if s.contains('/') || arg.extension().is_some_and(|x| x == "counters") {
        arg.to_path_buf()
    } else {
        dir.join(format!("{s}.counters"))
    }
}

fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The files to show, found again at each refresh so new processes appear.
fn paths(args: &StatArgs, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !args.files.is_empty() {
        return Ok(args.files.iter().map(|f| component_path(dir, f)).collect());
    }
    match discover(dir) {
        Ok(paths) => Ok(paths),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "counters directory {} does not exist: start a rocebus component, or point \
             --dir or ${DIR_ENV} at the directory it writes to",
            dir.display()
        ),
        Err(e) => {
            Err(e).with_context(|| format!("cannot list counters directory {}", dir.display()))
        }
    }
}

/// The Prometheus page of one scrape. A counters directory that does not exist (yet) is
/// no error here: no component has started, and the page says so in a comment.
fn scrape(args: &StatArgs, dir: &Path) -> Result<String, String> {
    let (paths, note) = if !args.files.is_empty() {
        (args.files.clone(), None)
    } else {
        match discover(dir) {
            Ok(paths) => (paths, None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
                Vec::new(),
                Some(format!(
                    "# counters directory {} does not exist yet\n",
                    dir.display()
                )),
            ),
            Err(e) => {
                return Err(format!(
                    "cannot list counters directory {}: {e}",
                    dir.display()
                ))
            }
        }
    };
    let page = render_prometheus(&Snapshot::take(&paths, &args.sysfs));
    Ok(note.unwrap_or_default() + &page)
}

/// `rocebus stat --listen`: serves until SIGINT or SIGTERM.
fn listen(args: &StatArgs, dir: &Path, addr: SocketAddr) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("cannot install the SIGINT/SIGTERM handlers")?;
    }
    let server = MetricsServer::bind(addr, Limits::default()).with_context(|| {
        format!("cannot listen on {addr}: is the port in use, or the address not this host's?")
    })?;
    let bound = server
        .local_addr()
        .context("cannot read the listening address")?;
    let source = if args.files.is_empty() {
        dir.display().to_string()
    } else {
        format!("{} files", args.files.len())
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "rocebus stat: serving http://{bound}{METRICS_PATH} (counters from {source}); stop with SIGINT or SIGTERM"
    )
    .and_then(|()| stdout.flush())
    .context("cannot write to stdout")?;
    drop(stdout);
    server
        .serve(&stop, &|| scrape(args, dir))
        .with_context(|| format!("serving metrics on {bound} failed"))
}

/// `rocebus stat --json`: the snapshot as one JSON object.
fn render_json(snap: &Snapshot) -> String {
    use serde_json::json;
    let components: Vec<_> = snap
        .files
        .iter()
        .map(|f| {
            let counters: Vec<_> = f
                .entries
                .iter()
                .map(|e| {
                    json!({
                        "id": e.id,
                        "label": e.label.as_str(),
                        "kind": match e.kind {
                            rocebus::counters::Kind::Gauge => "gauge",
                            _ => "counter",
                        },
                        "value": e.value,
                    })
                })
                .collect();
            json!({
                "component": f.info.component.as_str(),
                "pid": f.info.pid,
                "running": f.alive,
                "start_unix_ns": f.info.start_unix_ns,
                "path": f.path.display().to_string(),
                "counters": counters,
            })
        })
        .collect();
    let errors: Vec<_> = snap
        .errors
        .iter()
        .map(|(p, e)| json!({ "path": p.display().to_string(), "error": e }))
        .collect();
    let rdma: Vec<_> = snap
        .hw
        .iter()
        .map(|c| {
            json!({
                "device": c.device,
                "port": c.port,
                "group": c.group,
                "name": c.name,
                "value": c.value,
            })
        })
        .collect();
    json!({ "components": components, "errors": errors, "rdma": rdma }).to_string()
}

fn stat(args: &StatArgs) -> anyhow::Result<()> {
    let dir = args.dir.clone().unwrap_or_else(default_dir);
    if let Some(addr) = args.listen {
        return listen(args, &dir, addr);
    }
    let mut stdout = std::io::stdout().lock();
    if args.prometheus || args.once || args.json {
        let snap = Snapshot::take(&paths(args, &dir)?, &args.sysfs);
        let text = if args.json {
            render_json(&snap) + "\n"
        } else if args.prometheus {
            render_prometheus(&snap)
        } else {
            render_table(&snap, None, unix_now_ns(), &args.sysfs)
        };
        stdout
            .write_all(text.as_bytes())
            .context("cannot write to stdout")?;
        // Named components that cannot be read are a failure, not a quiet empty answer.
        if !args.files.is_empty() && !snap.errors.is_empty() {
            let what: Vec<String> = snap
                .errors
                .iter()
                .map(|(p, e)| format!("{}: {e}", p.display()))
                .collect();
            bail!("cannot read {}", what.join("; "));
        }
        return Ok(());
    }
    let interval = Duration::from_millis(args.interval);
    let mut prev: Option<Snapshot> = None;
    loop {
        let snap = Snapshot::take(&paths(args, &dir)?, &args.sysfs);
        let table = render_table(&snap, prev.as_ref(), unix_now_ns(), &args.sysfs);
        // Home the cursor and clear the screen, then draw: one write per refresh.
        let frame = format!(
            "\x1b[H\x1b[2Jrocebus stat  every {} ms  {}\n\n{table}",
            args.interval,
            if args.files.is_empty() {
                dir.display().to_string()
            } else {
                String::new()
            }
        );
        stdout
            .write_all(frame.as_bytes())
            .context("cannot write to stdout")?;
        stdout.flush().context("cannot write to stdout")?;
        prev = Some(snap);
        std::thread::sleep(interval);
    }
}
