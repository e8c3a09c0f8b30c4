//! `cargo xtask bench NAME`: a rocebus harness and its perftest counterpart
//! in alternating rounds in one soft-RoCE guest (or natively on a host with
//! an RDMA device), then both sets of figures and the median ratios.
//!
//! Under emulation absolute times mean little and drift between runs, so
//! only ratios measured in the same guest, interleaved, are reported.

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
    default_iterations: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Latency,
    Throughput,
}

const SPECS: &[Spec] = &[
    Spec {
        name: "rc-latency",
        kind: Kind::Latency,
        ours: "rc-latency",
        sized: true,
        ours_extra: "--cores 0,1",
        perftest: "ib_write_lat",
        perftest_extra: "",
        default_iterations: 5000,
    },
    Spec {
        name: "rc-throughput",
        kind: Kind::Throughput,
        ours: "rc-throughput",
        sized: true,
        ours_extra: "",
        perftest: "ib_write_bw",
        perftest_extra: "",
        default_iterations: 200_000,
    },
    Spec {
        name: "md-throughput",
        kind: Kind::Throughput,
        ours: "md-throughput",
        sized: true,
        ours_extra: "",
        perftest: "ib_send_bw",
        perftest_extra: "-c UD",
        default_iterations: 200_000,
    },
    Spec {
        name: "md-latency",
        kind: Kind::Latency,
        ours: "md-latency",
        sized: true,
        ours_extra: "",
        perftest: "ib_send_lat",
        perftest_extra: "-c UD",
        default_iterations: 5000,
    },
    Spec {
        name: "gateway-rtt",
        kind: Kind::Latency,
        ours: "gateway-rtt",
        sized: false,
        ours_extra: "",
        perftest: "ib_write_lat",
        perftest_extra: "",
        default_iterations: 5000,
    },
];

/// Names of the benchmarks.
pub fn names() -> Vec<&'static str> {
    SPECS.iter().map(|s| s.name).collect()
}

/// Figures of one run of either side.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Figures {
    p50_us: f64,
    p99_us: f64,
    rate: f64,
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
fn parse_perftest(lines: &[String], kind: Kind) -> Option<Figures> {
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
        Kind::Latency if row.len() >= 9 => Some(Figures {
            p50_us: row[4],
            p99_us: row[7],
            rate: 0.0,
        }),
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

/// Runs `name` for `rounds` alternating rounds; prints the figures and the
/// closing ratio line.
pub fn run(
    root: &Path,
    name: &str,
    rounds: u32,
    size: usize,
    iterations: Option<u64>,
) -> Result<()> {
    let spec = SPECS
        .iter()
        .find(|s| s.name == name)
        .with_context(|| format!("unknown benchmark {name:?}; known: {}", names().join(", ")))?;
    let n = iterations.unwrap_or(spec.default_iterations);
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
    let exe = target.join("release/rocebus-bench").canonicalize()?;
    // Each side runs under `timeout`: perftest occasionally hangs under
    // emulation; a hung round is reported as missing, not waited for.
    let mut script = String::from(
        "dev=${ROCEBUS_RDMA_DEVICE:-rxe0}; gid=${ROCEBUS_GID_INDEX:-1}; addr=${ROCEBUS_GUEST_ADDR:?}\n",
    );
    for r in 1..=rounds {
        script.push_str(&format!(
            "echo '@@ours {r}'\ntimeout 300 {exe} {ours} {sz} -n {n} {extra}\n",
            exe = vm::shell_quote(&exe.display().to_string()),
            ours = spec.ours,
            sz = if spec.sized {
                format!("-s {size}")
            } else {
                String::new()
            },
            extra = spec.ours_extra
        ));
        script.push_str(&format!(
            "echo '@@perftest {r}'\ntimeout 300 {pt} -d $dev -x $gid -s {size} -n {n} -F {ex} >/tmp/perftest-server.txt 2>&1 &\nfor t in 1 2 3 4 5 6 7 8 9 10; do sleep 1; timeout 300 {pt} -d $dev -x $gid -s {size} -n {n} -F {ex} $addr && break; done\nwait\n",
            pt = spec.perftest,
            ex = spec.perftest_extra
        ));
    }
    let out = if std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some()) {
        eprintln!("== this host has an RDMA device: running natively");
        let o = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .current_dir(root)
            .output()?;
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        print!("{text}");
        text.lines().map(str::to_owned).collect::<Vec<_>>()
    } else {
        let img = setup::guest_image()?;
        let opts = vm::VmOptions {
            timeout: Duration::from_secs(600 * rounds as u64 + 120),
            ..Default::default()
        };
        vm::run(&img, root, &script, &opts)?.output.swap_remove(0)
    };
    // Split the output by round markers.
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut current: Option<(bool, Vec<String>)> = None;
    let mut flush = |c: Option<(bool, Vec<String>)>| {
        if let Some((is_ours, lines)) = c {
            if is_ours {
                ours.push(parse_ours(&lines));
            } else {
                theirs.push(parse_perftest(&lines, spec.kind));
            }
        }
    };
    for l in out {
        if let Some(rest) = l.strip_prefix("@@") {
            flush(current.take());
            current = Some((rest.starts_with("ours"), Vec::new()));
        } else if let Some((_, v)) = current.as_mut() {
            v.push(l);
        }
    }
    flush(current.take());
    println!();
    println!("{name}: {rounds} alternating rounds, {size} B, {n} iterations (soft-RoCE; ratios only are meaningful)");
    let mut ratios50 = Vec::new();
    let mut ratios99 = Vec::new();
    for (i, (o, p)) in ours.iter().zip(theirs.iter()).enumerate() {
        match (spec.kind, o, p) {
            (Kind::Latency, Some(o), Some(p)) => {
                println!(
                    "  round {}: rocebus p50 {:8.2} us p99 {:9.2} us | {} p50 {:8.2} us p99 {:9.2} us",
                    i + 1,
                    o.p50_us,
                    o.p99_us,
                    spec.perftest,
                    p.p50_us,
                    p.p99_us
                );
                ratios50.push(o.p50_us / p.p50_us);
                ratios99.push(o.p99_us / p.p99_us);
            }
            (Kind::Throughput, Some(o), Some(p)) => {
                println!(
                    "  round {}: rocebus {:10.0} msg/s | {} {:10.0} msg/s",
                    i + 1,
                    o.rate,
                    spec.perftest,
                    p.rate
                );
                ratios50.push(o.rate / p.rate);
            }
            _ => println!(
                "  round {}: missing (rocebus {:?}, perftest {:?})",
                i + 1,
                o.is_some(),
                p.is_some()
            ),
        }
    }
    if ratios50.is_empty() {
        bail!("{name}: no round produced figures on both sides");
    }
    match spec.kind {
        Kind::Latency => println!(
            "{name}: p50 ratio {:.2}, p99 ratio {:.2}",
            median(ratios50),
            median(ratios99)
        ),
        Kind::Throughput => println!("{name}: ratio {:.2}", median(ratios50)),
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
