//! `cargo xtask bench books`: feed-handler's decode + full-depth books against itch-book's
//! parse + book pass (PyPI `itch-book`, C++ core, run from the project venv's Python), in
//! alternating rounds on the host, over the same generated day.
//!
//! Each side runs as its own process and times its own pass from opening the file to the
//! last message (`RESULT msgs_per_sec=...`), so Python's start-up and imports are not
//! charged to itch-book's rate; this harness measures each process from outside too: wall
//! time, CPU time and peak RSS from `wait4`'s rusage. Peak RSS is the whole process's, so
//! itch-book's includes the interpreter and numpy (printed once, measured alone, for
//! reference). Both sides read the capture in 8 MiB chunks. Ours counts top-of-book changes
//! in its callback; itch-book is asked for no table, which also switches its top-of-book
//! tracking off, so ours does a little more work per message.

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The generated day: seed, messages, symbols.
const SEED: u64 = 1;
const DEFAULT_MESSAGES: u64 = 5_000_000;
const SYMBOLS: u16 = 500;

/// What the outside saw of one process.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Usage {
    wall_secs: f64,
    cpu_secs: f64,
    max_rss_kib: i64,
}

/// One side's round: its own figures for the pass and the outside view of the process.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Run {
    result: Pass,
    usage: Usage,
}

/// What a side's `RESULT` line says about its pass.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pass {
    /// Messages over the pass's wall time.
    rate: f64,
    messages: u64,
    /// The pass thread's CPU time (`/proc/thread-self/schedstat`).
    cpu_secs: f64,
}

/// Runs `cmd` to completion, its stdout captured (stderr passed through), and reaps it with
/// `wait4` to get its resource usage.
fn measure(cmd: &mut Command) -> Result<(String, Usage)> {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    let mut out = String::new();
    child
        .stdout
        .take()
        .context("child stdout")?
        .read_to_string(&mut out)?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: all-zero bytes are a valid `rusage` (plain integers and timevals).
    #[allow(unsafe_code)]
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet reaped (std's `Child` only reaps in `wait`,
    // which is never called on it); `status` and `ru` are valid for writes.
    #[allow(unsafe_code)]
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall_secs = start.elapsed().as_secs_f64();
    if r != pid {
        bail!("wait4 on {cmd:?}: {}", std::io::Error::last_os_error());
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!("{cmd:?} failed (wait status {status:#x}); its stdout:\n{out}");
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        out,
        Usage {
            wall_secs,
            cpu_secs: tv(ru.ru_utime) + tv(ru.ru_stime),
            // Linux reports ru_maxrss in KiB.
            max_rss_kib: ru.ru_maxrss,
        },
    ))
}

/// The `RESULT key=value ...` line both sides print.
fn parse_result(out: &str) -> Option<Pass> {
    let line = out.lines().rev().find(|l| l.starts_with("RESULT "))?;
    let (mut rate, mut messages, mut cpu_secs) = (None, None, None);
    for kv in line.split_whitespace().skip(1) {
        match kv.split_once('=')? {
            ("msgs_per_sec", v) => rate = v.parse().ok(),
            ("messages", v) => messages = v.parse().ok(),
            ("cpu_secs", v) => cpu_secs = v.parse().ok(),
            _ => {}
        }
    }
    Some(Pass {
        rate: rate?,
        messages: messages?,
        cpu_secs: cpu_secs?,
    })
}

fn run_side(cmd: &mut Command) -> Result<Run> {
    let (out, usage) = measure(cmd)?;
    let result = parse_result(&out)
        .with_context(|| format!("{cmd:?} printed no complete RESULT line:\n{out}"))?;
    Ok(Run { result, usage })
}

