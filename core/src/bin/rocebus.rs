//! `rocebus`: operator tools. `rocebus stat` shows every component's counters live.
//!
//! Counters directory: `--dir`, else `$ROCEBUS_DIR`, else `/dev/shm/rocebus`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use rocebus::counters::hw::SYSFS_ROOT;
use rocebus::counters::stat::{discover, render_prometheus, render_table, Snapshot};
use rocebus::counters::{default_dir, DIR_ENV};

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
}

#[derive(Debug, clap::Args)]
struct StatArgs {
    /// Directory of `*.counters` files [default: $ROCEBUS_DIR, else /dev/shm/rocebus].
    #[arg(long, conflicts_with = "files")]
    dir: Option<PathBuf>,
    /// Counters files to show instead of a directory.
    files: Vec<PathBuf>,
    /// Refresh interval in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    interval: u64,
    /// Print once and exit (no screen clearing, no rates).
    #[arg(long)]
    once: bool,
    /// Print the Prometheus text exposition format once and exit.
    #[arg(long)]
    prometheus: bool,
    /// Root of the RDMA sysfs tree (for tests and containers).
    #[arg(long, default_value = SYSFS_ROOT, hide = true)]
    sysfs: PathBuf,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Stat(args) => stat(&args),
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
        return Ok(args.files.clone());
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

fn stat(args: &StatArgs) -> anyhow::Result<()> {
    let dir = args.dir.clone().unwrap_or_else(default_dir);
    let mut stdout = std::io::stdout().lock();
    if args.prometheus || args.once {
        let snap = Snapshot::take(&paths(args, &dir)?, &args.sysfs);
        let text = if args.prometheus {
            render_prometheus(&snap)
        } else {
            render_table(&snap, None, unix_now_ns(), &args.sysfs)
        };
        stdout
            .write_all(text.as_bytes())
            .context("cannot write to stdout")?;
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
