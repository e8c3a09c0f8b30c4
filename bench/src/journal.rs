//! `gateway-journal` and `gateway-restart`: what the gateway's journal costs, on the host
//! (no RDMA: the engine side is this thread, the venue the in-process
//! `order_gateway::sim::SimVenue`).
//!
//! `gateway-journal` drives `FixDriver` as the service does, one *service turn* at a time:
//! stage a batch of numbered NewOrders (`stage_engine_message`, request sequence numbers
//! 1, 2, … as the engine client sends them), then one `poll_with`, which reads the venue's
//! answers to the previous turn's orders (ack and fill), then writes the turn's journal
//! records in one append (and, under group commit, one `fdatasync`) before the FIX messages
//! go out. Every order is acknowledged and filled: about five records per order (request,
//! risk decision, FIX out, two FIX in). It reports orders per second and the time of the
//! flush (`poll_with`) per turn, for each fsync policy on a tmpfs and on a disk-backed
//! directory, batch sizes 1 (one order per turn: every order pays a sync) and 16, in
//! alternating rounds, with the ratio to `never`.
//!
//! `gateway-restart` writes a journal of N orders (policy `never`, batches of 16; journal
//! segments of `--segment-bytes`, 64 MiB as the gateway's default, 0 for one file) and
//! times `FixDriver::with_link` (open and replay of the last segment) on it in child
//! processes, so each replay starts
//! with a fresh heap and its peak RSS (`VmHWM`) is its own; every other replay first drops
//! the file from the page cache (`posix_fadvise(DONTNEED)`), as after a reboot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use hdrhistogram::Histogram;
use order_gateway::driver::FixDriver;
use order_gateway::fix::{SessionConfig, SessionState};
use order_gateway::journal::FsyncPolicy;
use order_gateway::proto::{NewOrder, Request, Response, Side, Symbol, TimeInForce, PRICE_SCALE};
use order_gateway::sim::SimVenue;
use order_gateway::unix_nanos;

use crate::gateway::{risk, ACCOUNT, ENGINE};
use rocebus_bench::fanout::thread_cpu_ns;

/// Options of `gateway-journal`.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayJournalArgs {
    /// Alternating rounds (each runs every configuration once).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Measured seconds per run (after a quarter-second warm-up).
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Engine requests staged per service turn.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub batch: Vec<usize>,
    /// A directory on tmpfs.
    #[arg(long, default_value = "/dev/shm")]
    pub tmpfs_dir: PathBuf,
    /// A directory on a disk-backed file system (default: the temp dir).
    #[arg(long)]
    pub disk_dir: Option<PathBuf>,
    /// `every_n = N` is measured with this N.
    #[arg(long, default_value_t = 64)]
    pub every_n: u32,
}

/// Options of `gateway-restart`.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayRestartArgs {
    /// Orders in the journal (each acknowledged and filled).
    #[arg(long, short = 'n', default_value_t = 1_000_000)]
    pub orders: u64,
    /// Rounds; each times one replay with the file in the page cache and one without.
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
    /// Directory of the journal (default: the temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the journal afterwards (it is deleted by default).
    #[arg(long)]
    pub keep: bool,
    /// `journal.segment_bytes` of the writing gateway (0: one file, replayed whole, as
    /// before segments existed). The replay reads the last segment: a checkpoint and
    /// whatever was appended after it.
    #[arg(long, default_value_t = 64 << 20)]
    pub segment_bytes: u64,
    /// Sync policy of the writing gateway: `never` (fast to write) or `group` (the
    /// gateway's default; shows what a rotation costs when the old segment is already
    /// durable).
    #[arg(long, default_value = "never")]
    pub fsync: String,
}

/// Options of `gateway-replay` (the child process of `gateway-restart`).
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayReplayArgs {
    /// The journal.
    #[arg(long)]
    pub journal: PathBuf,
    /// Drop the file from the page cache first.
    #[arg(long)]
    pub cold: bool,
}

const PRICE: i64 = 100 * PRICE_SCALE;

