//! `cargo xtask bench ipc`: rocebus's shared-memory transport against
//! Aeron's `aeron:ipc` on this machine, natively, in alternating rounds of
//! one run: a ping-pong (64-byte messages, round trip) and a one-way stream
//! (messages per second). Aeron C is built from source by the rusteron
//! crates in `bench/aeron` (a workspace of its own, so nothing else ever
//! builds it); its CMake needs cmake >= 3.30, which the set-up's Python
//! environment provides.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    p50: f64,
    p99: f64,
    rate: f64,
}

fn parse(out: &str) -> Option<Figures> {
    let line = out.lines().rev().find(|l| l.starts_with("RESULT "))?;
    let mut f = Figures::default();
    for kv in line.split_whitespace().skip(1) {
        let (k, v) = kv.split_once('=')?;
        let v: f64 = v.parse().ok()?;
        match k {
            "p50_ns" => f.p50 = v,
            "p99_ns" => f.p99 = v,
            "msgs_per_sec" => f.rate = v,
            _ => {}
        }
    }
    Some(f)
}

fn run_one(cmd: &mut Command) -> Option<Figures> {
    let o = cmd.output().ok()?;
    let text = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        eprintln!(
            "  failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        );
        return None;
    }
    parse(&text)
}

/// Builds Aeron's harness; returns it and the folder of Aeron's libraries.
fn build_aeron(root: &Path, target: &Path) -> Result<(PathBuf, PathBuf)> {
    eprintln!(
        "== building Aeron C from source and its harness (bench/aeron; minutes the first time)"
    );
    let venv_bin = crate::setup::cache_dir().join("venv/bin");
    let path = format!(
        "{}:{}",
        venv_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let aeron_target = target.join("aeron");
    let st = Command::new(env!("CARGO"))
        .args(["build", "--release", "--manifest-path"])
        .arg(root.join("bench/aeron/Cargo.toml"))
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", &aeron_target)
        .status()?;
    if !st.success() {
        bail!(
            "building Aeron failed: it needs cmake >= 3.30 (the venv's, from `cargo xtask setup`), \
             a C compiler, uuid-dev and libbsd-dev"
        );
    }
    // Aeron's shared libraries, from the newest build of the driver crate.
    let mut libs: Vec<(std::time::SystemTime, PathBuf)> =
        std::fs::read_dir(aeron_target.join("release/build"))?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("rusteron-media-driver-")
            })
            .map(|e| e.path().join("out/build/lib"))
            .filter_map(|d| {
                let m = std::fs::metadata(d.join("libaeron_driver.so")).ok()?;
                Some((m.modified().ok()?, d))
            })
            .collect();
    libs.sort();
    let lib = libs
        .pop()
        .context("Aeron's build left no libaeron_driver.so")?
        .1;
    Ok((aeron_target.join("release/rocebus-aeron-bench"), lib))
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs the comparison; prints each round and the two ratio lines.
pub fn run(root: &Path, rounds: Option<u32>, iterations: Option<u64>) -> Result<()> {
    let rounds = rounds.unwrap_or(5);
    let n = iterations.unwrap_or(1_000_000);
    let (ours, target) = crate::bench::build_bench(root)?;
    let (aeron, lib) = build_aeron(root, &target)?;
    let cores = "0,1";
    let (mut l50, mut l99, mut tr) = (Vec::new(), Vec::new(), Vec::new());
    let (mut f50, mut f99) = (Vec::new(), Vec::new());
    eprintln!("== ipc: {rounds} alternating rounds, 64-byte messages, {n} round trips / 10x messages, cores {cores}");
    for r in 1..=rounds {
        let ol = run_one(Command::new(&ours).args([
            "ipc-latency",
            "-s",
            "64",
            "-n",
            &n.to_string(),
            "--cores",
            cores,
        ]));
        let al = run_one(
            Command::new(&aeron)
                .args(["latency", &n.to_string(), "64", cores])
                .env("LD_LIBRARY_PATH", &lib),
        );
        // The floor, on the same two cores, right after rocebus's round trips.
        let fl = run_one(Command::new(&ours).args([
            "ipc-floor",
            "-n",
            &n.to_string(),
            "--cores",
            cores,
        ]));
        let m = (n * 10).to_string();
        let ot = run_one(Command::new(&ours).args([
            "ipc-throughput",
            "-s",
            "64",
            "-n",
            &m,
            "--cores",
            cores,
        ]));
        let at = run_one(
            Command::new(&aeron)
                .args(["throughput", &m, "64", cores])
                .env("LD_LIBRARY_PATH", &lib),
        );
        match (ol, al) {
            (Some(o), Some(a)) => {
                println!(
                    "  round {r}: round trip rocebus p50 {:6.0} ns p99 {:7.0} ns | aeron p50 {:6.0} ns p99 {:7.0} ns",
                    o.p50, o.p99, a.p50, a.p99
                );
                l50.push(o.p50 / a.p50);
                l99.push(o.p99 / a.p99);
            }
            _ => println!("  round {r}: latency missing"),
        }
        match (ol, fl) {
            (Some(o), Some(f)) => {
                println!(
                    "  round {r}: floor (bare one-line ping-pong) p50 {:6.0} ns p99 {:7.0} ns: rocebus {:.2} / {:.2} of it",
                    f.p50,
                    f.p99,
                    o.p50 / f.p50,
                    o.p99 / f.p99
                );
                f50.push(o.p50 / f.p50);
                f99.push(o.p99 / f.p99);
            }
            _ => println!("  round {r}: floor missing"),
        }
        match (ot, at) {
            (Some(o), Some(a)) => {
                println!(
                    "  round {r}: stream rocebus {:11.0} msg/s | aeron {:11.0} msg/s",
                    o.rate, a.rate
                );
                tr.push(o.rate / a.rate);
            }
            _ => println!("  round {r}: throughput missing"),
        }
    }
    if l50.is_empty() || tr.is_empty() {
        bail!("no complete round");
    }
    crate::verdict::line(format!(
        "ipc-latency: p50 ratio {:.2}, p99 ratio {:.2}",
        median(l50),
        median(l99)
    ));
    let lowest = tr.iter().copied().fold(f64::INFINITY, f64::min);
    crate::verdict::line(format!(
        "ipc-throughput: ratio {:.2} (lowest round {lowest:.2})",
        median(tr)
    ));
    if !f50.is_empty() {
        crate::verdict::line(format!(
            "ipc-floor: p50 ratio {:.2}, p99 ratio {:.2}",
            median(f50),
            median(f99)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_result_lines_of_both_harnesses() {
        let f = parse("x\nRESULT p50_ns=251 p90_ns=321 p99_ns=471 p999_ns=2987 max_ns=9 count=5\n")
            .unwrap();
        assert_eq!((f.p50, f.p99), (251.0, 471.0));
        assert_eq!(
            parse("RESULT msgs_per_sec=18374082").unwrap().rate,
            18374082.0
        );
        assert!(parse("no result").is_none());
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }
}
