//! `cargo xtask bench NAME`: a rocebus harness and its perftest counterpart
//! in alternating rounds in one soft-RoCE guest (or natively on a host with
//! an RDMA device), then both sets of figures and the median ratios.
//!
//! Under emulation absolute times mean little and drift between runs, so
//! only ratios measured in the same guest, interleaved, are reported.
//!
//! A few harnesses need no RDMA device and have no perftest counterpart
//! ([`HOST_ONLY`]): they run natively on the host, whatever it has.

use crate::{setup, vm};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// What one benchmark compares.
#[derive(Debug, Clone, Copy)]
struct Spec {
    name: &'static str,
    kind: Kind,
    /// rocebus-bench subcommand (takes -n ITERATIONS, and -s SIZE when `sized`).
    ours: &'static str,
    /// Whether the harness takes a message size (the gateway's orders have a fixed layout).
    sized: bool,
    /// Extra arguments for ours.
    ours_extra: &'static str,
    /// perftest tool and its extra arguments.
    perftest: &'static str,
    perftest_extra: &'static str,
    /// Extra arguments of perftest's server and client alone (e.g. the
    /// multicast group each side listens on).
    perftest_server: &'static str,
    perftest_client: &'static str,
    /// Multicast groups held joined at the IP level while perftest runs
    /// (`rocebus-bench with-groups`); empty for none.
    ip_groups: &'static str,
    /// A second perftest run per round with these arguments instead of the
    /// extra, server and client ones, reported for reference beside the
    /// main ratio.
    reference: Option<&'static str>,
    /// The bytes rocebus puts on the wire for one message of a given size
    /// (a ring frame, a datagram): if set, each round runs perftest again,
    /// same arguments, at that size, and rocebus is compared with it too,
    /// which separates what the extra bytes cost from what the code costs.
    wire_size: Option<fn(usize) -> usize>,
    default_iterations: u64,
}

/// Defaults; each benchmark overrides what differs.
const BASE: Spec = Spec {
    name: "",
    kind: Kind::Latency,
    ours: "",
    sized: true,
    ours_extra: "",
    perftest: "",
    perftest_extra: "",
    perftest_server: "",
    perftest_client: "",
    ip_groups: "",
    reference: None,
    wire_size: None,
    default_iterations: 5000,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Latency,
    Throughput,
}

const SPECS: &[Spec] = &[
    Spec {
        name: "rc-latency",
        ours: "rc-latency",
        ours_extra: "--cores 0,1",
        perftest: "ib_write_lat",
        // The WRITE rocebus posts carries a frame, not the bare message.
        wire_size: Some(ring_frame_len),
        ..BASE
    },
    Spec {
        name: "rc-throughput",
        kind: Kind::Throughput,
        ours: "rc-throughput",
        perftest: "ib_write_bw",
        default_iterations: 200_000,
        ..BASE
    },
    // Four senders (threads, one connection each) into one receiver
    // polling them through the fan-in summary, against four queue pairs of
    // ib_write_bw.
    Spec {
        name: "rc-fanin-throughput",
        kind: Kind::Throughput,
        ours: "rc-fanin-throughput",
        perftest: "ib_write_bw",
        perftest_extra: "-q 4",
        default_iterations: 200_000,
        ..BASE
    },
    Spec {
        name: "md-throughput",
        kind: Kind::Throughput,
        ours: "md-throughput",
        perftest: "ib_send_bw",
        perftest_extra: "-c UD",
        default_iterations: 200_000,
        ..BASE
    },
    // Like rocebus, perftest ping-pongs over two multicast groups: the
    // server listens on 239.9.4.1 and answers to the client's 239.9.4.2
    // (perftest's -M takes the MGID as 16 decimal bytes; these are the
    // IPv4-mapped groups). Unicast UD, which soft-RoCE hands to the receiver
    // through a direct loopback instead of the kernel's multicast path, is
    // run beside it for reference.
    Spec {
        name: "md-latency",
        ours: "md-latency",
        perftest: "ib_send_lat",
        perftest_extra: "-c UD -g",
        perftest_server: "-M 0:0:0:0:0:0:0:0:0:0:255:255:239:9:4:1",
        perftest_client: "-M 0:0:0:0:0:0:0:0:0:0:255:255:239:9:4:2",
        ip_groups: "239.9.4.1,239.9.4.2",
        reference: Some("-c UD"),
        // The datagram carries a header and a length prefix too.
        wire_size: Some(md_datagram_len),
        ..BASE
    },
    Spec {
        name: "gateway-rtt",
        ours: "gateway-rtt",
        sized: false,
        perftest: "ib_write_lat",
        ..BASE
    },
];

/// Bytes of the orders ring's frame of a `size`-byte message: 8 of header,
/// the message, 8 of seal, rounded up to 16 (`rocebus::ring::frame::
/// frame_len`, which xtask does not link; the ring's tests pin the same
/// figures as the test here).
fn ring_frame_len(size: usize) -> usize {
    (8 + size + 8 + 15) & !15
}

/// Bytes of the market-data datagram carrying one `size`-byte message
/// without a tag: the 24-byte header and the 2-byte length prefix
/// (`rocebus::mcast::wire::{DATAGRAM_HEADER_LEN, MSG_PREFIX_LEN}`).
fn md_datagram_len(size: usize) -> usize {
    24 + 2 + size
}

/// Rounds when none are asked for. Under emulation a process runs a whole
/// run in one of two speeds (a p50 of about 10 us or 13-17 us for the
/// same `ib_write_lat`, on either side), so a latency round's ratio is
/// often 0.7 or 1.4: the median of 10 such rounds is far steadier than of
/// 5. Throughput rounds vary less.
fn default_rounds(kind: Kind) -> u32 {
    match kind {
        Kind::Latency => 10,
        Kind::Throughput => 5,
    }
}

/// `HEAD: p50 ratio X, p99 ratio Y` (latency) or `HEAD: ratio X`
/// (throughput), from the medians of the per-round ratios.
fn ratio_line(head: &str, kind: Kind, r50: Vec<f64>, r99: Vec<f64>) -> String {
    match kind {
        Kind::Latency => format!(
            "{head}: p50 ratio {:.2}, p99 ratio {:.2}",
            median(r50),
            median(r99)
        ),
        Kind::Throughput => format!("{head}: ratio {:.2}", median(r50)),
    }
}

/// Which run a block of the guest's output belongs to.
#[derive(Debug, Clone, Copy)]
enum Side {
    Ours = 0,
    Perftest = 1,
    Reference = 2,
    /// rocebus again with the variant's arguments (e.g. `--datagram-tag`).
    Variant = 3,
    /// perftest again at rocebus's bytes on the wire (`Spec::wire_size`).
    Wire = 4,
}

/// The shell lines of one perftest round: the server in the background, the
/// client retried until the server listens, each under `timeout`.
fn perftest_pair(tool: &str, common: &str, server: &str, client: &str) -> String {
    format!(
        "timeout 300 {tool} -d $dev -x $gid {common} {server} >/tmp/perftest-server.txt 2>&1 &\n\
         for t in 1 2 3 4 5 6 7 8 9 10; do sleep 1; timeout 300 {tool} -d $dev -x $gid {common} {client} $addr && break; done\n\
         wait\n"
    )
}

