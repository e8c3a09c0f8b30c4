//! `cargo xtask fuzz`: every cargo-fuzz target of the workspace, each for a bounded time.
//!
//! Fuzz crates are found as `*/fuzz/Cargo.toml` with `cargo-fuzz = true` and their targets
//! listed by `cargo fuzz list`, so a new target runs in CI without touching this file.
//! Each target starts from a seed corpus written here (messages cut from the shared ITCH
//! samples, hand-built MoldUDP64, FIX and rocebus frames) plus what earlier local runs found
//! (kept under `target/fuzz/corpus/`).
//!
//! The machines have one stable toolchain. cargo-fuzz passes nightly-only flags
//! (`-Zsanitizer=address`, sanitizer coverage), which stable rustc accepts with
//! `RUSTC_BOOTSTRAP=1`; only the fuzz builds get it, never the workspace's own build.

use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime};

/// Seconds each target runs when not told otherwise: seven targets stay under three
/// minutes of fuzzing, next to the one-off builds.
pub const DEFAULT_SECONDS: u64 = 20;

/// A fuzz crate and its targets.
#[derive(Debug)]
struct FuzzCrate {
    dir: PathBuf,
    targets: Vec<String>,
}

fn cargo() -> Command {
    Command::new(env!("CARGO"))
}

/// A `cargo fuzz` command for the crate in `dir`, with the shared target dir.
fn cargo_fuzz(dir: &Path) -> Command {
    let mut c = cargo();
    c.arg("fuzz").current_dir(dir).env("RUSTC_BOOTSTRAP", "1");
    // One target dir for all fuzz crates, so their common dependencies build once; kept in
    // the cache outside the checkout, so a fresh clone (CI) rebuilds only the workspace's
    // own crates, not every sanitized dependency (cargo's fingerprints tell what changed).
    if std::env::var_os("CARGO_TARGET_DIR").is_none() {
        c.env(
            "CARGO_TARGET_DIR",
            crate::setup::cache_dir().join("target-fuzz"),
        );
    }
    c
}

fn ensure_cargo_fuzz() -> Result<()> {
    let have = cargo()
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if have {
        return Ok(());
    }
    println!("fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)");
    let ok = cargo()
        .args(["install", "cargo-fuzz", "--locked"])
        .status()
        .context("running cargo install cargo-fuzz")?
        .success();
    if !ok {
        bail!("cargo install cargo-fuzz --locked failed: install it by hand and re-run");
    }
    Ok(())
}

