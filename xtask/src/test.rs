//! `cargo xtask test`: host tests, then the RDMA tests in soft-RoCE guests.
//!
//! Convention: every `#[ignore]`d test in the workspace either needs an RDMA
//! device (its ignore reason starts with "rdma"), or is the entry point of a
//! child process that a test starts by re-executing its own binary (its name
//! starts with `child_`, its reason with "child"; run alone it fails, it never
//! passes by returning early). A plain `cargo test` reports both as ignored,
//! never as passed. This runner lists the RDMA ones per test binary and runs
//! exactly those, by name, with `--ignored --exact` in a guest; the `child_`
//! ones run only inside their parents. Tests whose name contains
//! `two_hosts` run in two linked guests, `three_hosts`/`four_hosts` in three
//! or four guests on one emulated switch ([`MULTI_HOST`]; every guest runs
//! the test; it reads `ROCEBUS_GUEST_INDEX` to pick its role), optionally
//! under netem loss given
//! by [`TWO_HOST_NETEM`]. A two-host test during which the link between the
//! guests dropped packets by itself (the host's UDP `RcvbufErrors`/`InErrors`
//! grew) is counted as failed, inconclusive, whatever its own verdict: a loss
//! test would have run at more loss than it says, and one without netem at
//! some.

use crate::{setup, venue, vm};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Guests a test needs, by a substring of its name (none of these: one).
const MULTI_HOST: &[(&str, u8)] = &[("two_hosts", 2), ("three_hosts", 3), ("four_hosts", 4)];

/// How many guests the test `name` runs in.
fn hosts_of(name: &str) -> u8 {
    MULTI_HOST
        .iter()
        .find(|(k, _)| name.contains(k))
        .map_or(1, |(_, n)| *n)
}

/// netem spec for multi-host tests, by a substring of the test name.
const TWO_HOST_NETEM: &[(&str, &str)] = &[
    ("loss1pct", "loss 1%"),
    ("loss10pct", "loss 10%"),
    ("loss30pct", "loss 30%"),
];

/// Whether `name` is the entry point of a test's child process (`child_*`), not a test.
fn is_child_entry(name: &str) -> bool {
    name.rsplit("::")
        .next()
        .is_some_and(|n| n.starts_with("child_"))
}

#[derive(Debug)]
pub(crate) struct TestBin {
    pub(crate) path: PathBuf,
    /// Ignored (RDMA) tests in this binary.
    pub(crate) rdma_tests: Vec<String>,
}

/// Builds the workspace's test binaries and returns those with RDMA tests.
pub(crate) fn rdma_test_binaries(root: &Path) -> Result<Vec<TestBin>> {
    // Some RDMA tests start the workspace's binaries (the demo pipeline):
    // build them all, not only those of the tests' own packages.
    let st = Command::new(env!("CARGO"))
        .args(["build", "--workspace", "--bins"])
        .current_dir(root)
        .status()
        .context("cargo build --workspace --bins")?;
    if !st.success() {
        bail!("building the workspace's binaries failed");
    }
    let out = Command::new(env!("CARGO"))
        .args(["test", "--workspace", "--no-run", "--message-format=json"])
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the test binaries failed");
    }
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else {
            continue;
        };
        let list = Command::new(exe)
            .args(["--list", "--ignored", "--format=terse"])
            .output()
            .with_context(|| format!("listing tests of {exe}"))?;
        let tests: Vec<String> = String::from_utf8_lossy(&list.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .filter(|t| !is_child_entry(t))
            .map(str::to_owned)
            .collect();
        if !tests.is_empty() {
            bins.push(TestBin {
                path: PathBuf::from(exe),
                rdma_tests: tests,
            });
        }
    }
    Ok(bins)
}

/// Sums of libtest's `test result:` lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    passed: u64,
    failed: u64,
    ignored: u64,
}