/// Prints each round's figures; returns the per-round p50 (or rate) and p99
/// ratios of ours to theirs.
fn compare(
    kind: Kind,
    ours: &[Option<Figures>],
    theirs: &[Option<Figures>],
    label: &str,
) -> (Vec<f64>, Vec<f64>) {
    let mut ratios50 = Vec::new();
    let mut ratios99 = Vec::new();
    for (i, (o, p)) in ours.iter().zip(theirs.iter()).enumerate() {
        match (kind, o, p) {
            (Kind::Latency, Some(o), Some(p)) => {
                println!(
                    "  round {}: rocebus p50 {:8.2} us p99 {:9.2} us | {label} p50 {:8.2} us p99 {:9.2} us",
                    i + 1,
                    o.p50_us,
                    o.p99_us,
                    p.p50_us,
                    p.p99_us
                );
                ratios50.push(o.p50_us / p.p50_us);
                ratios99.push(o.p99_us / p.p99_us);
            }
            (Kind::Throughput, Some(o), Some(p)) => {
                println!(
                    "  round {}: rocebus {:10.0} msg/s | {label} {:10.0} msg/s",
                    i + 1,
                    o.rate,
                    p.rate
                );
                ratios50.push(o.rate / p.rate);
            }
            _ => println!(
                "  round {}: missing (rocebus {:?}, {label} {:?})",
                i + 1,
                o.is_some(),
                p.is_some()
            ),
        }
    }
    (ratios50, ratios99)
}

/// Names of the benchmarks.
pub fn names() -> Vec<&'static str> {
    SPECS
        .iter()
        .map(|s| s.name)
        .chain(HOST_ONLY.iter().copied())
        .chain(["books", "ipc", "md-repair", "rc-fanin"])
        .chain(["md-fanout", "rc-instructions", "md-instructions"])
        .collect()
}

/// Harnesses that run on the host alone (no RDMA, no guest, no perftest): the
/// gateway's journal against the in-process venue simulator. Each prints its
/// own figures; their journals go to the target directory (disk-backed) and,
/// for `gateway-journal`, also to /dev/shm (tmpfs).
pub const HOST_ONLY: &[&str] = &["gateway-journal", "gateway-restart", "admission-cost"];

/// The arguments `cargo xtask bench NAME` passes to a [`HOST_ONLY`] harness.
fn host_args(
    name: &str,
    target: &Path,
    rounds: Option<u32>,
    iterations: Option<u64>,
) -> Result<Vec<String>> {
    let mut args = vec![name.to_owned()];
    match name {
        "gateway-journal" => {
            if iterations.is_some() {
                bail!(
                    "gateway-journal runs each configuration for a fixed time: -n does not apply"
                );
            }
            args.extend(["--disk-dir".into(), target.display().to_string()]);
        }
        "gateway-restart" => {
            args.extend(["--dir".into(), target.display().to_string()]);
            if let Some(n) = iterations {
                args.extend(["--orders".into(), n.to_string()]);
            }
        }
        "admission-cost" => {
            if let Some(n) = iterations {
                args.extend(["-n".into(), n.to_string()]);
            }
        }
        _ => bail!("{name} is not a host-only benchmark"),
    }
    if let Some(r) = rounds {
        args.extend(["--rounds".into(), r.to_string()]);
    }
    Ok(args)
}

/// Builds `rocebus-bench` (release); returns the binary and the target directory.
pub(crate) fn build_bench(root: &Path) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    eprintln!("== building rocebus-bench (release)");
    let st = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "rocebus-bench"])
        .current_dir(root)
        .status()?;
    if !st.success() {
        bail!("building rocebus-bench failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    // The target folder may be shared by several checkouts (one cache for
    // parallel work): another checkout's build can replace
    // `release/rocebus-bench` while this run's guest is still starting it.
    // Runs use a copy of their own, named after this checkout, taken right
    // after the build.
    let built = target.join("release/rocebus-bench");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&root.canonicalize()?, &mut h);
    let exe = target.join(format!(
        "release/rocebus-bench-run-{:016x}",
        std::hash::Hasher::finish(&h)
    ));
    std::fs::copy(&built, &exe)
        .with_context(|| format!("copying {} to {}", built.display(), exe.display()))?;
    Ok((exe.canonicalize()?, target.canonicalize()?))
}

/// Runs the shell `script` natively when this host has an RDMA device, else in one
/// soft-RoCE guest (killed after `timeout`); returns its standard output, line by line
/// (printed as it is natively; the guest runner prints its own).
pub(crate) fn run_script(root: &Path, script: &str, timeout: Duration) -> Result<Vec<String>> {
    if std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some()) {
        eprintln!("== this host has an RDMA device: running natively");
        let o = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(root)
            .output()?;
        eprint!("{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        print!("{text}");
        Ok(text.lines().map(str::to_owned).collect())
    } else {
        let img = setup::guest_image()?;
        let opts = vm::VmOptions {
            timeout,
            ..Default::default()
        };
        Ok(vm::run(&img, root, script, &opts)?.output.swap_remove(0))
    }
}

/// `rc-fanin`: the harness compares itself against its own N = 1 (no
/// perftest counterpart), so it runs once in the guest (or natively) and
/// prints its `rc-fanin: N=.. p50 ratio .., p99 ratio ..` lines itself.
/// Each connection holds a device context and an rdma_cm channel on both
/// ends, so the open-file limit is raised to its hard maximum first.
fn run_fanin(
    root: &Path,
    rounds: Option<u32>,
    size: usize,
    iterations: Option<u64>,
    ours_extra: &str,
) -> Result<()> {
    let (exe, _) = build_bench(root)?;
    let script = format!(
        "ulimit -n $(ulimit -Hn)\ntimeout 1800 {} rc-fanin -s {size} -n {} --rounds {} --cores 0,1 {ours_extra}\n",
        vm::shell_quote(&exe.display().to_string()),
        iterations.unwrap_or(5000),
        rounds.unwrap_or(1)
    );
    let lines = run_script(root, &script, Duration::from_secs(2000))?;
    let results: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("rc-fanin: "))
        .collect();
    if results.is_empty() {
        bail!("rc-fanin: the harness printed no ratio line");
    }
    println!();
    for l in results {
        crate::verdict::line(l.as_str());
    }
    Ok(())
}

/// Runs a [`HOST_ONLY`] harness natively, its output straight to the terminal.
fn run_host(
    root: &Path,
    name: &str,
    rounds: Option<u32>,
    iterations: Option<u64>,
    json: bool,
) -> Result<()> {
    let (exe, target) = build_bench(root)?;
    let mut args = host_args(name, &target, rounds, iterations)?;
    if json {
        // The harness's own `--json` line is the last one.
        args.push("--json".into());
    }
    eprintln!("== {name}: on the host (no RDMA needed)");
    let st = Command::new(&exe).args(&args).current_dir(root).status()?;
    if !st.success() {
        bail!("{name} failed ({st})");
    }
    Ok(())
}