fn symbol() -> Symbol {
    Symbol::new("AAPL").expect("valid symbol")
}

fn session() -> SessionConfig {
    SessionConfig {
        sender_comp_id: "GW".into(),
        target_comp_id: "VENUE".into(),
        heartbeat_secs: 30,
        resend_timeout_ms: 0,
        ..Default::default()
    }
}

/// A driver on a fresh journal, logged on to the simulator, and the engine's side.
struct Rig {
    driver: FixDriver<SimVenue>,
    next: u64,
    sent: u64,
    filled: u64,
    rejected: u64,
}

impl Rig {
    fn open(path: &Path, policy: FsyncPolicy) -> Result<Rig> {
        let _ = std::fs::remove_file(path);
        let mut driver = FixDriver::with_link(SimVenue::new(), session(), &risk()?, path, policy)
            .with_context(|| format!("open journal {}", path.display()))?;
        driver.stage(|gw, _| gw.on_reference_price(symbol(), PRICE, unix_nanos()));
        driver.connect()?;
        driver.poll_with(rocebus::clock::Now::read(), |_, _| {})?;
        ensure!(
            driver.gateway().session().state() == SessionState::Active,
            "the gateway did not log on to the venue simulator"
        );
        Ok(Rig {
            driver,
            next: 1,
            sent: 0,
            filled: 0,
            rejected: 0,
        })
    }

    /// One service turn: `batch` new orders staged, then one `poll_with` (the venue's
    /// answers to the previous turn, the journal append and sync, FIX out, responses).
    /// Returns the time of the `poll_with`.
    fn turn(&mut self, batch: usize) -> Result<Duration> {
        let now = rocebus::clock::Now::read();
        for _ in 0..batch {
            let id = self.next;
            self.next += 1;
            let side = if id % 2 == 0 { Side::Buy } else { Side::Sell };
            let mut req = Request::NewOrder(NewOrder::new(
                id,
                ACCOUNT,
                symbol(),
                side,
                1,
                PRICE,
                TimeInForce::Day,
            ));
            // Numbered as the engine client numbers its requests: 1, 2, …
            req.set_seq(id as u32);
            self.driver
                .stage_engine_message(ENGINE, req.as_bytes(), now.wall);
        }
        self.sent += batch as u64;
        let (filled, rejected) = (&mut self.filled, &mut self.rejected);
        let t = Instant::now();
        self.driver.poll_with(now, |_, r| match r {
            Response::Fill(_) => *filled += 1,
            Response::Reject(_) => *rejected += 1,
            _ => {}
        })?;
        Ok(t.elapsed())
    }

    /// Turns without new orders until every order sent is filled.
    fn drain(&mut self) -> Result<()> {
        for _ in 0..100 {
            if self.filled + self.rejected >= self.sent {
                break;
            }
            self.turn(0)?;
        }
        ensure!(self.rejected == 0, "{} orders rejected", self.rejected);
        ensure!(
            self.filled == self.sent,
            "{} of {} orders filled",
            self.filled,
            self.sent
        );
        Ok(())
    }
}

/// The file system holding `dir`, from `/proc/self/mounts`: `(type, source)`.
fn filesystem(dir: &Path) -> (String, String) {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (src, at, ty) = (w.next()?, w.next()?, w.next()?);
            dir.starts_with(at).then_some((at.len(), ty, src))
        })
        .max_by_key(|(len, _, _)| *len)
        .map_or(("unknown".into(), "?".into()), |(_, ty, src)| {
            (ty.to_owned(), src.to_owned())
        })
}