fn fuzz_crates(root: &Path) -> Result<Vec<FuzzCrate>> {
    let mut crates = Vec::new();
    let mut entries: Vec<_> = fs::read_dir(root)
        .with_context(|| format!("reading {}", root.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("fuzz"))
        .filter(|d| {
            fs::read_to_string(d.join("Cargo.toml")).is_ok_and(|t| t.contains("cargo-fuzz = true"))
        })
        .collect();
    entries.sort();
    for dir in entries {
        let out = cargo_fuzz(&dir)
            .arg("list")
            .output()
            .with_context(|| format!("cargo fuzz list in {}", dir.display()))?;
        if !out.status.success() {
            bail!(
                "cargo fuzz list failed in {}:\n{}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let targets = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        crates.push(FuzzCrate { dir, targets });
    }
    Ok(crates)
}

/// Runs every fuzz target (or only `only`) for `seconds` each. Fails on the first crash,
/// naming the crash input and the command that reproduces it.
pub fn run(root: &Path, seconds: u64, only: Option<&str>) -> Result<()> {
    ensure_cargo_fuzz()?;
    let mut crates = fuzz_crates(root)?;
    if let Some(name) = only {
        for c in &mut crates {
            c.targets.retain(|t| t == name);
        }
        crates.retain(|c| !c.targets.is_empty());
        if crates.is_empty() {
            bail!("no fuzz target named {name:?} (see `cargo fuzz list` in */fuzz)");
        }
    }
    let work = root.join("target/fuzz");
    let mut ran = 0;
    let started = Instant::now();
    for c in &crates {
        let t = Instant::now();
        // Build everything first: a compile error is not a crash, and the fuzzing time
        // should be spent fuzzing.
        let ok = cargo_fuzz(&c.dir)
            .args(["build", "--debug-assertions"])
            .status()
            .with_context(|| format!("cargo fuzz build in {}", c.dir.display()))?
            .success();
        if !ok {
            bail!("building the fuzz targets in {} failed", c.dir.display());
        }
        println!(
            "fuzz: built {} ({} targets) in {:.0} s",
            c.dir.strip_prefix(root).unwrap_or(&c.dir).display(),
            c.targets.len(),
            t.elapsed().as_secs_f64()
        );
        for target in &c.targets {
            run_target(root, &work, &c.dir, target, seconds)?;
            ran += 1;
        }
    }
    println!(
        "fuzz: {ran} targets ran {seconds} s each without a crash ({:.0} s in all)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn run_target(root: &Path, work: &Path, dir: &Path, target: &str, seconds: u64) -> Result<()> {
    let corpus = work.join("corpus").join(target);
    let seeds = work.join("seeds").join(target);
    let logs = work.join("logs");
    for d in [&corpus, &logs] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let _ = fs::remove_dir_all(&seeds);
    fs::create_dir_all(&seeds).with_context(|| format!("creating {}", seeds.display()))?;
    let seed_count = write_seeds(root, target, &seeds)?;
    let log_path = logs.join(format!("{target}.log"));
    let log =
        fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let artifacts = dir.join("artifacts").join(target);
    let before = SystemTime::now();
    let status = cargo_fuzz(dir)
        .args(["run", "--debug-assertions", target])
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        // A single input that takes this long is a hang, reported like a crash.
        .arg("-timeout=10")
        .arg("-rss_limit_mb=2048")
        .stdout(log.try_clone().context("log file handle")?)
        .stderr(log)
        .status()
        .with_context(|| format!("cargo fuzz run {target}"))?;
    let text = fs::read_to_string(&log_path).unwrap_or_default();
    if !status.success() {
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        for l in tail.iter().rev() {
            eprintln!("{l}");
        }
        let found = new_files(&artifacts, before);
        let names = if found.is_empty() {
            format!("(no new file in {})", artifacts.display())
        } else {
            found
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        bail!(
            "fuzz target {target} failed; crash input: {names}\nreproduce: cd {} && \
             RUSTC_BOOTSTRAP=1 cargo fuzz run --debug-assertions {target} <crash input>\n\
             full log: {}",
            dir.display(),
            log_path.display()
        );
    }
    let runs = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("Done ")?.split(' ').next())
        .unwrap_or("?");
    println!("fuzz: {target}: {runs} runs in {seconds} s from {seed_count} seeds, no crash");
    Ok(())
}

fn new_files(dir: &Path, since: SystemTime) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= since)
        })
        .map(|e| e.path())
        .collect()
}

// ---------------------------------------------------------------------------
// Seed corpora
// ---------------------------------------------------------------------------

