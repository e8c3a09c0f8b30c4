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

/// One instruction count: a rocebus ping-pong client against perftest's,
/// both under callgrind in the same guest. `rc-instructions` and
/// `md-instructions` differ only in these.
pub(crate) struct Counted {
    /// The benchmark's name, which starts its printed lines.
    pub name: &'static str,
    /// rocebus-bench's echo, started natively before each client run and
    /// ready when its output says `listening`; empty when the client starts
    /// its own echo process (md-ping does, as md-latency does).
    pub ours_echo: &'static str,
    /// rocebus-bench's client (takes `-s SIZE -n ROUND_TRIPS`).
    pub ours_client: &'static str,
    /// perftest's tool, its arguments on both sides, and those of its
    /// server and its client alone.
    pub perftest: &'static str,
    pub perftest_extra: &'static str,
    pub perftest_server: &'static str,
    pub perftest_client: &'static str,
    /// Multicast groups held joined at the IP level while perftest runs
    /// (`rocebus-bench with-groups`, as md-latency does); empty for none.
    pub ip_groups: &'static str,
    /// `callgrind-account --parts` for rocebus's side.
    pub parts: &'static str,
    /// The goal: rocebus at most this many times perftest's instructions.
    pub goal: f64,
}

/// `rc-instructions`.
pub(crate) const RC: Counted = Counted {
    name: "rc-instructions",
    ours_echo: "rc-pong",
    ours_client: "rc-ping",
    perftest: "ib_write_lat",
    perftest_extra: "",
    perftest_server: "",
    perftest_client: "",
    ip_groups: "",
    parts: "orders",
    goal: 1.25,
};

