//! `cargo xtask bench rc-instructions`: user-space instructions per one-way
//! message of the orders path against `ib_write_lat`, counted by callgrind
//! in one soft-RoCE guest (or natively on a host with an RDMA device), a
//! figure that does not depend on how busy the machine is.
//!
//! Both are ping-pongs of two processes over rxe's loopback: the client
//! (`rocebus-bench rc-ping`, `ib_write_lat ADDR`) runs under
//! `valgrind --tool=callgrind --dump-instr=yes`, the echo (`rocebus-bench
//! rc-pong`, `ib_write_lat`'s server) natively. Each client runs three
//! times: N round trips, 2N, and 2N again with callgrind's cache and
//! branch simulation on (several times slower, same instructions).
//! `rocebus-bench callgrind-account` then takes the instructions per round
//! trip from the difference of the N and 2N runs (set-up and teardown
//! cancel out) and counts each wait loop as one check per wait: a loop's
//! instructions are the ones whose counts differ between the two 2N runs
//! (see bench/src/callgrind.rs). Valgrind runs a process's threads one at a
//! time, so each side is its own process, as perftest's are.
//!
//! A round trip of the client is one message sent and one received: both
//! ends of one one-way message, which is what the figure is "per". qsort
//! (perftest sorts its samples after the loop, N log N) is left out of the
//! count with `--toggle-collect=qsort` on both sides.

use crate::{bench, vm};
use anyhow::{bail, Result};
use std::path::Path;
use std::time::Duration;

/// Round trips of the short run (the long runs make twice as many).
pub const DEFAULT_ROUND_TRIPS: u64 = 5000;

/// The goal: rocebus at most this many times perftest's instructions.
const GOAL: f64 = 1.25;

/// The guest's shell script: three runs of each client, alternating, then
/// the accounting of both.
fn script(exe: &str, size: usize, n: u64) -> String {
    let n2 = 2 * n;
    let mut s = format!(
        r#"dev=${{ROCEBUS_RDMA_DEVICE:-rxe0}}; gid=${{ROCEBUS_GID_INDEX:-1}}; addr=${{ROCEBUS_GUEST_ADDR:?}}
out=${{ROCEBUS_OUT:-$(mktemp -d)}}
exe={exe}
if ! command -v valgrind >/dev/null; then echo '@@error valgrind is not installed'; exit 1; fi
cg="valgrind --tool=callgrind --dump-instr=yes --toggle-collect=qsort --collect-atstart=yes"
ours() {{
  timeout 2400 $exe rc-pong -s {size} >$out/pong-$1.txt 2>&1 &
  for t in $(seq 1 300); do grep -q listening $out/pong-$1.txt && break; sleep 0.2; done
  ok=1
  timeout 1800 $cg $3 --callgrind-out-file=$out/rocebus-$1.cg $exe rc-ping -s {size} -n $2 >$out/ping-$1.txt 2>$out/ping-$1.log && ok=0
  wait
  echo "@@run rocebus $1 $ok"; cat $out/ping-$1.txt; grep -h 'Collected' $out/ping-$1.log
}}
theirs() {{
  timeout 2400 ib_write_lat -d $dev -x $gid -s {size} -n $2 -F >$out/pt-server-$1.txt 2>&1 &
  ok=1
  for t in 1 2 3 4 5; do
    sleep 2
    if timeout 1800 $cg $3 --callgrind-out-file=$out/perftest-$1.cg ib_write_lat -d $dev -x $gid -s {size} -n $2 -F $addr >$out/pt-client-$1.txt 2>$out/pt-client-$1.log; then ok=0; break; fi
  done
  wait
  echo "@@run perftest $1 $ok"; grep -h 'Collected' $out/pt-client-$1.log
}}
"#
    );
    for (name, count, extra) in [
        ("short", n, ""),
        ("long", n2, ""),
        ("slow", n2, "--cache-sim=yes --branch-sim=yes"),
    ] {
        s.push_str(&format!(
            "ours {name} {count} '{extra}'\ntheirs {name} {count} '{extra}'\n"
        ));
    }
    for (label, flags) in [("rocebus", "--orders-parts"), ("perftest", "")] {
        s.push_str(&format!(
            "$exe callgrind-account --label {label} -n {n} --short $out/{label}-short.cg --long $out/{label}-long.cg --slow $out/{label}-slow.cg {flags}\n"
        ));
    }
    s
}