/// A directory of our own under `dir`, with its file system printed.
fn work_dir(dir: &Path, role: &str, want_tmpfs: bool) -> Result<(PathBuf, String)> {
    let d = dir.join(format!("rocebus-gateway-journal-{}", std::process::id()));
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    let (ty, src) = filesystem(&d);
    println!("{role} directory {}: {ty} ({src})", dir.display());
    if (ty == "tmpfs") != want_tmpfs {
        eprintln!(
            "warning: the {role} directory is {ty}, {}",
            if want_tmpfs {
                "not tmpfs"
            } else {
                "not disk-backed (pass another directory)"
            }
        );
    }
    Ok((d, ty))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn policy_name(p: FsyncPolicy) -> String {
    match p {
        FsyncPolicy::Never => "never".into(),
        FsyncPolicy::Group => "group".into(),
        FsyncPolicy::EveryN(n) => format!("every_n={n}"),
    }
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Run {
    orders_per_sec: f64,
    flush_p50_us: f64,
    flush_p99_us: f64,
    /// Share of the wall time this thread ran, and waited runnable for a CPU (a loaded
    /// machine shows here, not only in the rates).
    on_cpu: f64,
    runnable: f64,
    /// This thread's CPU time per order: the cost of the work itself, whatever the load.
    cpu_us_per_order: f64,
}

/// This thread's time on a CPU and waiting runnable for one, in ns
/// (`/proc/thread-self/schedstat`; zeros where unavailable).
fn schedstat() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut w = s.split_whitespace().map(|x| x.parse().unwrap_or(0));
    (w.next().unwrap_or(0), w.next().unwrap_or(0))
}

fn run_once(path: &Path, policy: FsyncPolicy, batch: usize, seconds: f64) -> Result<Run> {
    let mut rig = Rig::open(path, policy)?;
    let warm = Instant::now() + Duration::from_millis(250);
    while Instant::now() < warm {
        rig.turn(batch)?;
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let filled0 = rig.filled;
    let s0 = schedstat();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        let d = rig.turn(batch)?;
        hist.record(d.as_nanos().max(1) as u64)?;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let s1 = schedstat();
    let orders = rig.filled - filled0;
    rig.drain()?;
    drop(rig);
    let _ = std::fs::remove_file(path);
    Ok(Run {
        orders_per_sec: orders as f64 / elapsed,
        flush_p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
        flush_p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        on_cpu: (s1.0 - s0.0) as f64 / 1e9 / elapsed,
        runnable: (s1.1 - s0.1) as f64 / 1e9 / elapsed,
        cpu_us_per_order: (s1.0 - s0.0) as f64 / 1e3 / orders.max(1) as f64,
    })
}

/// `gateway-journal`: orders/s per fsync policy, file system and batch size.
pub fn run(a: &GatewayJournalArgs) -> Result<()> {
    ensure!(a.rounds > 0 && !a.batch.is_empty(), "nothing to run");
    let disk = a.disk_dir.clone().unwrap_or_else(std::env::temp_dir);
    let (tmp_dir, tmp_ty) = work_dir(&a.tmpfs_dir, "tmpfs", true)?;
    let (disk_dir, disk_ty) = work_dir(&disk, "disk", false)?;
    let places = [
        ("tmpfs", tmp_dir.clone(), tmp_ty),
        ("disk", disk_dir.clone(), disk_ty),
    ];
    let policies = [
        FsyncPolicy::Never,
        FsyncPolicy::Group,
        FsyncPolicy::EveryN(a.every_n),
    ];
    let total = a.rounds as usize * a.batch.len() * places.len() * policies.len();
    // results[batch][place][policy] = one Run per round
    let mut results =
        vec![vec![vec![Vec::<Run>::new(); policies.len()]; places.len()]; a.batch.len()];
    let mut done = 0;
    let started = Instant::now();
    let outcome = (|| -> Result<()> {
        for round in 0..a.rounds {
            for (bi, &batch) in a.batch.iter().enumerate() {
                for (pi, (place, dir, _)) in places.iter().enumerate() {
                    // Alternate the order of the policies between rounds.
                    let order: Vec<usize> = if round % 2 == 0 {
                        (0..policies.len()).collect()
                    } else {
                        (0..policies.len()).rev().collect()
                    };
                    for k in order {
                        let policy = policies[k];
                        let path = dir.join("gateway.journal");
                        let r = run_once(&path, policy, batch, a.seconds)?;
                        done += 1;
                        println!(
                            "[{done:>2}/{total}] round {} batch {batch:>2} {place:<5} {:<11} {:>9.0} orders/s  flush p50 {:>8.1} us p99 {:>8.1} us  on CPU {:>3.0}% runnable {:>3.0}% {:>5.1} us CPU/order  ({:.0} s)",
                            round + 1,
                            policy_name(policy),
                            r.orders_per_sec,
                            r.flush_p50_us,
                            r.flush_p99_us,
                            r.on_cpu * 100.0,
                            r.runnable * 100.0,
                            r.cpu_us_per_order,
                            started.elapsed().as_secs_f64()
                        );
                        results[bi][pi][k].push(r);
                    }
                }
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp_dir);
    let _ = std::fs::remove_dir_all(&disk_dir);
    outcome?;

    println!();
    println!(
        "gateway-journal: orders/s, median of {} alternating rounds of {} s (ratio: median of the per-round ratios to never)",
        a.rounds, a.seconds
    );
    println!(
        "{:>5}  {:<16} {:>10} {:>10} {:>12} {:>12} {:>14}",
        "batch",
        "file system",
        "never",
        "group",
        policy_name(policies[2]),
        "group/never",
        format!("{}/never", policy_name(policies[2]))
    );
    for (bi, &batch) in a.batch.iter().enumerate() {
        for (pi, (place, _, ty)) in places.iter().enumerate() {
            let r = &results[bi][pi];
            let rate = |k: usize| median(r[k].iter().map(|x| x.orders_per_sec).collect());
            let ratio = |k: usize| {
                median(
                    r[k].iter()
                        .zip(&r[0])
                        .map(|(x, n)| x.orders_per_sec / n.orders_per_sec)
                        .collect(),
                )
            };
            for (k, policy) in policies.iter().enumerate().take(3) {
                let key = format!("batch{batch}_{place}_{}", policy_name(*policy));
                rocebus_bench::report::figure(&format!("{key}_orders_per_sec"), rate(k).round());
                if k > 0 {
                    rocebus_bench::report::figure(
                        &format!("{key}_ratio_to_never"),
                        format!("{:.3}", ratio(k)),
                    );
                }
            }
            println!(
                "{batch:>5}  {:<16} {:>10.0} {:>10.0} {:>12.0} {:>12.3} {:>14.3}",
                format!("{place} ({ty})"),
                rate(0),
                rate(1),
                rate(2),
                ratio(1),
                ratio(2)
            );
        }
    }
    println!();
    println!("CPU time per order, us (this thread's time on a CPU / orders; median over rounds)");
    println!(
        "{:>5}  {:<16} {:>10} {:>10} {:>12}",
        "batch",
        "file system",
        "never",
        "group",
        policy_name(policies[2])
    );
    for (bi, &batch) in a.batch.iter().enumerate() {
        for (pi, (place, _, ty)) in places.iter().enumerate() {
            let r = &results[bi][pi];
            let cpu = |k: usize| median(r[k].iter().map(|x| x.cpu_us_per_order).collect());
            println!(
                "{batch:>5}  {:<16} {:>10.2} {:>10.2} {:>12.2}",
                format!("{place} ({ty})"),
                cpu(0),
                cpu(1),
                cpu(2)
            );
        }
    }
    println!();
    println!("flush (poll_with) time per turn, us: median over rounds of each run's p50 / p99");
    println!(
        "{:>5}  {:<16} {:>18} {:>18} {:>18}",
        "batch",
        "file system",
        "never",
        "group",
        policy_name(policies[2])
    );
    for (bi, &batch) in a.batch.iter().enumerate() {
        for (pi, (place, _, ty)) in places.iter().enumerate() {
            let r = &results[bi][pi];
            let cell = |k: usize| {
                format!(
                    "{:.1} / {:.1}",
                    median(r[k].iter().map(|x| x.flush_p50_us).collect()),
                    median(r[k].iter().map(|x| x.flush_p99_us).collect())
                )
            };
            println!(
                "{batch:>5}  {:<16} {:>18} {:>18} {:>18}",
                format!("{place} ({ty})"),
                cell(0),
                cell(1),
                cell(2)
            );
        }
    }
    Ok(())
}

/// `gateway-restart`: writes a journal of `orders` orders, then times replays of it.
pub fn restart(a: &GatewayRestartArgs) -> Result<()> {
    ensure!(a.orders > 0 && a.rounds > 0, "nothing to run");
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let (work, ty) = work_dir(&dir, "journal", false)?;
    let path = work.join("gateway.journal");
    let outcome = restart_in(a, &path, &ty);
    if a.keep {
        println!("journal kept: {}", path.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    outcome
}

fn restart_in(a: &GatewayRestartArgs, path: &Path, ty: &str) -> Result<()> {
    const BATCH: usize = 16;
    let t = Instant::now();
    let policy = match a.fsync.as_str() {
        "never" => FsyncPolicy::Never,
        "group" => FsyncPolicy::Group,
        other => bail!("--fsync {other}: expected never or group"),
    };
    let mut rig = Rig::open(path, policy)?;
    rig.driver.set_segment_bytes(a.segment_bytes);
    let mut next_report = 100_000;
    let mut longest_rotation = 0u64;
    let mut longest_rotation_cpu = 0u64;
    // The two service-thread holds of a rotation (cut, switch: wall, CPU) and the writer's
    // time off the service thread.
    let (mut cut, mut switch, mut build) = ((0u64, 0u64), (0u64, 0u64), 0u64);
    // The time from a switch until it was durable (its syncs, seal, link and rename, on a
    // thread of their own).
    let mut finish = 0u64;
    // Bytes of records after a cut: the most the writer copied (off the service thread),
    // the most a switch copied (on it).
    let (mut caught_up, mut switch_copied) = (0u64, 0u64);
    let mut rotations = 0;
    // The longest service turn (`poll_with`) while a checkpoint was in flight.
    let mut worst_turn = Duration::ZERO;
    // The longest turn of all, and the most final orders waiting for a sweep (what cuts
    // left out is freed a bounded number per turn).
    let mut worst_any = Duration::ZERO;
    // The most CPU time a turn took (the wall time above includes being preempted).
    let mut worst_cpu = 0u64;
    let mut unswept = 0usize;
    // Turns over 1 ms of CPU: (orders sent by then, CPU ns).
    let mut slow: Vec<(u64, u64)> = Vec::new();
    while rig.sent < a.orders {
        let in_flight = rig.driver.checkpoint_in_flight();
        // The whole turn: the engine requests staged (decided, journaled in memory) and the
        // flush (`poll_with`).
        let (t0, cpu0) = (Instant::now(), thread_cpu_ns());
        rig.turn(BATCH.min((a.orders - rig.sent) as usize))?;
        let took = t0.elapsed();
        let cpu = thread_cpu_ns() - cpu0;
        worst_cpu = worst_cpu.max(cpu);
        if cpu > 1_000_000 {
            slow.push((rig.sent, cpu));
        }
        let seg = rig.driver.segment_stats();
        if in_flight || rig.driver.checkpoint_in_flight() || seg.rotations > rotations {
            worst_turn = worst_turn.max(took);
        }
        worst_any = worst_any.max(took);
        unswept = unswept.max(rig.driver.gateway().unswept());
        finish = finish.max(seg.last_finish_ns);
        if seg.rotations > rotations {
            rotations = seg.rotations;
            longest_rotation = longest_rotation.max(seg.last_rotation_ns);
            longest_rotation_cpu = longest_rotation_cpu.max(seg.last_rotation_cpu_ns);
            cut = cut.max((seg.last_cut_ns, seg.last_cut_cpu_ns));
            switch = switch.max((seg.last_switch_ns, seg.last_switch_cpu_ns));
            build = build.max(seg.last_build_ns);
            caught_up = caught_up.max(seg.last_caught_up_bytes);
            switch_copied = switch_copied.max(seg.last_switch_copied_bytes);
        }
        if rig.sent >= next_report {
            eprintln!(
                "  writing: {} of {} orders ({:.0} s)",
                rig.sent,
                a.orders,
                t.elapsed().as_secs_f64()
            );
            next_report += 100_000;
        }
    }
    rig.drain()?;
    rig.driver.sync()?;
    let wrote = t.elapsed().as_secs_f64();
    let seg = rig.driver.segment_stats();
    drop(rig);
    let size = std::fs::metadata(path)?.len();
    println!(
        "wrote {} orders (each acked and filled) in {wrote:.1} s: last segment {:.1} MiB on {ty}",
        a.orders,
        size as f64 / (1 << 20) as f64
    );
    let segments = if a.segment_bytes > 0 {
        ensure!(seg.failures == 0, "{} checkpoints failed", seg.failures);
        println!(
            "  {} segments of {:.0} MiB started (fsync {}); last checkpoint {:.1} KiB; longest rotation held the service {:.1} ms ({:.1} ms of it on CPU)",
            seg.rotations,
            a.segment_bytes as f64 / (1 << 20) as f64,
            a.fsync,
            seg.last_checkpoint_bytes as f64 / 1024.0,
            longest_rotation as f64 / 1e6,
            longest_rotation_cpu as f64 / 1e6
        );
        println!(
            "  the service thread's part: longest cut {:.2} ms ({:.2} ms CPU), longest switch {:.2} ms ({:.2} ms CPU); off the service thread: the checkpoint writer longest {:.1} ms, a switch's syncs, seal and rename longest {:.1} ms",
            cut.0 as f64 / 1e6,
            cut.1 as f64 / 1e6,
            switch.0 as f64 / 1e6,
            switch.1 as f64 / 1e6,
            build as f64 / 1e6,
            finish as f64 / 1e6
        );
        println!(
            "  records after a cut: the writer copied up to {:.1} MiB, a switch up to {:.1} KiB",
            caught_up as f64 / (1 << 20) as f64,
            switch_copied as f64 / 1024.0
        );
        println!(
            "  longest service turn while a checkpoint was in flight: {:.2} ms (goal: 1 ms); longest of all turns {:.2} ms, most CPU in a turn {:.2} ms; at most {unswept} final orders not swept yet (those of the last two cuts are not dead yet)",
            worst_turn.as_secs_f64() * 1e3,
            worst_any.as_secs_f64() * 1e3,
            worst_cpu as f64 / 1e6
        );
        let listed: Vec<String> = slow
            .iter()
            .map(|(sent, cpu)| format!("{:.1} ms at order {sent}", *cpu as f64 / 1e6))
            .collect();
        println!(
            "  turns over 1 ms of CPU: {}{}",
            slow.len(),
            if listed.is_empty() {
                String::new()
            } else {
                format!(" ({})", listed.join(", "))
            }
        );
        format!(
            "segments of {:.0} MiB ({} started, longest rotation {:.1} ms, {:.1} ms on CPU)",
            a.segment_bytes as f64 / (1 << 20) as f64,
            seg.rotations,
            longest_rotation as f64 / 1e6,
            longest_rotation_cpu as f64 / 1e6
        )
    } else {
        "one segment".to_owned()
    };
    let exe = std::env::current_exe()?;
    let mut warm = Vec::new();
    let mut cold = Vec::new();
    let mut cpu = Vec::new();
    let mut records = 0;
    let mut orders = 0;
    let mut last_id = 0;
    let mut hwm = Vec::new();
    for round in 1..=a.rounds {
        for is_cold in [false, true] {
            let mut c = Command::new(&exe);
            c.arg("gateway-replay").arg("--journal").arg(path);
            if is_cold {
                c.arg("--cold");
            }
            let out = c.output().context("run gateway-replay")?;
            let text = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                bail!(
                    "gateway-replay failed: {}{}",
                    text,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let line = text
                .lines()
                .find(|l| l.starts_with("REPLAY "))
                .context("gateway-replay printed no REPLAY line")?;
            let field = |k: &str| -> Result<f64> {
                line.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                    .with_context(|| format!("no {k} in {line:?}"))?
                    .parse()
                    .with_context(|| format!("bad {k} in {line:?}"))
            };
            let secs = field("seconds")?;
            records = field("records")? as u64;
            orders = field("orders")? as u64;
            last_id = field("last_id")? as u64;
            let kb = field("vm_hwm_kb")?;
            hwm.push(kb);
            println!(
                "  round {round} {:<4}: {secs:.2} s ({:.2} s on CPU, {:.2} s runnable), {records} records, {:.0} records/s, peak RSS {:.0} MiB",
                if is_cold { "cold" } else { "warm" },
                field("cpu_seconds")?,
                field("runnable_seconds")?,
                records as f64 / secs,
                kb / 1024.0
            );
            if is_cold { &mut cold } else { &mut warm }.push(secs);
            cpu.push(field("cpu_seconds")?);
        }
    }
    ensure!(
        last_id == a.orders,
        "the replay knows engine order ids up to {last_id}, not {}",
        a.orders
    );
    ensure!(
        a.segment_bytes > 0 || orders == a.orders,
        "the replay found {orders} orders, not {}",
        a.orders
    );
    let (w, c) = (median(warm), median(cold));
    {
        use rocebus_bench::report::figure;
        figure("orders", a.orders);
        figure("records", records);
        figure("replay_warm_seconds", format!("{w:.3}"));
        figure("replay_cold_seconds", format!("{c:.3}"));
        figure("replay_cpu_seconds", format!("{:.3}", median(cpu.clone())));
        figure(
            "peak_rss_mib",
            format!("{:.0}", median(hwm.clone()) / 1024.0),
        );
    }
    println!();
    println!(
        "gateway-restart: {} orders, {segments}: {records} records, {:.1} MiB on {ty}; open + replay (median of {} rounds): {w:.2} s in the page cache ({:.0} records/s), {c:.2} s dropped from it ({:.0} records/s); {:.2} s on CPU; peak RSS {:.0} MiB",
        a.orders,
        size_mib(path),
        a.rounds,
        records as f64 / w,
        records as f64 / c,
        median(cpu),
        median(hwm) / 1024.0
    );
    Ok(())
}

fn size_mib(path: &Path) -> f64 {
    std::fs::metadata(path).map_or(f64::NAN, |m| m.len() as f64 / (1 << 20) as f64)
}

/// Peak resident set of this process, in KiB (`VmHWM`).
fn vm_hwm_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// `gateway-replay`: one timed open + replay; prints a `REPLAY` line.
pub fn replay(a: &GatewayReplayArgs) -> Result<()> {
    if a.cold {
        let f = std::fs::File::open(&a.journal)?;
        f.sync_all()?;
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
    }
    let risk = risk()?;
    let s0 = schedstat();
    let t = Instant::now();
    let driver = FixDriver::with_link(
        SimVenue::new(),
        session(),
        &risk,
        &a.journal,
        FsyncPolicy::Never,
    )?;
    let secs = t.elapsed().as_secs_f64();
    let s1 = schedstat();
    let orders = driver.gateway().orders().count();
    // Engine order ids 1, 2, … the journal holds (orders themselves are dropped from
    // checkpoints once final).
    let risk = driver.gateway().risk();
    let last_id = (1..)
        .take_while(|&i| risk.is_seen(ENGINE, i))
        .last()
        .unwrap_or(0);
    rocebus_bench::report::figure("seconds", format!("{secs:.6}"));
    rocebus_bench::report::figure("records", driver.recovery().records);
    println!(
        "REPLAY seconds={secs:.6} cpu_seconds={:.6} runnable_seconds={:.6} records={} orders={orders} last_id={last_id} vm_hwm_kb={}",
        (s1.0 - s0.0) as f64 / 1e9,
        (s1.1 - s0.1) as f64 / 1e9,
        driver.recovery().records,
        vm_hwm_kb()
    );
    Ok(())
}