/// The guest's shell script: three runs of each client, alternating, then
/// the accounting of both.
/// `client_extra`: arguments for rocebus's client (e.g. `--datagram-tag`).
fn script(c: &Counted, exe: &str, size: usize, n: u64, client_extra: &str) -> String {
    let n2 = 2 * n;
    let echo = if c.ours_echo.is_empty() {
        String::new()
    } else {
        format!(
            "  timeout 2400 $exe {} -s {size} >$out/pong-$1.txt 2>&1 &\n  \
             for t in $(seq 1 300); do grep -q listening $out/pong-$1.txt && break; sleep 0.2; done\n",
            c.ours_echo
        )
    };
    let wrap = if c.ip_groups.is_empty() {
        String::new()
    } else {
        format!("$exe with-groups --groups {} -- ", c.ip_groups)
    };
    let (tool, extra) = (c.perftest, c.perftest_extra);
    let (server, client) = (c.perftest_server, c.perftest_client);
    // perftest's runs are a script of their own, so that `with-groups` can
    // hold the groups joined around both of its sides.
    let mut s = format!(
        r#"dev=${{ROCEBUS_RDMA_DEVICE:-rxe0}}; gid=${{ROCEBUS_GID_INDEX:-1}}; addr=${{ROCEBUS_GUEST_ADDR:?}}
out=${{ROCEBUS_OUT:-$(mktemp -d)}}
exe={exe}
if ! command -v valgrind >/dev/null; then echo '@@error valgrind is not installed'; exit 1; fi
cg="valgrind --tool=callgrind --dump-instr=yes --toggle-collect=qsort --collect-atstart=yes"
export dev gid addr out exe cg
ours() {{
{echo}  ok=1
  timeout 1800 $cg $3 --callgrind-out-file=$out/rocebus-$1.cg $exe {ours} -s {size} -n $2{extra_ours} >$out/ping-$1.txt 2>$out/ping-$1.log && ok=0
  wait
  echo "@@run rocebus $1 $ok"; cat $out/ping-$1.txt; grep -h 'Collected' $out/ping-$1.log
}}
cat >$out/theirs.sh <<'EOF'
timeout 2400 {tool} -d $dev -x $gid -s {size} -n $2 -F {extra} {server} >$out/pt-server-$1.txt 2>&1 &
ok=1
for t in 1 2 3 4 5; do
  sleep 2
  if timeout 1800 $cg $3 --callgrind-out-file=$out/perftest-$1.cg {tool} -d $dev -x $gid -s {size} -n $2 -F {extra} {client} $addr >$out/pt-client-$1.txt 2>$out/pt-client-$1.log; then ok=0; break; fi
done
wait
echo "@@run perftest $1 $ok"; grep -h 'Collected' $out/pt-client-$1.log
EOF
theirs() {{
  {wrap}sh $out/theirs.sh "$1" "$2" "$3"
}}
"#,
        ours = c.ours_client,
        extra_ours = if client_extra.is_empty() {
            String::new()
        } else {
            format!(" {client_extra}")
        }
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
    for (label, flags) in [
        ("rocebus", format!("--parts {}", c.parts)),
        ("perftest", String::new()),
    ] {
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
fn figure_line(name: &str, ours: f64, theirs: f64) -> String {
    format!("{name}: rocebus {ours:.0}, perftest {theirs:.0} per one-way message")
}

/// Runs `c` in one guest and prints its figures: rocebus's instructions
/// per one-way message by part, perftest's by object, and the closing line.
/// `extra`: arguments for rocebus's client, printed in the closing line.
pub(crate) fn run(
    c: &Counted,
    root: &Path,
    size: usize,
    iterations: Option<u64>,
    extra: &str,
) -> Result<()> {
    let name = c.name;
    let (exe, _) = bench::build_bench(root)?;
    let n = iterations.unwrap_or(DEFAULT_ROUND_TRIPS).max(1);
    let script = script(
        c,
        &vm::shell_quote(&exe.display().to_string()),
        size,
        n,
        extra,
    );
    let lines = bench::run_script(root, &script, Duration::from_secs(4 * 3600))?;
    let failed: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("@@error") || (l.starts_with("@@run ") && l.ends_with(" 1")))
        .collect();
    if !failed.is_empty() {
        bail!(
            "{name}: runs failed in the guest ({}); their logs are in the guest's \
             output folder (ROCEBUS_OUT)",
            failed
                .iter()
                .map(|l| l.trim_start_matches('@'))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let (Some(ours), Some(theirs)) = (result(&lines, "rocebus"), result(&lines, "perftest")) else {
        bail!("{name}: the accounting printed no RESULT line for both sides");
    };
    println!();
    println!(
        "{name}: {size} B, {n} and {} round trips under callgrind, user space only, \
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
    let name = if extra.is_empty() {
        name.to_owned()
    } else {
        format!("{name} {extra}")
    };
    crate::verdict::line(format!(
        "{name}: ratio {:.2} (goal <= {})",
        ours / theirs.max(1e-9),
        c.goal
    ));
    crate::verdict::line(figure_line(&name, ours, theirs));
    Ok(())
}

/// The goal of `rc-instructions --api c`: the C harness's client at most
/// this many times the Rust one's instructions (issue 45's latency goal).
pub const C_API_GOAL: f64 = 1.03;

/// `rc-instructions --api c`'s guest script: the Rust client (`rc-ping`)
/// and the C one (`rc_latency --ping`, the same loop through the C API),
/// each under callgrind against a native `rc-pong`, in three runs each
/// (N, 2N, 2N slowed), alternating; then the accounting of both.
fn c_api_script(exe: &str, c_exe: &str, size: usize, n: u64) -> String {
    let mut s = format!(
        r#"addr=${{ROCEBUS_GUEST_ADDR:?}}
out=${{ROCEBUS_OUT:-$(mktemp -d)}}
exe={exe}
cexe={c_exe}
if ! command -v valgrind >/dev/null; then echo '@@error valgrind is not installed'; exit 1; fi
cg="valgrind --tool=callgrind --dump-instr=yes"
client() {{
  timeout 2400 $exe rc-pong -s {size} >$out/pong-$1-$2.txt 2>&1 &
  for t in $(seq 1 300); do grep -q listening $out/pong-$1-$2.txt && break; sleep 0.2; done
  if [ $1 = rust ]; then cmd="$exe rc-ping -s {size} -n $3"; else cmd="$cexe --ping $addr:7510 -s {size} -n $3"; fi
  ok=1
  timeout 1800 $cg $4 --callgrind-out-file=$out/$1-$2.cg $cmd >$out/ping-$1-$2.txt 2>$out/ping-$1-$2.log && ok=0
  wait
  echo "@@run $1 $2 $ok"; cat $out/ping-$1-$2.txt; grep -h 'Collected' $out/ping-$1-$2.log
}}
"#
    );
    for (name, count, extra) in [
        ("short", n, ""),
        ("long", 2 * n, ""),
        ("slow", 2 * n, "--cache-sim=yes --branch-sim=yes"),
    ] {
        for side in ["rust", "c"] {
            s.push_str(&format!("client {side} {name} {count} '{extra}'\n"));
        }
    }
    for side in ["rust", "c"] {
        s.push_str(&format!(
            "$exe callgrind-account --label {side} -n {n} --short $out/{side}-short.cg \
             --long $out/{side}-long.cg --slow $out/{side}-slow.cg --parts orders --top 30\n"
        ));
    }
    s
}

/// `cargo xtask bench rc-instructions --api c`: instructions per round
/// trip of the C harness's client against the Rust harness's, counted as
/// `rc-instructions` counts them (see the module's documentation), in one
/// guest; prints both breakdowns, the ratio and the closing line.
pub(crate) fn run_c_api(root: &Path, size: usize, iterations: Option<u64>) -> Result<()> {
    let name = "rc-instructions --api c";
    let (exe, target) = bench::build_bench(root)?;
    let c_exe = bench::build_c_harness(root, &target)?;
    let n = iterations.unwrap_or(DEFAULT_ROUND_TRIPS).max(1);
    let script = c_api_script(
        &vm::shell_quote(&exe.display().to_string()),
        &vm::shell_quote(&c_exe.display().to_string()),
        size,
        n,
    );
    let lines = bench::run_script(root, &script, Duration::from_secs(4 * 3600))?;
    let failed: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("@@error") || (l.starts_with("@@run ") && l.ends_with(" 1")))
        .collect();
    if !failed.is_empty() {
        bail!(
            "{name}: runs failed in the guest ({}); their logs are in the guest's output \
             folder (ROCEBUS_OUT)",
            failed
                .iter()
                .map(|l| l.trim_start_matches('@'))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let (Some(c), Some(rust)) = (result(&lines, "c"), result(&lines, "rust")) else {
        bail!("{name}: the accounting printed no RESULT line for both sides");
    };
    println!();
    println!(
        "{name}: {size} B, {n} and {} round trips under callgrind, user space only, \
         set-up and waiting excluded; the C client (bench/c/rc_latency.c --ping) and the \
         Rust one (rocebus-bench rc-ping) against the same echo",
        2 * n
    );
    for l in &lines {
        if ["rust ", "rust: ", "c ", "c: "]
            .iter()
            .any(|p| l.starts_with(p))
        {
            println!("  {l}");
        }
    }
    crate::verdict::line(format!(
        "{name}: ratio {:.3} (goal <= {C_API_GOAL})",
        c / rust.max(1e-9)
    ));
    crate::verdict::line(format!(
        "{name}: C API {c:.0}, Rust {rust:.0} per one-way message"
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_api_script_alternates_both_clients_against_one_echo_and_accounts_both() {
        let s = c_api_script("/x/rocebus-bench", "/x/rc-latency-c", 64, 1000);
        for (name, n) in [("short", 1000), ("long", 2000), ("slow", 2000)] {
            assert!(s.contains(&format!("client rust {name} {n} ")), "{s}");
            assert!(s.contains(&format!("client c {name} {n} ")), "{s}");
        }
        assert!(s.contains("$exe rc-pong -s 64 "), "{s}");
        assert!(s.contains("$exe rc-ping -s 64 -n $3"), "{s}");
        assert!(s.contains("$cexe --ping $addr:7510 -s 64 -n $3"), "{s}");
        assert!(s.contains("--label rust -n 1000 "), "{s}");
        assert!(s.contains("--label c -n 1000 "), "{s}");
        assert!(s.contains("--parts orders"), "{s}");
    }

    #[test]
    fn script_runs_three_sizes_of_each_client_and_accounts_both() {
        let s = script(&RC, "/x/rocebus-bench", 64, 1000, "");
        for (name, n) in [("short", 1000), ("long", 2000), ("slow", 2000)] {
            assert!(s.contains(&format!("ours {name} {n} ")), "{s}");
            assert!(s.contains(&format!("theirs {name} {n} ")), "{s}");
        }
        assert!(s.contains("'--cache-sim=yes --branch-sim=yes'"));
        assert!(s.contains("--label rocebus -n 1000 "));
        assert!(s.contains("--label perftest -n 1000 "));
        assert!(s.contains("--dump-instr=yes"));
        assert!(s.contains("$out/rocebus-$1.cg"));
        assert!(s.contains("$exe rc-pong -s 64 "));
        assert!(s.contains("$exe rc-ping -s 64 -n $2 "));
        assert!(s.contains("--parts orders"));
        assert!(s.contains("ib_write_lat -d $dev -x $gid -s 64 -n $2 -F"));
        assert!(s.contains("\n  sh $out/theirs.sh "), "{s}");
    }

    #[test]
    fn md_script_starts_no_echo_and_wraps_perftest_in_the_groups() {
        let s = script(
            &crate::md_instructions::MD,
            "/x/rocebus-bench",
            64,
            1000,
            "",
        );
        assert!(!s.contains("listening"), "{s}");
        assert!(s.contains("$exe md-ping -s 64 -n $2 >"));
        let tagged = script(
            &crate::md_instructions::MD,
            "/x/rocebus-bench",
            64,
            1000,
            "--datagram-tag",
        );
        assert!(tagged.contains("$exe md-ping -s 64 -n $2 --datagram-tag >"));
        assert!(s.contains("--parts md"));
        assert!(s.contains("ib_send_lat -d $dev -x $gid -s 64 -n $2 -F -c UD -g -M "));
        assert!(s.contains("$exe with-groups --groups 239.9.4.1,239.9.4.2 -- sh $out/theirs.sh"));
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
            figure_line("rc-instructions", 612.4, 401.0),
            "rc-instructions: rocebus 612, perftest 401 per one-way message"
        );
    }
}