/// Sums libtest's `test result:` lines.
fn tally(lines: &[String]) -> Tally {
    let mut t = Tally::default();
    for l in lines {
        let Some(rest) = l.trim().strip_prefix("test result: ") else {
            continue;
        };
        for part in rest.split(';') {
            let words: Vec<&str> = part.split_whitespace().collect();
            let count = |w: &str| {
                words
                    .iter()
                    .position(|x| x.trim_end_matches('.') == w)
                    .and_then(|i| words.get(i.wrapping_sub(1)))
                    .and_then(|s| s.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            t.passed += count("passed");
            t.failed += count("failed");
            t.ignored += count("ignored");
        }
    }
    t
}

/// Passed and failed of libtest's `test result:` lines.
fn count_results(lines: &[String]) -> (u64, u64) {
    let t = tally(lines);
    (t.passed, t.failed)
}

fn host_has_rdma() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

/// The orders ring's protocol core checked beyond the plain host tests:
/// its loopback tests (threads racing torn placement, junk in the ring)
/// under valgrind's memcheck, and the loom model of its control words.
/// About two minutes once built; loom builds into its own target dir
/// (`--cfg loom` changes every crate's flags) so the main one is not
/// rebuilt, kept in the cache (see [`setup::cache_dir`]) when none is set.
fn ring_checks(root: &Path) -> Result<()> {
    eprintln!("== ring loopback tests under valgrind memcheck");
    let st = Command::new(env!("CARGO"))
        .args(["test", "-p", "rocebus", "--lib", "--config"])
        .arg("target.'cfg(all())'.runner = ['valgrind', '--error-exitcode=1', '--leak-check=no', '--quiet']")
        .args(["--", "ring::tests"])
        .current_dir(root)
        .status()?;
    if !st.success() {
        bail!("ring loopback tests failed under valgrind memcheck");
    }
    eprintln!("== ring loom model (--cfg loom)");
    // Outside the checkout when no target dir is set, so a fresh clone (CI) reuses the
    // loom build of the dependencies.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|t| PathBuf::from(t).join("loom"))
        .unwrap_or_else(|| setup::cache_dir().join("target-loom"));
    let st = Command::new(env!("CARGO"))
        .args(["test", "-p", "rocebus", "--lib", "loom"])
        .env("RUSTFLAGS", "--cfg loom")
        .env("CARGO_TARGET_DIR", target)
        // A second build of every dependency: keep it small and quick.
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("CARGO_INCREMENTAL", "0")
        .current_dir(root)
        .status()?;
    if !st.success() {
        bail!("ring loom model failed");
    }
    Ok(())
}

/// Seconds each fuzz target runs inside `cargo xtask test` (CI): enough to
/// catch shallow crashes in every decoder of outside bytes, short enough for
/// the CI budget. `cargo xtask fuzz --seconds N` runs longer.
const CI_FUZZ_SECONDS: u64 = 6;

pub fn run(root: &Path, rdma_only: bool, filter: Option<&str>, fuzz: bool) -> Result<()> {
    let t0 = Instant::now();
    // First and cheap: a clone alone must have everything the run reads.
    let outside = crate::self_contained::scan(root)?;
    if !outside.is_empty() {
        for o in &outside {
            eprintln!("{o}");
        }
        bail!(
            "{} reference(s) to paths outside the repository: a fresh clone has nothing \
             beside it; move what they read into the repository",
            outside.len()
        );
    }
    let early = crate::test_lint::scan(root)?;
    if !early.is_empty() {
        bail!(
            "tests that return before checking anything (they would count as passed):\n{}",
            early.join("\n")
        );
    }
    setup::ensure_packages()?;
    venue::ensure_venue()?;
    let envs = [("ROCEBUS_PYTHON", venue::python())];
    if !rdma_only {
        eprintln!("== host tests (cargo test --workspace)");
        host_tests(root, &envs)?;
        eprintln!("== the generated CLI and configuration reference is up to date");
        crate::reference::run(root, true)?;
        // The build above used one libclang; if others are installed, check
        // rdma-sys builds with each (issue 15). Seconds once bindgen is built.
        crate::check_build::host(root, true)?;
        // An engine in its own workspace, depending on rocebus by path with no [patch], builds
        // with libclang 19 (issue 42). About a minute the first time, seconds later.
        crate::check_build::embed(root, &root.join("core"))?;
        ring_checks(root)?;
    }
    if fuzz && !rdma_only && filter.is_none() {
        eprintln!("== fuzzing every decoder of outside bytes ({CI_FUZZ_SECONDS} s per target)");
        crate::fuzz::run(root, CI_FUZZ_SECONDS, None)?;
    }
    let bins = rdma_test_binaries(root)?;
    let matches = |t: &str| filter.is_none_or(|f| t.contains(f));
    let mut one_host = Vec::new();
    let mut two_host = Vec::new();
    for b in &bins {
        for t in b.rdma_tests.iter().filter(|t| matches(t)) {
            if hosts_of(t) > 1 {
                two_host.push((b.path.clone(), t.clone()));
            }
        }
        let names: Vec<String> = b
            .rdma_tests
            .iter()
            .filter(|t| hosts_of(t) == 1 && matches(t))
            .cloned()
            .collect();
        if !names.is_empty() {
            one_host.push((b.path.clone(), names));
        }
    }
    // Each test in its own run of its binary, timed by the guest's uptime, so a slow CI
    // run says which tests took its time (`== took S s: NAME`).
    let mut script = String::from("st=0\n");
    for (exe, names) in &one_host {
        let exe = vm::shell_quote(&exe.display().to_string());
        script.push_str(&format!("echo \"== rdma tests in $(basename {exe})\"\n"));
        for name in names {
            // By exact name: only the tests counted as RDMA tests run, never a child entry.
            script.push_str(&format!(
                "read t0 _ < /proc/uptime\n{exe} --ignored --exact --test-threads=1 {name} || st=1\n\
                 read t1 _ < /proc/uptime\necho \"== took $(awk \"BEGIN {{ print $t1 - $t0 }}\") s: {bare}\"\n",
                name = vm::shell_quote(name),
                bare = name.replace(['"', '$', '`', '\\'], "")
            ));
        }
    }
    script.push_str("exit $st\n");

    let (mut passed, mut failed) = (0u64, 0u64);
    let mut not_run = Vec::new();
    let mut inconclusive = Vec::new();
    let pass_env: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.display().to_string()))
        .collect();
    if host_has_rdma() {
        eprintln!("== this host has an RDMA device: running the RDMA tests natively (no guest)");
        let out = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .envs(pass_env.iter().map(|(k, v)| (k, v)))
            .current_dir(root)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        print!("{text}");
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let (p, f) = count_results(&lines);
        passed += p;
        failed += f;
        if !out.status.success() && f == 0 {
            failed += 1;
        }
        not_run.extend(two_host.iter().map(|(_, t)| t.clone()));
    } else {
        let img = setup::guest_image()?;
        runner_checks(&img, root)?;
        if !one_host.is_empty() {
            eprintln!(
                "== RDMA tests in one soft-RoCE guest ({} binaries)",
                one_host.len()
            );
            let opts = vm::VmOptions {
                timeout: Duration::from_secs(2400),
                env: pass_env.clone(),
                ..Default::default()
            };
            let out = vm::run(&img, root, &script, &opts)?;
            let (p, f) = count_results(&out.output[0]);
            passed += p;
            failed += f;
            if out.status() != 0 && f == 0 {
                eprintln!(
                    "xtask test: the guest run failed (status {}) without a failing test line",
                    out.status()
                );
                failed += 1;
            }
        }
        for (exe, name) in &two_host {
            let netem = TWO_HOST_NETEM
                .iter()
                .find(|(k, _)| name.contains(k))
                .map(|(_, v)| v.to_string());
            let hosts = hosts_of(name);
            eprintln!(
                "== RDMA test {name} in {hosts} soft-RoCE guests{}",
                netem
                    .as_deref()
                    .map(|n| format!(" (netem {n})"))
                    .unwrap_or_default()
            );
            let cmd = format!(
                "{} --ignored --exact {} --test-threads=1",
                vm::shell_quote(&exe.display().to_string()),
                vm::shell_quote(name)
            );
            let opts = vm::VmOptions {
                hosts,
                netem,
                timeout: Duration::from_secs(900),
                env: pass_env.clone(),
                ..Default::default()
            };
            let out = vm::run(&img, root, &cmd, &opts)?;
            if let Some(why) = out.link.as_ref().and_then(vm::LinkDrops::inconclusive) {
                eprintln!("xtask test: {name}: {why}");
                inconclusive.push(name.clone());
                failed += 1;
                continue;
            }
            // One test, run by both guests: it passed only if it passed in
            // both (guest 0's "1 passed" says nothing about guest 1's side).
            let (p, f) = out
                .output
                .iter()
                .map(|o| count_results(o))
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            if f == 0 && out.status() == 0 && p > 0 {
                passed += 1;
            } else {
                eprintln!(
                    "xtask test: {name} failed in a guest (status {})",
                    out.status()
                );
                failed += 1;
            }
        }
    }
    eprintln!("xtask test: took {:.0} s", t0.elapsed().as_secs_f64());
    if !not_run.is_empty() {
        println!(
            "softroce: not run (need several guests): {}",
            not_run.join(", ")
        );
    }
    if !inconclusive.is_empty() {
        println!(
            "softroce: inconclusive, counted as failed (the link between the guests dropped \
             packets by itself; rerun on a quieter host): {}",
            inconclusive.join(", ")
        );
    }
    println!("softroce: {passed} passed, {failed} failed");
    if passed == 0 {
        bail!("no RDMA test ran");
    }
    if failed != 0 {
        bail!("{failed} RDMA test(s) failed");
    }
    Ok(())
}