/// The day under the target directory, generated once per size (written aside and renamed,
/// so an interrupted run leaves no half file to reuse).
fn day(feed_handler: &Path, target: &Path, messages: u64) -> Result<PathBuf> {
    let dir = target.join("books-bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(format!("day-seed{SEED}-{messages}-{SYMBOLS}.itch50"));
    if path.exists() {
        eprintln!("== reusing {}", path.display());
        return Ok(path);
    }
    eprintln!("== generating {messages} messages, {SYMBOLS} symbols");
    let tmp = path.with_extension("part");
    crate::setup::run(
        Command::new(feed_handler)
            .args(["generate", "--seed", &SEED.to_string()])
            .args(["--messages", &messages.to_string()])
            .args(["--symbols", &SYMBOLS.to_string(), "-o"])
            .arg(&tmp),
    )?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn mib(kib: i64) -> f64 {
    kib as f64 / 1024.0
}

/// `cargo xtask bench books [--rounds N] [-n MESSAGES]`.
pub fn run(root: &Path, rounds: Option<u32>, messages: Option<u64>) -> Result<()> {
    let rounds = rounds.unwrap_or(5).max(1);
    let messages = messages.unwrap_or(DEFAULT_MESSAGES);
    crate::venue::ensure_venue()?;
    let python = crate::venue::python();
    eprintln!("== building feed-handler (release)");
    crate::setup::run(
        Command::new(env!("CARGO"))
            .args(["build", "--release", "-p", "feed-handler"])
            .current_dir(root),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let target = target.canonicalize()?;
    let exe = target.join("release/feed-handler");
    let day = day(&exe, &target, messages)?;
    let script = root.join("feed-handler/crosscheck/itch_book_run.py");

    let ours = || {
        let mut c = Command::new(&exe);
        c.arg("throughput").arg(&day);
        c
    };
    let theirs = || {
        let mut c = Command::new(&python);
        c.arg(&script).arg("bench").arg(&day);
        c
    };
    let (_, baseline) = measure(Command::new(&python).args(["-c", "import itch_book._core"]))
        .context("the venv's python cannot import itch_book: run `cargo xtask setup`")?;

    let mut rate_ratios = Vec::new();
    let mut cpu_ratios = Vec::new();
    let mut rss_ratios = Vec::new();
    for r in 1..=rounds {
        // Alternate which side goes first, so a drift in the machine's load favours neither.
        let (o, t) = if r % 2 == 1 {
            let o = run_side(&mut ours())?;
            (o, run_side(&mut theirs())?)
        } else {
            let t = run_side(&mut theirs())?;
            (run_side(&mut ours())?, t)
        };
        if o.result.messages != t.result.messages {
            bail!(
                "the two sides read different numbers of messages ({} and {})",
                o.result.messages,
                t.result.messages
            );
        }
        let side = |x: &Run| {
            format!(
                "{:>9.0} msg/s ({:>9.0} per CPU s), process wall {:5.2} s, CPU {:5.2} s, peak RSS {:6.1} MiB",
                x.result.rate,
                x.result.messages as f64 / x.result.cpu_secs,
                x.usage.wall_secs,
                x.usage.cpu_secs,
                mib(x.usage.max_rss_kib)
            )
        };
        println!("  round {r}: feed-handler {}", side(&o));
        println!("           itch-book    {}", side(&t));
        rate_ratios.push(o.result.rate / t.result.rate);
        cpu_ratios.push(t.result.cpu_secs / o.result.cpu_secs);
        rss_ratios.push(o.usage.max_rss_kib as f64 / t.usage.max_rss_kib as f64);
    }
    println!();
    println!(
        "books: {rounds} alternating rounds over {} ({messages} messages, {SYMBOLS} symbols); \
         python + `import itch_book` alone: peak RSS {:.1} MiB",
        day.display(),
        mib(baseline.max_rss_kib)
    );
    println!(
        "books-cpu: ratio {:.2} (messages per CPU second of the pass, ours over itch-book's: \
         for reference, steadier than wall time on a loaded host)",
        median(cpu_ratios)
    );
    crate::verdict::line(format!("books: ratio {:.2}", median(rate_ratios)));
    crate::verdict::line(format!("books-memory: ratio {:.2}", median(rss_ratios)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_sides_result_lines() {
        assert_eq!(
            parse_result(
                "noise\nRESULT msgs_per_sec=583519.3 messages=5000000 bbo_changes=279655 secs=8.5 cpu_secs=3.25\n"
            ),
            Some(Pass {
                rate: 583519.3,
                messages: 5_000_000,
                cpu_secs: 3.25
            })
        );
        assert_eq!(
            parse_result("RESULT msgs_per_sec=503506.8 messages=5000000 secs=9.9 cpu_secs=4"),
            Some(Pass {
                rate: 503506.8,
                messages: 5_000_000,
                cpu_secs: 4.0
            })
        );
        assert_eq!(parse_result("RESULT msgs_per_sec=1 messages=2"), None);
        assert_eq!(parse_result("nothing"), None);
    }

    #[test]
    fn measures_a_child_from_outside() {
        // A child that touches 64 MiB: its peak RSS must show it, its failure must fail.
        let (out, u) = measure(Command::new("python3").args([
            "-c",
            "b = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('RESULT msgs_per_sec=1 messages=2 cpu_secs=3')",
        ]))
        .unwrap();
        assert_eq!(
            parse_result(&out),
            Some(Pass {
                rate: 1.0,
                messages: 2,
                cpu_secs: 3.0
            })
        );
        assert!(u.max_rss_kib > 64 * 1024, "{u:?}");
        assert!(u.wall_secs > 0.0 && u.cpu_secs > 0.0, "{u:?}");
        assert!(measure(Command::new("sh").args(["-c", "exit 3"])).is_err());
    }
}