/// Writes the seeds of `target` into `dir`; returns how many.
fn write_seeds(root: &Path, target: &str, dir: &Path) -> Result<usize> {
    let seeds: Vec<Vec<u8>> = match target {
        "itch" => itch_seeds(root)?,
        "moldudp64" => moldudp64_seeds(root)?,
        "fix_decode" => fix_seeds(),
        "gateway_venue" => gateway_venue_seeds(),
        "gateway_engine" => gateway_engine_seeds(),
        "journal_replay" => journal_replay_seeds(),
        "mcast_datagram" => datagram_seeds(),
        "mcast_recovery" => recovery_seeds(),
        _ => Vec::new(),
    };
    for (i, s) in seeds.iter().enumerate() {
        let p = dir.join(format!("seed-{i:04}"));
        fs::write(&p, s).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(seeds.len())
}

/// Where the ITCH samples written by other implementations live (see its `README.md`).
const ITCH_SAMPLES: &str = "feed-handler/tests/data/itch";

/// The ITCH samples written by other implementations, checked into the feed handler's
/// tests. A missing one is an error: a fuzzer seeded with nothing still "passes".
fn itch_samples(root: &Path) -> Result<Vec<Vec<u8>>> {
    let d = root.join(ITCH_SAMPLES);
    ["sample.itch50", "ex20101224.TEST_ITCH_50"]
        .iter()
        .map(|f| {
            let p = d.join(f);
            fs::read(&p).with_context(|| format!("read the ITCH fuzz seed {}", p.display()))
        })
        .collect()
}

/// ITCH 5.0 message length by type byte (the type byte included).
fn itch_len(t: u8) -> Option<usize> {
    Some(match t {
        b'S' | b'W' => 12,
        b'R' => 39,
        b'H' => 25,
        b'Y' | b'N' => 20,
        b'L' => 26,
        b'V' | b'J' | b'U' => 35,
        b'K' => 28,
        b'h' => 21,
        b'A' | b'C' => 36,
        b'F' | b'Q' => 40,
        b'E' => 31,
        b'X' => 23,
        b'D' | b'B' => 19,
        b'P' => 44,
        b'I' => 50,
        b'O' => 48,
        _ => return None,
    })
}

/// The messages of a BinaryFILE capture, whether its prefixes are lengths or all zero.
fn itch_messages(file: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = file;
    while let [hi, lo, body @ ..] = rest {
        let prefix = usize::from(u16::from_be_bytes([*hi, *lo]));
        let len = match prefix {
            0 => body.first().copied().and_then(itch_len),
            n => Some(n),
        };
        let Some(msg) = len.and_then(|n| body.get(..n)) else {
            break;
        };
        out.push(msg);
        rest = &body[msg.len()..];
    }
    out
}

/// One message of each type found in the samples, plus short whole-file prefixes.
fn itch_seeds(root: &Path) -> Result<Vec<Vec<u8>>> {
    let mut seeds = Vec::new();
    let mut seen = [false; 256];
    for file in itch_samples(root)? {
        for m in itch_messages(&file) {
            if let Some(&t) = m.first() {
                if !seen[usize::from(t)] {
                    seen[usize::from(t)] = true;
                    seeds.push(m.to_vec());
                }
            }
        }
        seeds.push(file[..file.len().min(2048)].to_vec());
    }
    Ok(seeds)
}

/// A MoldUDP64 downstream packet: session, sequence, count, length-prefixed messages.
fn mold_packet(seq: u64, count: u16, messages: &[&[u8]]) -> Vec<u8> {
    let mut p = b"SESSION001".to_vec();
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&count.to_be_bytes());
    for m in messages {
        let len = u16::try_from(m.len()).unwrap_or(u16::MAX);
        p.extend_from_slice(&len.to_be_bytes());
        p.extend_from_slice(&m[..usize::from(len)]);
    }
    p
}

fn moldudp64_seeds(root: &Path) -> Result<Vec<Vec<u8>>> {
    let samples = itch_samples(root)?;
    let msgs: Vec<&[u8]> = samples
        .first()
        .map(|f| itch_messages(f))
        .unwrap_or_default();
    let three = &msgs[..msgs.len().min(3)];
    let first = mold_packet(1, three.len() as u16, three);
    let next = mold_packet(
        1 + three.len() as u64,
        1,
        &msgs[3.min(msgs.len())..4.min(msgs.len())],
    );
    let gap = mold_packet(10, 1, &msgs[..1.min(msgs.len())]);
    let heartbeat = mold_packet(4, 0, &[]);
    let end = mold_packet(5, 0xFFFF, &[]);
    // The target splits its input into packets at 0xFE bytes.
    let mut stream = first.clone();
    for p in [&gap, &heartbeat, &next] {
        stream.push(0xFE);
        stream.extend_from_slice(p);
    }
    // A retransmission request: session, sequence, count.
    let mut request = b"SESSION001".to_vec();
    request.extend_from_slice(&2u64.to_be_bytes());
    request.extend_from_slice(&5u16.to_be_bytes());
    Ok(vec![first, next, heartbeat, end, stream, request])
}

/// A FIX 4.4 message with correct BodyLength and CheckSum from `body` (fields after 9=).
fn fix_message(body: &str) -> Vec<u8> {
    let body = body.replace('|', "\x01");
    let mut m = format!("8=FIX.4.4\x019={}\x01{body}", body.len()).into_bytes();
    let sum = m.iter().map(|&b| u32::from(b)).sum::<u32>() % 256;
    m.extend_from_slice(format!("10={sum:03}\x01").as_bytes());
    m
}