/// Figures of one run of either side.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Figures {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) rate: f64,
}

/// Parses a `RESULT key=value ...` line of rocebus-bench.
fn parse_ours(lines: &[String]) -> Option<Figures> {
    let l = lines
        .iter()
        .rev()
        .find(|l| l.trim_start().starts_with("RESULT "))?;
    let mut f = Figures::default();
    for kv in l.split_whitespace().skip(1) {
        let (k, v) = kv.split_once('=')?;
        let v: f64 = v.parse().ok()?;
        match k {
            "p50_ns" => f.p50_us = v / 1000.0,
            "p99_ns" => f.p99_us = v / 1000.0,
            "msgs_per_sec" => f.rate = v,
            _ => {}
        }
    }
    Some(f)
}

/// Parses perftest's result row: latency tools print `bytes iterations
/// t_min t_max t_typical t_avg t_stdev p99 p99.9` (us); bandwidth tools
/// print `bytes iterations BW_peak BW_average MsgRate(Mpps)`.
pub(crate) fn parse_perftest(lines: &[String], kind: Kind) -> Option<Figures> {
    let header = lines
        .iter()
        .position(|l| l.contains("#bytes") && l.contains("#iterations"))?;
    let row: Vec<f64> = lines[header + 1..]
        .iter()
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .find(|v| v.len() >= 5)?;
    match kind {
        // perftest prints `inf` (and `-nan`) when its timing broke down (its "correlation
        // coefficient" warning): no figure, rather than a ratio of 0.
        Kind::Latency if row.len() >= 9 && row[4].is_finite() && row[7].is_finite() => {
            Some(Figures {
                p50_us: row[4],
                p99_us: row[7],
                rate: 0.0,
            })
        }
        Kind::Throughput => Some(Figures {
            rate: row[4] * 1e6,
            ..Figures::default()
        }),
        _ => None,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The variant of `cargo xtask bench NAME --hugepages`: rocebus's registered memory on
/// 2 MiB huge pages, an error if the guest has too few.
pub const HUGEPAGES_VARIANT: &str = "--hugepages on";

/// Which API a harness goes through (`cargo xtask bench rc-latency --api c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// The Rust crate (the harnesses of `rocebus-bench`).
    Rust,
    /// The C ABI (`rocebus-ffi`), from a C program.
    C,
}

/// The variant of `cargo xtask bench rc-latency --api c`: the ping-pong through the C API.
pub const C_API_VARIANT: &str = "--api c";

/// Port of the C harness's connection (the Rust harness's is another).
const C_API_PORT: u16 = 7476;

/// Builds the release static library of `rocebus-ffi` and links `bench/c/rc_latency.c`
/// against it with the system's C compiler (`-O2`, warnings are errors), into a copy of
/// its own like [`build_bench`]'s; returns the program.
pub(crate) fn build_c_harness(root: &Path, target: &Path) -> Result<std::path::PathBuf> {
    eprintln!("== building rocebus-ffi (release) and bench/c/rc_latency.c");
    let st = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "rocebus-ffi"])
        .current_dir(root)
        .status()?;
    if !st.success() {
        bail!("building rocebus-ffi failed");
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&root.canonicalize()?, &mut h);
    let exe = target.join(format!(
        "release/rc-latency-c-run-{:016x}",
        std::hash::Hasher::finish(&h)
    ));
    let st = Command::new("cc")
        .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("ffi/include"))
        .arg(root.join("bench/c/rc_latency.c"))
        .arg(target.join("release/librocebus_ffi.a"))
        .args(["-libverbs", "-lrdmacm", "-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .status()
        .context("running cc (the system's C compiler: apt-get install gcc)")?;
    if !st.success() {
        bail!("compiling bench/c/rc_latency.c failed");
    }
    Ok(exe)
}

/// The C harness's command line for one run (`{exe} $addr:PORT -s SIZE -n N --cores 0,1`).
fn c_harness_command(exe_q: &str, size: usize, n: u64) -> String {
    format!("timeout 300 {exe_q} $addr:{C_API_PORT} -s {size} -n {n} --cores 0,1")
}

/// Harnesses that take `--hugepages`.
const HUGEPAGES_HARNESSES: &[&str] =
    &["rc-latency", "rc-throughput", "md-latency", "md-throughput"];

/// 2 MiB pages a guest reserves for a `--hugepages` run (512 MiB of its 2 GiB): md-latency's
/// two processes register some 150 MiB (each publisher's 64 MiB history and each
/// subscriber's receive pool), the orders path a few MiB.
const GUEST_HUGE_PAGES: u32 = 256;

/// Shell lines that reserve [`GUEST_HUGE_PAGES`] in a guest (`ROCEBUS_GUEST_ADDR` is set
/// only there: a host with its own RDMA device keeps its own setting) and print what the
/// kernel gave and has free.
fn reserve_huge_pages() -> String {
    format!(
        "if [ -n \"$ROCEBUS_GUEST_ADDR\" ]; then echo {GUEST_HUGE_PAGES} > /proc/sys/vm/nr_hugepages; fi\n\
         echo \"huge pages: $(grep -E 'HugePages_(Total|Free)' /proc/meminfo | tr -s ' ' | tr '\\n' ' ')\"\n"
    )
}

/// The guest's script: `rounds` rounds of rocebus (and its `variant`, if
/// any), perftest and perftest's reference, each after an `@@SIDE ROUND`
/// marker line.
fn rounds_script(
    spec: &Spec,
    exe_q: &str,
    size: usize,
    n: u64,
    rounds: u32,
    variant: &str,
    variant_cmd: Option<&str>,
) -> String {
    let mut script = String::from(
        "dev=${ROCEBUS_RDMA_DEVICE:-rxe0}; gid=${ROCEBUS_GID_INDEX:-1}; addr=${ROCEBUS_GUEST_ADDR:?}\nexport dev gid addr\n",
    );
    if variant == HUGEPAGES_VARIANT {
        script.push_str(&reserve_huge_pages());
    }
    let ours = format!(
        "timeout 300 {exe_q} {} {} -n {n} {}",
        spec.ours,
        if spec.sized {
            format!("-s {size}")
        } else {
            String::new()
        },
        spec.ours_extra
    );
    for r in 1..=rounds {
        script.push_str(&format!("echo '@@ours {r}'\n{ours}\n"));
        if let Some(cmd) = variant_cmd {
            script.push_str(&format!("echo '@@variant {r}'\n{cmd}\n"));
        } else if !variant.is_empty() {
            script.push_str(&format!("echo '@@variant {r}'\n{ours} {variant}\n"));
        }
        let sizes =
            std::iter::once(("perftest", size)).chain(spec.wire_size.map(|w| ("wire", w(size))));
        for (marker, bytes) in sizes {
            let main = perftest_pair(
                spec.perftest,
                &format!("-s {bytes} -n {n} -F {}", spec.perftest_extra),
                spec.perftest_server,
                spec.perftest_client,
            );
            script.push_str(&format!("echo '@@{marker} {r}'\n"));
            if spec.ip_groups.is_empty() {
                script.push_str(&main);
            } else {
                script.push_str(&format!(
                    "{exe_q} with-groups --groups {} -- sh -c {}\n",
                    spec.ip_groups,
                    vm::shell_quote(&main)
                ));
            }
        }
        if let Some(reference) = spec.reference {
            script.push_str(&format!("echo '@@reference {r}'\n"));
            script.push_str(&perftest_pair(
                spec.perftest,
                &format!("-s {size} -n {n} -F {reference}"),
                "",
                "",
            ));
        }
    }
    script
}

/// The figures of each side's runs, in round order, from the guest's output
/// (by [`Side`]; `None` for a run that printed no figures).
fn split_runs(out: Vec<String>, kind: Kind) -> [Vec<Option<Figures>>; 5] {
    // Split the output by round markers.
    let mut runs: [Vec<Option<Figures>>; 5] = Default::default();
    let mut current: Option<(Side, Vec<String>)> = None;
    let mut flush = |c: Option<(Side, Vec<String>)>| {
        if let Some((side, lines)) = c {
            runs[side as usize].push(match side {
                Side::Ours | Side::Variant => parse_ours(&lines),
                Side::Perftest | Side::Reference | Side::Wire => parse_perftest(&lines, kind),
            });
        }
    };
    for l in out {
        if let Some(rest) = l.strip_prefix("@@") {
            flush(current.take());
            let side = if rest.starts_with("ours") {
                Side::Ours
            } else if rest.starts_with("variant") {
                Side::Variant
            } else if rest.starts_with("reference") {
                Side::Reference
            } else if rest.starts_with("wire") {
                Side::Wire
            } else {
                Side::Perftest
            };
            current = Some((side, Vec::new()));
        } else if let Some((_, v)) = current.as_mut() {
            v.push(l);
        }
    }
    flush(current.take());
    runs
}

/// Benchmarks with a two-host mode: their harness takes `--server` /
/// `--client HOST`, and their perftest tool runs as server and client on
/// the same two guests.
pub const TWO_HOSTS: &[&str] = &["rc-latency", "rc-throughput", "md-latency", "md-throughput"];

/// The script both guests run for `cargo xtask bench --hosts 2 NAME`: guest
/// 0 is the server of every run, guest 1 the client; each round runs
/// rocebus, then perftest, each after an `@@SIDE ROUND` marker. The client
/// retries until the server of that run listens, so the two guests need no
/// other synchronisation (rocebus and perftest listen on different ports:
/// a client cannot reach the other tool's server). perftest's server and
/// client get their own arguments (md-latency's multicast group each), and
/// with `ip_groups` run under `with-groups` on both guests, as in one guest.
fn two_hosts_script(spec: &Spec, exe_q: &str, size: usize, n: u64, rounds: u32) -> String {
    let mut script = String::from(
        "dev=${ROCEBUS_RDMA_DEVICE:-rxe0}; gid=${ROCEBUS_GID_INDEX:-1}; \
         addr=${ROCEBUS_GUEST_ADDR:?}; peer=${ROCEBUS_PEER_ADDR:?}\nexport dev gid addr peer\n",
    );
    let ours = format!(
        "timeout 300 {exe_q} {} -s {size} -n {n} --cores 0",
        spec.ours
    );
    let tool = |own: &str| {
        [
            "timeout 300",
            spec.perftest,
            "-d $dev -x $gid",
            &format!("-s {size} -n {n} -F"),
            spec.perftest_extra,
            own,
        ]
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
    };
    let server = tool(spec.perftest_server);
    let client = format!(
        "for t in $(seq 1 60); do sleep 1; {} $peer && break; done",
        tool(spec.perftest_client)
    );
    let (server, client) = if spec.ip_groups.is_empty() {
        (server, client)
    } else {
        let with = format!("{exe_q} with-groups --groups {} --", spec.ip_groups);
        (
            format!("{with} {server}"),
            format!("{with} sh -c {}", vm::shell_quote(&client)),
        )
    };
    for r in 1..=rounds {
        script.push_str(&format!(
            "echo '@@ours {r}'\n\
             if [ \"$ROCEBUS_GUEST_INDEX\" = 0 ]; then {ours} --server --addr $addr; \
             else {ours} --client $peer; fi\n\
             echo '@@perftest {r}'\n\
             if [ \"$ROCEBUS_GUEST_INDEX\" = 0 ]; then {server}; \
             else {client}; fi\n"
        ));
    }
    script
}

/// `cargo xtask bench --hosts 2 NAME`: the harness and its perftest
/// counterpart between two linked guests (one vCPU each, a UDP socket on the
/// host as the wire), in alternating rounds. Latency figures come from the
/// clients (both print RTT/2); throughput from the receivers (rocebus's
/// server, perftest's client, which is where each tool prints its rate).
fn run_two_hosts(spec: &Spec, root: &Path, rounds: u32, size: usize, n: u64) -> Result<()> {
    if !TWO_HOSTS.contains(&spec.name) {
        bail!(
            "{} has no two-host mode yet; --hosts 2 runs: {}",
            spec.name,
            TWO_HOSTS.join(", ")
        );
    }
    let (built, target) = build_bench(root)?;
    // The guests boot for a while after the build: a private copy keeps another build in
    // the same target directory (another worktree's) from swapping the binary under them.
    let private = target.join(format!("bench-two-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&private)?;
    let exe = private.join("rocebus-bench");
    std::fs::copy(&built, &exe)
        .with_context(|| format!("cannot copy {} to {}", built.display(), exe.display()))?;
    let exe_q = vm::shell_quote(&exe.display().to_string());
    let script = two_hosts_script(spec, &exe_q, size, n, rounds);
    let img = setup::guest_image()?;
    let opts = vm::VmOptions {
        hosts: 2,
        timeout: Duration::from_secs(700 * rounds as u64 + 180),
        ..Default::default()
    };
    let outcome = vm::run(&img, root, &script, &opts);
    std::fs::remove_dir_all(&private).ok();
    let outcome = outcome?;
    let mut outputs = outcome.output;
    let client = outputs.pop().unwrap_or_default();
    let server = outputs.pop().unwrap_or_default();
    let [c_ours, c_theirs, ..] = split_runs(client, spec.kind);
    let [s_ours, s_theirs, ..] = split_runs(server, spec.kind);
    let (ours, theirs) = match spec.kind {
        Kind::Latency => (c_ours, c_theirs),
        // The receiver's rate where perftest prints one there (ib_send_bw's server),
        // else its client's (ib_write_bw prints only there).
        Kind::Throughput => (
            s_ours,
            s_theirs
                .into_iter()
                .zip(c_theirs)
                .map(|(s, c)| s.or(c))
                .collect(),
        ),
    };
    println!();
    println!(
        "{}: two hosts (two soft-RoCE guests linked by a UDP socket on one machine: emulated, \
         ratios only are meaningful), {rounds} alternating rounds, {size} B, {n} iterations",
        spec.name
    );
    if let Some(note) = outcome.link.as_ref().and_then(|l| l.inconclusive()) {
        println!("  {note}");
    }
    let label = format!("{} {}", spec.perftest, spec.perftest_extra);
    let (r50, r99) = compare(spec.kind, &ours, &theirs, label.trim());
    if r50.is_empty() {
        bail!("{}: no round produced figures on both sides", spec.name);
    }
    let head = format!("{} --hosts 2", spec.name);
    crate::verdict::line(ratio_line(&head, spec.kind, r50, r99));
    Ok(())
}

/// How `cargo xtask bench NAME` runs ([`run`]).
#[derive(Clone, Copy, Debug)]
pub struct BenchOptions<'a> {
    /// Alternating rounds (None: the benchmark's default).
    pub rounds: Option<u32>,
    /// Message size in bytes.
    pub size: usize,
    /// Iterations per round (None: the benchmark's default).
    pub iterations: Option<u64>,
    /// A third run per round (`--datagram-tag`, `--hugepages on`, `--api c`), or "".
    pub variant: &'a str,
    /// 1: one guest (or this host); 2: two guests.
    pub hosts: u8,
    /// Host-only harnesses: end with `rocebus-bench --json`'s line.
    pub harness_json: bool,
}

/// Runs `name` for `rounds` alternating rounds; prints the figures and the
/// closing ratio line. A non-empty `variant` (arguments of rocebus's side,
/// such as `--datagram-tag`) adds a third run per round, rocebus with them,
/// right after the plain one, and its own ratio line `NAME VARIANT: ...`:
/// what the variant costs is then measured in the same guest, against the
/// same perftest rounds, not across runs that vary 2x.
pub fn run(root: &Path, name: &str, opts: &BenchOptions<'_>) -> Result<()> {
    let BenchOptions {
        rounds,
        size,
        iterations,
        variant,
        hosts,
        harness_json: json,
    } = *opts;
    if hosts == 2 {
        let spec = SPECS
            .iter()
            .find(|s| s.name == name)
            .filter(|s| TWO_HOSTS.contains(&s.name))
            .with_context(|| {
                format!(
                    "{name} has no two-host mode; --hosts 2 runs: {}",
                    TWO_HOSTS.join(", ")
                )
            })?;
        if !variant.is_empty() {
            bail!("{name} --hosts 2: {variant} does not apply");
        }
        let rounds = rounds.unwrap_or(default_rounds(spec.kind));
        return run_two_hosts(
            spec,
            root,
            rounds,
            size,
            iterations.unwrap_or(spec.default_iterations),
        );
    }
    if hosts != 1 {
        bail!("--hosts is 1 (one guest, or this host) or 2 (two guests)");
    }
    if variant == C_API_VARIANT && !["rc-latency", "rc-instructions"].contains(&name) {
        bail!("{name}: --api c applies to rc-latency and rc-instructions");
    }
    if variant == HUGEPAGES_VARIANT && !HUGEPAGES_HARNESSES.contains(&name) {
        bail!(
            "{name}: --hugepages applies to {}",
            HUGEPAGES_HARNESSES.join(", ")
        );
    }
    if HOST_ONLY.contains(&name) {
        return run_host(root, name, rounds, iterations, json);
    }
    if name == "books" {
        return crate::books::run(root, rounds, iterations);
    }
    if name == "ipc" {
        return crate::ipc::run(root, rounds, iterations);
    }
    if name == "md-repair" {
        return crate::md_repair::run(root);
    }
    if name == "md-fanout" {
        return crate::md_fanout::run(root, iterations, variant);
    }
    if name == "rc-fanin" {
        return run_fanin(root, rounds, size, iterations, variant);
    }
    let counted = match name {
        "rc-instructions" => Some(&crate::rc_instructions::RC),
        "md-instructions" => Some(&crate::md_instructions::MD),
        _ => None,
    };
    if let Some(c) = counted {
        if rounds.is_some() {
            bail!("{name} counts instructions once: --rounds does not apply");
        }
        if name == "rc-instructions" && variant == C_API_VARIANT {
            return crate::rc_instructions::run_c_api(root, size, iterations);
        }
        if name == "rc-instructions" && !variant.is_empty() {
            bail!("rc-instructions: {variant} does not apply to the orders path");
        }
        return crate::rc_instructions::run(c, root, size, iterations, variant);
    }
    let spec = SPECS
        .iter()
        .find(|s| s.name == name)
        .with_context(|| format!("unknown benchmark {name:?}; known: {}", names().join(", ")))?;
    let rounds = rounds.unwrap_or(default_rounds(spec.kind));
    let n = iterations.unwrap_or(spec.default_iterations);
    let (exe, target) = build_bench(root)?;
    // Each side runs under `timeout`: perftest occasionally hangs under
    // emulation; a hung round is reported as missing, not waited for.
    let exe_q = vm::shell_quote(&exe.display().to_string());
    let variant_cmd = if variant == C_API_VARIANT {
        let c = build_c_harness(root, &target)?;
        Some(c_harness_command(
            &vm::shell_quote(&c.display().to_string()),
            size,
            n,
        ))
    } else {
        None
    };
    let script = rounds_script(
        spec,
        &exe_q,
        size,
        n,
        rounds,
        variant,
        variant_cmd.as_deref(),
    );
    let out = run_script(
        root,
        &script,
        Duration::from_secs(600 * rounds as u64 + 120),
    )?;
    let [ours, theirs, reference, with_variant, wire] = split_runs(out, spec.kind);
    println!();
    println!("{name}: {rounds} alternating rounds, {size} B, {n} iterations (soft-RoCE; ratios only are meaningful)");
    let label = format!("{} {}", spec.perftest, spec.perftest_extra);
    let (ratios50, ratios99) = compare(spec.kind, &ours, &theirs, &label);
    if let Some(w) = spec.wire_size {
        let label = [
            spec.perftest,
            spec.perftest_extra,
            &format!("-s {}", w(size)),
        ]
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
        println!("  against {label}, as many bytes as rocebus puts on the wire:");
        let (w50, w99) = compare(spec.kind, &ours, &wire, &label);
        if !w50.is_empty() {
            let head = format!("{name} against {label} (same bytes)");
            crate::verdict::line(ratio_line(&head, spec.kind, w50, w99));
        }
    }
    if let Some(r) = spec.reference {
        let label = format!("{} {r}", spec.perftest);
        println!("  for reference, against {label}:");
        let (r50, r99) = compare(spec.kind, &ours, &reference, &label);
        if !r50.is_empty() {
            let head = format!("{name} against {label} (reference)");
            crate::verdict::line(ratio_line(&head, spec.kind, r50, r99));
        }
    }
    let variant_line = if variant.is_empty() {
        None
    } else {
        let head = format!("{name} {variant}");
        println!("  rocebus {variant}, against {label}:");
        let (v50, v99) = compare(spec.kind, &with_variant, &theirs, &label);
        println!("  rocebus {variant} against plain rocebus, same rounds:");
        let (c50, c99) = compare(spec.kind, &with_variant, &ours, "plain rocebus");
        (!v50.is_empty()).then(|| {
            [
                ratio_line(&head, spec.kind, v50, v99),
                ratio_line(&format!("{head} over plain"), spec.kind, c50, c99),
            ]
        })
    };
    if ratios50.is_empty() {
        bail!("{name}: no round produced figures on both sides");
    }
    crate::verdict::line(ratio_line(name, spec.kind, ratios50, ratios99));
    for l in variant_line.into_iter().flatten() {
        crate::verdict::line(l);
    }
    Ok(())
}

/// The guest's script of `cargo xtask bench rc-latency --flood RATE`: the `rc-flood` harness
/// (both listeners, the healthy peer and the ping-pong in one process, the pyverbs
/// attacker `core/tests/attackers/cm_flood.py` started by it for each flooded phase). Each
/// attempt of the attacker holds a device context and an rdma_cm channel, so the open-file
/// limit is raised first.
fn flood_script(
    exe_q: &str,
    attacker_q: &str,
    rate: u32,
    rounds: u32,
    size: usize,
    n: u64,
) -> String {
    format!(
        "ulimit -n $(ulimit -Hn)
         timeout {} {exe_q} rc-flood -s {size} -n {n} --rounds {rounds} --rate {rate} --attacker {attacker_q} --cores 0,1
",
        600 * u64::from(rounds) + 300
    )
}

/// One `FLOOD round=R attempts=A quiet:KEY=V ... flood:KEY=V ...` line of `rc-flood`: the
/// attacker's connect requests and, per phase, its figures by key.
#[derive(Debug, Clone, Default, PartialEq)]
struct FloodRound {
    attempts: f64,
    quiet: std::collections::BTreeMap<String, f64>,
    flood: std::collections::BTreeMap<String, f64>,
}

fn parse_flood_line(l: &str) -> Option<FloodRound> {
    let rest = l.trim_start().strip_prefix("FLOOD ")?;
    let mut r = FloodRound::default();
    for kv in rest.split_whitespace() {
        let (k, v) = kv.split_once('=')?;
        let v: f64 = v.parse().ok()?;
        match k.split_once(':') {
            Some(("quiet", key)) => {
                r.quiet.insert(key.to_owned(), v);
            }
            Some(("flood", key)) => {
                r.flood.insert(key.to_owned(), v);
            }
            _ if k == "attempts" => r.attempts = v,
            _ => {}
        }
    }
    (!r.quiet.is_empty() && !r.flood.is_empty()).then_some(r)
}

/// The closing lines of `rc-latency --flood`: the medians over rounds of the per-round
/// ratios flood / quiet (handshake, handshake through the cookie, ping-pong p50 and p99),
/// the cookie path's handshake over the plain one (quiet), and the listener's time per
/// refused request while flooded (its `accept` calls that refused requests, over those).
fn flood_summary(rate: u32, rounds: &[FloodRound]) -> Vec<String> {
    let med =
        |f: &dyn Fn(&FloodRound) -> Option<f64>| median(rounds.iter().filter_map(f).collect());
    let ratio = |k: &'static str| move |r: &FloodRound| Some(r.flood.get(k)? / r.quiet.get(k)?);
    let per_refused = med(&|r| {
        r.flood
            .get("us_per_refused")
            .copied()
            .filter(|v| v.is_finite())
    });
    vec![
        format!(
            "rc-latency --flood {rate}: {} rounds, {:.0} requests refused per second while flooded (median; {:.0} attacker requests a round)",
            rounds.len(),
            med(&|r| r.flood.get("refused_per_s").copied()),
            med(&|r| Some(r.attempts))
        ),
        format!(
            "rc-latency --flood {rate}: handshake ratio {:.2}, cookie-path handshake ratio {:.2}, p50 ratio {:.2}, p99 ratio {:.2} (flood / quiet)",
            med(&ratio("connect_us")),
            med(&ratio("cookie_connect_us")),
            med(&ratio("p50_us")),
            med(&ratio("p99_us"))
        ),
        format!(
            "rc-latency --flood {rate}: cookie-path handshake {:.2}x the plain one (quiet), listener {per_refused:.1} us per refused request",
            med(&|r| Some(r.quiet.get("cookie_connect_us")? / r.quiet.get("connect_us")?)),
        ),
        // Where the serving thread's time went during the flooded ping-pong (keys
        // absent from older harnesses: NaN).
        format!(
            "rc-latency --flood {rate}: flooded ping-pong: longest listener call {:.1} us ({:.0} over 1 ms), longest serving turn outside it {:.1} us ({:.0} over 1 ms), {:.0} round trips over 1 ms, {:.1} refused per second (medians)",
            med(&|r| r.flood.get("pp_listener_max_us").copied()),
            med(&|r| r.flood.get("pp_listener_slow").copied()),
            med(&|r| r.flood.get("pp_stall_max_us").copied()),
            med(&|r| r.flood.get("pp_stalls").copied()),
            med(&|r| r.flood.get("pp_slow_rtts").copied()),
            med(&|r| r.flood.get("pp_refused_per_s").copied()),
        ),
    ]
}

/// `cargo xtask bench rc-latency --flood RATE`: the `rc-flood` harness in one guest (or
/// natively), its round lines, then [`flood_summary`].
pub fn run_flood(
    root: &Path,
    rate: u32,
    rounds: Option<u32>,
    size: usize,
    iterations: Option<u64>,
) -> Result<()> {
    let (exe, _) = build_bench(root)?;
    let rounds = rounds.unwrap_or(3);
    let attacker = root
        .join("core/tests/attackers/cm_flood.py")
        .canonicalize()?;
    let script = flood_script(
        &vm::shell_quote(&exe.display().to_string()),
        &vm::shell_quote(&attacker.display().to_string()),
        rate,
        rounds,
        size,
        iterations.unwrap_or(5000),
    );
    let lines = run_script(
        root,
        &script,
        Duration::from_secs(600 * u64::from(rounds) + 400),
    )?;
    let parsed: Vec<FloodRound> = lines.iter().filter_map(|l| parse_flood_line(l)).collect();
    if parsed.is_empty() {
        bail!("rc-flood printed no round (FLOOD line)");
    }
    println!();
    for l in flood_summary(rate, &parsed) {
        crate::verdict::line(l);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<String> {
        s.lines().map(str::to_owned).collect()
    }

    #[test]
    fn parses_perftest_latency_and_bandwidth_rows() {
        let lat = lines(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 64      2000          20.68          40856.47      22.14    \t       242.62      \t1211.23\t\t6156.63 \t\t23394.54\n",
        );
        let f = parse_perftest(&lat, Kind::Latency).unwrap();
        assert_eq!((f.p50_us, f.p99_us), (22.14, 6156.63));
        let bw = lines(
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 64         200000           0.00               0.62   \t\t   0.010215\n",
        );
        assert!((parse_perftest(&bw, Kind::Throughput).unwrap().rate - 10215.0).abs() < 1e-6);
        // A run whose timing broke down prints inf: no figure.
        let broken = lines(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \nCorrelation coefficient r^2: 0.797947 < 0.9\n 80      2000          inf            inf          inf      \t       inf         \t-nan   \t\tinf     \t\tinf    \n",
        );
        assert!(parse_perftest(&broken, Kind::Latency).is_none());
    }

    /// rc-latency also runs perftest at the ring frame's size (80 bytes
    /// for 64, the figure `frame_len` is pinned to in the ring's tests),
    /// md-latency at the datagram's, with its groups joined as the main run.
    #[test]
    fn wire_size_rounds_run_perftest_at_rocebus_bytes() {
        let rc = SPECS.iter().find(|s| s.name == "rc-latency").unwrap();
        assert_eq!(ring_frame_len(64), 80);
        assert_eq!(ring_frame_len(0), 16);
        assert_eq!(ring_frame_len(5), 32);
        assert_eq!(ring_frame_len(17), 48);
        let script = rounds_script(rc, "rb", 64, 100, 1, "", None);
        assert!(script.contains("@@perftest 1"), "{script}");
        assert!(script.contains("-s 64 -n 100 -F "), "{script}");
        assert!(script.contains("@@wire 1"), "{script}");
        assert!(script.contains("-s 80 -n 100 -F "), "{script}");
        let md = SPECS.iter().find(|s| s.name == "md-latency").unwrap();
        let script = rounds_script(md, "rb", 64, 100, 2, "", None);
        let wire = script.split("@@wire 2").nth(1).unwrap();
        assert!(wire.contains("-s 90 -n 100 -F -c UD -g"), "{wire}");
        assert!(
            wire.contains("with-groups --groups 239.9.4.1,239.9.4.2"),
            "{wire}"
        );
        let out = lines(
            "@@ours 1\nRESULT p50_ns=10000 p99_ns=20000\n@@perftest 1\nnothing\n@@wire 1\nnothing\n",
        );
        let runs = split_runs(out, Kind::Latency);
        assert_eq!(runs[Side::Wire as usize].len(), 1);
        assert_eq!(runs[Side::Perftest as usize].len(), 1);
    }

    /// perftest's -M takes 16 decimal bytes; the IPv4-mapped groups in the
    /// server and client arguments must be the ones held joined.
    #[test]
    fn md_latency_mgids_are_the_joined_groups() {
        let spec = SPECS.iter().find(|s| s.name == "md-latency").unwrap();
        let group = |args: &str| {
            let bytes: Vec<u8> = args
                .strip_prefix("-M ")
                .unwrap()
                .split(':')
                .map(|b| b.parse().unwrap())
                .collect();
            assert_eq!(bytes.len(), 16);
            assert_eq!(&bytes[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255]);
            format!("{}.{}.{}.{}", bytes[12], bytes[13], bytes[14], bytes[15])
        };
        let (srv, cli) = (group(spec.perftest_server), group(spec.perftest_client));
        assert_ne!(srv, cli, "one group per direction, as in rocebus's harness");
        assert_eq!(spec.ip_groups, format!("{srv},{cli}"));
        assert!(spec.perftest_extra.contains("-g"));
    }

    /// `--datagram-tag` runs rocebus twice a round, plain then tagged, and
    /// each run's figures land on its own side.
    #[test]
    fn two_hosts_script_serves_on_guest_0_and_connects_from_guest_1() {
        let spec = SPECS.iter().find(|s| s.name == "rc-latency").unwrap();
        let s = two_hosts_script(spec, "B", 64, 100, 2);
        for r in 1..=2 {
            let ours = s.find(&format!("@@ours {r}'")).unwrap();
            let perftest = s.find(&format!("@@perftest {r}'")).unwrap();
            assert!(ours < perftest, "{s}");
        }
        assert_eq!(
            s.matches("B rc-latency -s 64 -n 100 --cores 0 --server --addr $addr;")
                .count(),
            2,
            "{s}"
        );
        assert_eq!(
            s.matches("B rc-latency -s 64 -n 100 --cores 0 --client $peer;")
                .count(),
            2,
            "{s}"
        );
        // perftest's client retries until the server of that round listens.
        assert_eq!(
            s.matches("do sleep 1; timeout 300 ib_write_lat -d $dev -x $gid -s 64 -n 100 -F $peer && break; done")
                .count(),
            2,
            "{s}"
        );
    }

    /// md-latency across two guests: rocebus's echo serves on guest 0, and
    /// perftest's UD multicast ping-pong runs with each side's group, under
    /// with-groups (an IP membership) on both guests, the client retried.
    #[test]
    fn two_hosts_md_latency_pairs_ib_send_lat_with_its_groups() {
        let spec = SPECS.iter().find(|s| s.name == "md-latency").unwrap();
        assert!(TWO_HOSTS.contains(&spec.name));
        let s = two_hosts_script(spec, "B", 64, 100, 1);
        assert!(
            s.contains("B md-latency -s 64 -n 100 --cores 0 --server --addr $addr;"),
            "{s}"
        );
        assert!(
            s.contains("B md-latency -s 64 -n 100 --cores 0 --client $peer;"),
            "{s}"
        );
        assert!(
            s.contains(
                "then B with-groups --groups 239.9.4.1,239.9.4.2 -- timeout 300 ib_send_lat \
                 -d $dev -x $gid -s 64 -n 100 -F -c UD -g -M 0:0:0:0:0:0:0:0:0:0:255:255:239:9:4:1;"
            ),
            "{s}"
        );
        assert!(
            s.contains(
                "else B with-groups --groups 239.9.4.1,239.9.4.2 -- sh -c 'for t in $(seq 1 60); \
                 do sleep 1; timeout 300 ib_send_lat -d $dev -x $gid -s 64 -n 100 -F -c UD -g \
                 -M 0:0:0:0:0:0:0:0:0:0:255:255:239:9:4:2 $peer && break; done'; fi"
            ),
            "{s}"
        );
        // The client's loop runs in `sh -c`: the variables it uses are exported.
        assert!(s.contains("export dev gid addr peer"), "{s}");
        let t = SPECS.iter().find(|s| s.name == "md-throughput").unwrap();
        let s = two_hosts_script(t, "B", 64, 100, 1);
        assert!(
            s.contains("B md-throughput -s 64 -n 100 --cores 0 --server"),
            "{s}"
        );
        assert!(
            s.contains("then timeout 300 ib_send_bw -d $dev -x $gid -s 64 -n 100 -F -c UD; else"),
            "{s}"
        );
    }

    /// `--hugepages`: the guest reserves huge pages before the first run, and every round
    /// runs rocebus on 4 KiB pages, then on huge pages, then perftest.
    #[test]
    fn the_hugepages_variant_reserves_pages_in_the_guest_first() {
        let spec = SPECS.iter().find(|s| s.name == "rc-latency").unwrap();
        let s = rounds_script(spec, "rb", 64, 100, 2, HUGEPAGES_VARIANT, None);
        let reserve = s
            .find(&format!(
                "echo {GUEST_HUGE_PAGES} > /proc/sys/vm/nr_hugepages"
            ))
            .unwrap();
        assert!(reserve < s.find("@@ours 1").unwrap(), "{s}");
        assert!(s.contains("if [ -n \"$ROCEBUS_GUEST_ADDR\" ]"), "{s}");
        for r in 1..=2 {
            let plain = s.find(&format!("@@ours {r}'")).unwrap();
            let huge = s.find(&format!("@@variant {r}'")).unwrap();
            assert!(plain < huge && huge < s.find(&format!("@@perftest {r}'")).unwrap());
        }
        assert_eq!(s.matches("--cores 0,1 --hugepages on\n").count(), 2, "{s}");
        // Without the variant nothing is reserved.
        let plain = rounds_script(spec, "rb", 64, 100, 2, "", None);
        assert!(!plain.contains("nr_hugepages"), "{plain}");
    }

    /// `rc-latency --api c`: the C harness runs after the Rust one in every round, on its
    /// own port, with the same size, iterations and cores.
    #[test]
    fn the_c_api_variant_runs_the_c_harness_beside_the_rust_one_every_round() {
        let spec = SPECS.iter().find(|s| s.name == "rc-latency").unwrap();
        let c = c_harness_command("C", 64, 100);
        assert_eq!(
            c,
            format!("timeout 300 C $addr:{C_API_PORT} -s 64 -n 100 --cores 0,1")
        );
        let s = rounds_script(spec, "B", 64, 100, 2, C_API_VARIANT, Some(&c));
        for r in 1..=2 {
            let ours = s.find(&format!("@@ours {r}'")).unwrap();
            let variant = s.find(&format!("@@variant {r}'")).unwrap();
            let perftest = s.find(&format!("@@perftest {r}'")).unwrap();
            assert!(ours < variant && variant < perftest, "{s}");
        }
        assert_eq!(s.matches(&format!("{c}\n")).count(), 2, "{s}");
        assert!(
            !s.contains("--api c"),
            "the Rust harness takes no --api: {s}"
        );
    }

    #[test]
    fn a_variant_runs_beside_plain_rocebus_every_round() {
        let spec = SPECS.iter().find(|s| s.name == "md-latency").unwrap();
        let s = rounds_script(spec, "B", 64, 100, 2, "--datagram-tag", None);
        for r in 1..=2 {
            let ours = s.find(&format!("@@ours {r}'")).unwrap();
            let variant = s.find(&format!("@@variant {r}'")).unwrap();
            let perftest = s.find(&format!("@@perftest {r}'")).unwrap();
            assert!(ours < variant && variant < perftest, "{s}");
        }
        assert_eq!(s.matches("B md-latency -s 64 -n 100 ").count(), 4);
        assert_eq!(s.matches(" --datagram-tag\n").count(), 2);
        assert!(!rounds_script(spec, "B", 64, 100, 2, "", None).contains("@@variant"));
        let out = lines(
            "@@ours 1\nRESULT p50_ns=1000 p99_ns=2000\n@@variant 1\nRESULT p50_ns=1500 p99_ns=2500\n\
             @@perftest 1\nnothing\n@@reference 1\n",
        );
        let [ours, theirs, reference, variant, _] = split_runs(out, Kind::Latency);
        assert_eq!(ours[0].unwrap().p50_us, 1.0);
        assert_eq!(variant[0].unwrap().p50_us, 1.5);
        assert_eq!((theirs.len(), theirs[0]), (1, None));
        assert_eq!((reference.len(), reference[0]), (1, None));
    }

    #[test]
    fn host_only_benchmarks_get_their_directories_and_counts() {
        let t = Path::new("tgt");
        assert_eq!(
            host_args("gateway-journal", t, Some(2), None).unwrap(),
            ["gateway-journal", "--disk-dir", "tgt", "--rounds", "2"]
        );
        assert!(host_args("gateway-journal", t, None, Some(5)).is_err());
        assert_eq!(
            host_args("gateway-restart", t, None, Some(1000)).unwrap(),
            ["gateway-restart", "--dir", "tgt", "--orders", "1000"]
        );
        assert_eq!(
            host_args("admission-cost", t, Some(3), Some(1000)).unwrap(),
            ["admission-cost", "-n", "1000", "--rounds", "3"]
        );
        assert!(host_args("rc-latency", t, None, None).is_err());
        assert!(names().contains(&"gateway-restart"));
        assert!(names().contains(&"admission-cost"));
    }

    #[test]
    fn flood_rounds_are_parsed_and_summarised_as_ratios() {
        let l =
            "FLOOD round=1 attempts=950 quiet:connect_us=1000.0 quiet:cookie_connect_us=1500.0 \
                 quiet:p50_us=10.00 quiet:p99_us=20.00 quiet:listener_us_per_s=50.0 \
                 quiet:refused_per_s=0.0 quiet:us_per_refused=NaN flood:connect_us=1200.0 flood:cookie_connect_us=1800.0 \
                 flood:p50_us=11.00 flood:p99_us=40.00 flood:listener_us_per_s=2050.0 \
                 flood:refused_per_s=100.0 flood:us_per_refused=20.0 flood:pp_listener_max_us=12.5 \
                 flood:pp_listener_slow=0 flood:pp_stall_max_us=9000.0 flood:pp_stalls=40 \
                 flood:pp_slow_rtts=45 flood:pp_refused_per_s=30.0";
        let r = parse_flood_line(l).unwrap();
        assert_eq!(r.attempts, 950.0);
        assert_eq!(r.quiet["connect_us"], 1000.0);
        assert_eq!(r.flood["refused_per_s"], 100.0);
        assert!(
            r.quiet["us_per_refused"].is_nan(),
            "nothing refused while quiet"
        );
        assert!(parse_flood_line("RESULT p50_ns=1").is_none());
        assert!(parse_flood_line("FLOOD round=1 attempts=3").is_none());
        let out = flood_summary(100, &[r.clone(), r]);
        assert_eq!(
            out[0],
            "rc-latency --flood 100: 2 rounds, 100 requests refused per second while flooded (median; 950 attacker requests a round)"
        );
        assert_eq!(
            out[1],
            "rc-latency --flood 100: handshake ratio 1.20, cookie-path handshake ratio 1.20, p50 ratio 1.10, p99 ratio 2.00 (flood / quiet)"
        );
        assert_eq!(
            out[2],
            "rc-latency --flood 100: cookie-path handshake 1.50x the plain one (quiet), listener 20.0 us per refused request"
        );
        assert_eq!(
            out[3],
            "rc-latency --flood 100: flooded ping-pong: longest listener call 12.5 us (0 over 1 ms), longest serving turn outside it 9000.0 us (40 over 1 ms), 45 round trips over 1 ms, 30.0 refused per second (medians)"
        );
        let s = flood_script("B", "A", 100, 2, 64, 50);
        assert!(
            s.contains("B rc-flood -s 64 -n 50 --rounds 2 --rate 100 --attacker A --cores 0,1\n"),
            "{s}"
        );
        assert!(s.starts_with("ulimit -n $(ulimit -Hn)\n"), "{s}");
    }

    #[test]
    fn parses_result_lines_and_medians() {
        let f = parse_ours(&lines(
            "noise\nRESULT p50_ns=26159 p90_ns=1 p99_ns=9551871 max_ns=2 count=3\n",
        ))
        .unwrap();
        assert_eq!((f.p50_us, f.p99_us), (26.159, 9551.871));
        let f = parse_ours(&lines("RESULT msgs_per_sec=39873.7 lost=0")).unwrap();
        assert_eq!(f.rate, 39873.7);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