/// `RESULT label=LABEL instructions=X ...` → X.
fn result(lines: &[String], label: &str) -> Option<f64> {
    let head = format!("RESULT label={label} ");
    lines.iter().rev().find_map(|l| {
        l.trim_start()
            .strip_prefix(&head)?
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("instructions="))?
            .parse()
            .ok()
    })
}

/// The closing line.
fn figure_line(ours: f64, theirs: f64) -> String {
    format!("rc-instructions: rocebus {ours:.0}, perftest {theirs:.0} per one-way message")
}

pub fn run(root: &Path, size: usize, iterations: Option<u64>) -> Result<()> {
    let (exe, _) = bench::build_bench(root)?;
    let n = iterations.unwrap_or(DEFAULT_ROUND_TRIPS).max(1);
    let script = script(&vm::shell_quote(&exe.display().to_string()), size, n);
    let lines = bench::run_script(root, &script, Duration::from_secs(4 * 3600))?;
    let failed: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("@@error") || (l.starts_with("@@run ") && l.ends_with(" 1")))
        .collect();
    if !failed.is_empty() {
        bail!(
            "rc-instructions: runs failed in the guest ({}); their logs are in the guest's \
             output folder (ROCEBUS_OUT)",
            failed
                .iter()
                .map(|l| l.trim_start_matches('@'))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let (Some(ours), Some(theirs)) = (result(&lines, "rocebus"), result(&lines, "perftest")) else {
        bail!("rc-instructions: the accounting printed no RESULT line for both sides");
    };
    println!();
    println!(
        "rc-instructions: {size} B, {n} and {} round trips under callgrind, user space only, \
         set-up and waiting excluded (see the README)",
        2 * n
    );
    for l in &lines {
        if l.starts_with("rocebus part ")
            || l.starts_with("rocebus: ")
            || l.starts_with("perftest: ")
        {
            println!("  {l}");
        }
    }
    println!(
        "rc-instructions: ratio {:.2} (goal <= {GOAL})",
        ours / theirs.max(1e-9)
    );
    println!("{}", figure_line(ours, theirs));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_runs_three_sizes_of_each_client_and_accounts_both() {
        let s = script("/x/rocebus-bench", 64, 1000);
        for (name, n) in [("short", 1000), ("long", 2000), ("slow", 2000)] {
            assert!(s.contains(&format!("ours {name} {n} ")), "{s}");
            assert!(s.contains(&format!("theirs {name} {n} ")), "{s}");
        }
        assert!(s.contains("'--cache-sim=yes --branch-sim=yes'"));
        assert!(s.contains("--label rocebus -n 1000 "));
        assert!(s.contains("--label perftest -n 1000 "));
        assert!(s.contains("--dump-instr=yes"));
        assert!(s.contains("$out/rocebus-$1.cg"));
    }

    #[test]
    fn reads_result_lines() {
        let lines: Vec<String> = [
            "noise",
            "RESULT label=rocebus instructions=612.4 waiting=10.0 wait_loops=2 noise=0.00",
            "RESULT label=perftest instructions=401.0 waiting=3.0 wait_loops=2 noise=0.00",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(result(&lines, "rocebus"), Some(612.4));
        assert_eq!(result(&lines, "perftest"), Some(401.0));
        assert_eq!(result(&lines, "other"), None);
        assert_eq!(
            figure_line(612.4, 401.0),
            "rc-instructions: rocebus 612, perftest 401 per one-way message"
        );
    }
}