fn fix_seeds() -> Vec<Vec<u8>> {
    let hdr = "49=VENUE|56=ROCEBUS|52=20240102-14:30:00.123456789|";
    let messages = [
        format!("35=A|34=1|{hdr}98=0|108=30|"),
        format!("35=0|34=2|{hdr}"),
        format!("35=1|34=3|{hdr}112=TEST1|"),
        format!("35=2|34=4|{hdr}7=1|16=0|"),
        format!("35=4|34=1|{hdr}123=Y|36=9|"),
        format!("35=4|34=5|43=Y|122=20240102-14:29:00|{hdr}123=Y|36=9|"),
        format!(
            "35=8|34=6|{hdr}37=V1|11=17|17=E1|150=0|39=0|1=7|55=AAPL|54=1|38=100|40=2|\
             44=150.2500|151=100|14=0|6=0|"
        ),
        format!(
            "35=8|34=7|{hdr}37=V1|11=17|17=E2|150=F|39=2|1=7|55=AAPL|54=1|38=100|32=100|\
             31=150.25|151=0|14=100|6=150.25|"
        ),
        format!("35=9|34=8|{hdr}37=V1|11=18|41=17|39=8|434=1|58=unknown order|"),
        format!("35=3|34=9|{hdr}45=3|371=44|373=5|58=bad price|"),
        format!("35=5|34=10|{hdr}58=bye|"),
    ];
    let mut seeds: Vec<Vec<u8>> = messages.iter().map(|m| fix_message(m)).collect();
    seeds.push(seeds.concat());
    seeds
}

/// Venue messages for `gateway_venue` (its input format is in its doc): each body sent as
/// the next in-sequence message (command `0xFE 0x02`), on the orders the target sets up
/// (ClOrdIDs 1 to 7, the setup's fill has ExecID X10).
fn gateway_venue_seeds() -> Vec<Vec<u8>> {
    let exec = "35=8|37=V1|55=AAPL|54=1|39=0|6=0|";
    let bodies = [
        format!("{exec}17=E1|11=1|150=F|32=40|31=100|14=40|151=60|"),
        format!("{exec}17=E2|11=6|150=5|32=0|31=0|14=0|151=150|"),
        format!("{exec}17=E3|11=7|150=4|32=0|31=0|14=0|151=0|"),
        format!("{exec}17=E4|11=5|150=0|32=0|31=0|14=0|151=10|"),
        format!("{exec}17=E5|11=5|150=8|32=0|31=0|14=0|151=0|"),
        format!("{exec}17=E6|11=2|150=H|19=X10|32=0|31=0|14=0|151=200|"),
        format!("{exec}17=E7|11=2|150=G|19=X10|32=50|31=101|14=50|151=150|"),
        "35=9|37=V4|11=7|41=4|39=0|434=1|58=too late|".to_owned(),
        "35=2|7=1|16=0|".to_owned(),
        "35=4|123=Y|36=20|".to_owned(),
        "35=1|112=T|".to_owned(),
        "35=3|45=3|371=44|373=5|".to_owned(),
        "35=5|58=bye|".to_owned(),
    ];
    let in_sequence = |b: &String| {
        let mut v = b.replace('|', "\x01").into_bytes();
        v.extend_from_slice(&[0xFE, 0x02]);
        v
    };
    let mut seeds: Vec<Vec<u8>> = bodies.iter().map(in_sequence).collect();
    // Everything in one run, with 30 s of timers and a reconnect (venue logs on) in between.
    let mut all = Vec::new();
    for (i, s) in seeds.iter().enumerate() {
        all.extend_from_slice(s);
        if i == 6 {
            all.extend_from_slice(&[0xFE, 3 | (15 << 3), 0xFE, 5 | (1 << 3)]);
        }
    }
    seeds.push(all);
    // A framed message as raw bytes, cut in two chunks.
    let raw = fix_message("35=0|34=6|49=VENUE|56=GW|52=20240102-15:00:00|");
    let (a, b) = raw.split_at(20);
    seeds.push([a, &[0xFE, 0x00], b, &[0xFE, 0x00]].concat());
    seeds
}