/// `cargo test --workspace`, its output passed through, then one line with the sums: how
/// many tests ran and passed, and how many were ignored (RDMA tests, which the guests run
/// below, and child-process entry points, which their tests run).
fn host_tests(root: &Path, envs: &[(&str, PathBuf)]) -> Result<()> {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO"))
        .args(["test", "--workspace"])
        .envs(envs.iter().map(|(k, v)| (k, v.as_os_str())))
        .current_dir(root)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cargo test --workspace")?;
    let mut lines = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in std::io::BufReader::new(out).lines() {
            let line = line.context("reading cargo test's output")?;
            println!("{line}");
            if line.trim_start().starts_with("test result: ") {
                lines.push(line);
            }
        }
    }
    let st = child.wait()?;
    let t = tally(&lines);
    println!(
        "host tests: {} passed, {} failed, {} ignored (RDMA tests for the guests, and child \
         processes run by their tests)",
        t.passed, t.failed, t.ignored
    );
    if !st.success() {
        bail!("host tests failed");
    }
    if t.passed == 0 {
        bail!("no host test ran");
    }
    Ok(())
}

/// The runner's own promises, checked for real before anything relies on
/// them: a failing guest command fails the run with its status, and a guest
/// that never finishes is ended by the timeout.
fn runner_checks(img: &setup::GuestImage, root: &Path) -> Result<()> {
    let quiet = |timeout| vm::VmOptions {
        timeout: Duration::from_secs(timeout),
        stream: false,
        ..Default::default()
    };
    let out = vm::run(img, root, "echo runner-check; exit 7", &quiet(120))?;
    if out.status() != 7 || !out.output[0].iter().any(|l| l == "runner-check") {
        bail!(
            "runner check: a guest command exiting 7 gave status {}",
            out.status()
        );
    }
    let t = Instant::now();
    let out = vm::run(img, root, "sleep 100000", &quiet(20))?;
    if out.status() != 124 || t.elapsed() > Duration::from_secs(40) {
        bail!(
            "runner check: a hung guest was not ended by the timeout (status {})",
            out.status()
        );
    }
    eprintln!("== runner checks passed: failing command -> status 7, hung guest killed after 20 s");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_libtest_summaries() {
        let lines: Vec<String> = [
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 5 filtered out; finished in 0.01s",
            "noise",
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(count_results(&lines), (5, 1));
        assert_eq!(
            tally(&lines),
            Tally {
                passed: 5,
                failed: 1,
                ignored: 1
            }
        );
    }

    #[test]
    fn child_entry_points_are_not_rdma_tests() {
        assert!(is_child_entry("child_kill9"));
        assert!(is_child_entry("tests::child_publisher"));
        assert!(!is_child_entry("rdma_child_count"));
        assert!(!is_child_entry("rc_live_two_hosts_frozen_engine"));
    }

    #[test]
    fn test_names_say_how_many_guests() {
        assert_eq!(hosts_of("rdma_md_one_guest_in_order"), 1);
        assert_eq!(hosts_of("rdma_md_two_hosts_loss1pct_x"), 2);
        assert_eq!(hosts_of("rdma_md_three_hosts_repair"), 3);
        assert_eq!(hosts_of("rdma_four_hosts"), 4);
    }

    #[test]
    fn quotes_for_sh() {
        assert_eq!(vm::shell_quote("abc/def"), "abc/def");
        assert_eq!(vm::shell_quote("it's"), r"'it'\''s'");
        assert_eq!(vm::shell_quote(""), "''");
    }
}