/// Operation sequences for `gateway_engine` (format in its doc): an order's life (new, ack,
/// fill, replace, confirm, cancel, cancel reject), kill switches, disconnects, garbage.
fn gateway_engine_seeds() -> Vec<Vec<u8>> {
    let new_order = [0x00, 1, 0, 0, 100, 0, 0, 1];
    let ack = [0x06, 1, 0, 0, 0, 0, 0, 100, 0, 0, 0];
    let fill = [0x06, 1, 1, 40, 0, 40, 0, 60, 0, 0, 0];
    let replace = [0x02, 1, 150, 0, 0, 1];
    let confirm = [0x06, 2, 3, 0, 0, 40, 0, 110, 0, 0, 0];
    let cancel = [0x01, 1, 1];
    let cancel_reject = [0x07, 3, 1];
    let life: Vec<u8> = [
        &new_order[..],
        &ack,
        &fill,
        &replace,
        &confirm,
        &cancel,
        &cancel_reject,
    ]
    .concat();
    let kill = [0x05, 0x01, 0x00, 2, 0, 0, 100, 0, 0, 1, 0x05, 0x09];
    let disconnect = [&new_order[..], &ack, &[0x05, 0x00]].concat();
    let reset = [&new_order[..], &[0x05, 0x07 | 16], &ack].concat();
    let garbage = [0x04, 0x40 | 8, b'N', 1, 48, 0, 1, 0, 0, 0];
    // Checkpoints (op 5, 0x85) between the steps of an order's life and after it ended.
    let checkpoint = [0x05u8, 0x85];
    let segments: Vec<u8> = [
        &new_order[..],
        &checkpoint,
        &ack,
        &fill,
        &checkpoint,
        &replace,
        &confirm,
        &cancel,
        &checkpoint,
        &cancel_reject,
        &checkpoint,
        &checkpoint,
    ]
    .concat();
    vec![
        segments,
        new_order.to_vec(),
        life,
        kill.to_vec(),
        disconnect,
        reset,
        garbage.to_vec(),
    ]
}

/// Journals for `journal_replay` built by its operations (mode 2): records, a commit record,
/// then a flipped byte or a cut.
fn journal_replay_seeds() -> Vec<Vec<u8>> {
    let clean = vec![
        2, 0, 1, 4, 1, 2, 3, 4, 0, 3, 2, 9, 9, 1, 0, 4, 3, b'x', b'y', b'z',
    ];
    let flipped = [&clean[..], &[3, 12, 0, 0x10]].concat();
    let cut = [&clean[..], &[4, 5]].concat();
    let mut raw = b"RBGWJNL2".to_vec();
    raw.insert(0, 0);
    vec![clean, flipped, cut, raw]
}

/// A rocebus market-data datagram (layout in `core/src/mcast/wire.rs`, little-endian).
fn datagram(line: u8, channel: u16, session: u64, first_seq: u64, msgs: &[&[u8]]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(b"RB");
    d.push(1);
    d.push(line);
    d.extend_from_slice(&channel.to_le_bytes());
    d.extend_from_slice(&(msgs.len() as u16).to_le_bytes());
    d.extend_from_slice(&session.to_le_bytes());
    d.extend_from_slice(&first_seq.to_le_bytes());
    for m in msgs {
        d.extend_from_slice(&(m.len() as u16).to_le_bytes());
        d.extend_from_slice(m);
    }
    d
}

fn datagram_seeds() -> Vec<Vec<u8>> {
    vec![
        datagram(0, 3, 7, 1, &[]),
        datagram(0, 3, 7, 1, &[b"bbo AAPL 150.25x150.26"]),
        datagram(1, 9, 8, 1000, &[b"trade", b"", b"level change"]),
    ]
}

/// A rocebus recovery message: 24-byte header (len covers everything), then `body`.
fn recovery(kind: u8, channel: u16, session: u64, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(b"RR");
    m.push(1);
    m.push(kind);
    m.extend_from_slice(&channel.to_le_bytes());
    m.extend_from_slice(&0u16.to_le_bytes());
    m.extend_from_slice(&(24 + body.len() as u32).to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(&session.to_le_bytes());
    m.extend_from_slice(body);
    m
}

fn recovery_seeds() -> Vec<Vec<u8>> {
    let words = |w: &[u64]| -> Vec<u8> { w.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let mut chunk = words(&[500, 0]);
    chunk.extend_from_slice(b"snapshot bytes");
    let mut end = words(&[500, 14]);
    end.extend_from_slice(&0x1234_5678u32.to_le_bytes());
    end.extend_from_slice(&[0; 4]);
    let dg = datagram(0, 3, 7, 42, &[b"retransmitted"]);
    let seeds = vec![
        recovery(1, 3, 7, &words(&[40, 5])),
        recovery(2, 3, 7, &dg),
        recovery(3, 3, 7, &words(&[40, 5, 100])),
        recovery(4, 3, 0, &[]),
        recovery(5, 3, 7, &chunk),
        recovery(6, 3, 7, &end),
        recovery(8, 3, 7, &words(&[40, 1000, 2])),
    ];
    let all = seeds.concat();
    let mut seeds = seeds;
    seeds.push(all);
    seeds
}
