//! Instruction counts per message from callgrind profiles, for
//! `cargo xtask bench rc-instructions` and `md-instructions` (the same
//! accounting; only the parts the instructions are broken down into differ:
//! [`orders_part`], [`md_part`]).
//!
//! [`Profile::parse`] reads callgrind's output format (version 1) as written
//! with `--dump-instr=yes`: the self cost (`Ir`, instructions executed) of
//! every instruction, keyed by its object and its address in that object,
//! with the function, source file and line it belongs to. Name compression
//! (`fn=(12) name`, then `fn=(12)`) and subposition compression (`+3`,
//! `-2`, `*` relative to the previous cost line of the same function) are
//! undone; the cost lines after `calls=` (inclusive costs of calls) are not
//! self cost and are skipped, as callgrind itself counts them in `totals:`.
//!
//! [`account`] turns three profiles of the same ping-pong client into
//! instructions per round trip, set-up and waiting excluded:
//!
//! - `short` ran N round trips, `long` and `slow` 2N, `slow` with callgrind's
//!   cache and branch simulation on, which makes the client several times
//!   slower without changing a single instruction it executes.
//! - Set-up and teardown cancel out in `long - short`: per round trip, an
//!   instruction costs `(long - short) / N`.
//! - Waiting: a wait loop spins as long as the peer takes to answer, so its
//!   instructions run more or less often in `long` than in `slow` (the same
//!   work, at a different speed), and all instructions of one loop body by
//!   the same amount. An instruction whose count is the same in both is
//!   work; the others are grouped by that difference (one group per wait
//!   loop) and counted as if every wait had found its message on the first
//!   check: per round trip of the `slow` run (the fewest spins), the group's
//!   smallest count (that of the instructions that run only when a check
//!   finds nothing, once per empty check) is taken from each of its
//!   members. What was taken (counted in `long`) is reported as waiting.
//!   A loop spins differently in every run, so its members are not
//!   differenced against `short`: their set-up share (small for a wait
//!   loop's code) stays in, spread over the 2N round trips.
//! - A group whose difference is at most one in ten round trips is not a
//!   wait loop but work that ran a little more in one run (frames whose
//!   seal arrived after their header): its members count as run in
//!   `slow`, nothing subtracted.

use std::collections::HashMap;
use std::rc::Rc;

/// One instruction's key: its object and its address in that object
/// (callgrind writes addresses relative to the object's load offset, so
/// they match across runs).
pub type Key = (Rc<str>, u64);

/// Where an instruction belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The (outermost, not inlined) function callgrind attributes it to.
    pub function: Rc<str>,
    /// The source file of the instruction (an inlined callee's file when it
    /// was inlined), `???` without debug information.
    pub file: Rc<str>,
    pub line: u64,
}

/// An instruction's self cost and place.
#[derive(Debug, Clone)]
pub struct Instr {
    pub ir: u64,
    pub place: Place,
}

/// The instructions of one profile.
#[derive(Debug, Default)]
pub struct Profile {
    pub instrs: HashMap<Key, Instr>,
    /// The `totals:` (or, without it, `summary:`) Ir of the file.
    pub totals: Option<u64>,
}

/// Why a profile could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    #[error("the profile has no instruction addresses: run callgrind with --dump-instr=yes")]
    NoInstrPositions,
    #[error("the profile has no Ir event")]
    NoIr,
    #[error("line {0}: {1}")]
    Bad(usize, &'static str),
    #[error("line {0}: name id {1} used before it was defined")]
    UnknownId(usize, u64),
    #[error("the self costs add up to {sum} instructions but the profile's totals say {totals}")]
    Totals { sum: u64, totals: u64 },
}

/// One name-compression table (callgrind keeps one for objects, one for
/// files, one for functions).
#[derive(Default)]
struct Names(HashMap<u64, Rc<str>>);

impl Names {
    /// `(id) name` defines and returns the name, `(id)` looks it up, a bare
    /// name is returned as it is.
    fn get(&mut self, v: &str, line: usize) -> Result<Rc<str>, ParseError> {
        let Some(rest) = v.strip_prefix('(') else {
            return Ok(Rc::from(v));
        };
        let (id, name) = rest
            .split_once(')')
            .ok_or(ParseError::Bad(line, "unterminated name id"))?;
        let id: u64 = id
            .parse()
            .map_err(|_| ParseError::Bad(line, "bad name id"))?;
        let name = name.trim();
        if name.is_empty() {
            self.0
                .get(&id)
                .cloned()
                .ok_or(ParseError::UnknownId(line, id))
        } else {
            let n: Rc<str> = Rc::from(name);
            self.0.insert(id, n.clone());
            Ok(n)
        }
    }
}

/// One subposition: `*` (same as the last), `+N`/`-N` (relative, decimal)
/// or absolute (hexadecimal `0x..` for addresses, decimal for lines).
fn subposition(tok: &str, last: u64, hex: bool, line: usize) -> Result<u64, ParseError> {
    let bad = ParseError::Bad(line, "bad position");
    if tok == "*" {
        return Ok(last);
    }
    if let Some(d) = tok.strip_prefix('+') {
        let d: u64 = d.parse().map_err(|_| bad)?;
        return last
            .checked_add(d)
            .ok_or(ParseError::Bad(line, "position overflow"));
    }
    if let Some(d) = tok.strip_prefix('-') {
        let d: u64 = d.parse().map_err(|_| bad)?;
        return last
            .checked_sub(d)
            .ok_or(ParseError::Bad(line, "position below zero"));
    }
    if hex {
        let h = tok.strip_prefix("0x").unwrap_or(tok);
        u64::from_str_radix(h, 16).map_err(|_| bad)
    } else {
        tok.parse().map_err(|_| bad)
    }
}

impl Profile {
    /// Reads a callgrind profile written with `--dump-instr=yes`; checks
    /// that the self costs add up to the file's totals.
    pub fn parse(text: &str) -> Result<Profile, ParseError> {
        let (mut obs, mut files, mut fns) = (Names::default(), Names::default(), Names::default());
        let unknown: Rc<str> = Rc::from("???");
        let (mut ob, mut fl, mut file, mut func) = (
            unknown.clone(),
            unknown.clone(),
            unknown.clone(),
            unknown.clone(),
        );
        let (mut has_instr, mut has_line) = (false, false);
        let mut ir_at: Option<usize> = None;
        let (mut last_addr, mut last_line) = (0u64, 0u64);
        // The next cost line is a call's (inclusive) cost or a jump's
        // position: not self cost, and it does not move the last position.
        let mut skip_next = false;
        let mut p = Profile::default();
        let mut summary = None;
        let mut sum = 0u64;
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let l = raw.trim_end();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let first = l.as_bytes()[0];
            if first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'*') {
                let (Some(_), true) = (ir_at, has_instr) else {
                    return Err(if has_instr {
                        ParseError::NoIr
                    } else {
                        ParseError::NoInstrPositions
                    });
                };
                let mut toks = l.split_ascii_whitespace();
                let at = toks.next().ok_or(ParseError::Bad(n, "empty cost line"))?;
                let addr = subposition(at, last_addr, true, n)?;
                let mut src_line = last_line;
                if has_line {
                    let t = toks.next().ok_or(ParseError::Bad(n, "missing line"))?;
                    src_line = subposition(t, last_line, false, n)?;
                }
                let ir = match toks.nth(ir_at.unwrap_or(0)) {
                    Some(t) => t.parse().map_err(|_| ParseError::Bad(n, "bad cost"))?,
                    None => 0,
                };
                if std::mem::take(&mut skip_next) {
                    continue;
                }
                last_addr = addr;
                last_line = src_line;
                sum += ir;
                let e = p.instrs.entry((ob.clone(), addr)).or_insert_with(|| Instr {
                    ir: 0,
                    place: Place {
                        function: func.clone(),
                        file: file.clone(),
                        line: src_line,
                    },
                });
                e.ir += ir;
                continue;
            }
            if let Some((k, v)) = l.split_once('=') {
                match k {
                    "ob" => {
                        ob = obs.get(v, n)?;
                        continue;
                    }
                    "fl" => {
                        fl = files.get(v, n)?;
                        file = fl.clone();
                        continue;
                    }
                    "fi" | "fe" => {
                        file = files.get(v, n)?;
                        continue;
                    }
                    "fn" => {
                        func = fns.get(v, n)?;
                        file = fl.clone();
                        (last_addr, last_line) = (0, 0);
                        skip_next = false;
                        continue;
                    }
                    "cob" => {
                        obs.get(v, n)?;
                        continue;
                    }
                    "cfi" | "cfl" | "jfi" => {
                        files.get(v, n)?;
                        continue;
                    }
                    "cfn" | "jfn" => {
                        fns.get(v, n)?;
                        continue;
                    }
                    "calls" | "jump" | "jcnd" => {
                        skip_next = true;
                        continue;
                    }
                    _ => {}
                }
            }
            if let Some((k, v)) = l.split_once(':') {
                let v = v.trim();
                match k {
                    "positions" => {
                        has_instr = v.split_whitespace().any(|w| w == "instr" || w == "addr");
                        has_line = v.split_whitespace().any(|w| w == "line");
                    }
                    "events" => ir_at = v.split_whitespace().position(|w| w == "Ir"),
                    "summary" | "totals" => {
                        let at = ir_at.ok_or(ParseError::NoIr)?;
                        let x = v
                            .split_whitespace()
                            .nth(at)
                            .map_or(Ok(0u64), |t| t.parse::<u64>())
                            .map_err(|_| ParseError::Bad(n, "bad total"))?;
                        if k == "totals" {
                            p.totals = Some(x);
                        } else {
                            summary = Some(x);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            return Err(ParseError::Bad(n, "unknown line"));
        }
        if !has_instr {
            return Err(ParseError::NoInstrPositions);
        }
        p.totals = p.totals.or(summary);
        if let Some(t) = p.totals {
            if t != sum {
                return Err(ParseError::Totals { sum, totals: t });
            }
        }
        Ok(p)
    }

    /// All self costs added.
    pub fn total(&self) -> u64 {
        self.instrs.values().map(|i| i.ir).sum()
    }
}

/// Instructions per round trip of a ping-pong client, waiting excluded.
#[derive(Debug, Clone, Default)]
pub struct Accounting {
    /// Instructions per round trip.
    pub per_round_trip: f64,
    /// Per round trip, what the wait loops spun beyond one check per wait
    /// (in the `long` run), excluded.
    pub waiting: f64,
    /// Wait loops found (groups of instructions whose count moved with the
    /// client's speed) and their instructions.
    pub wait_loops: usize,
    pub wait_instructions: usize,
    /// Per round trip, the sum of negative per-instruction counts (set-up
    /// that differed between the runs): a measure of noise, 0 ideally.
    pub noise: f64,
    /// Instructions per round trip by part, in the order first seen.
    pub parts: Vec<(String, f64)>,
    /// Instructions per round trip by function and source file, largest first.
    pub top: Vec<(String, f64)>,
}

/// See the module documentation. `short_round_trips` and
/// `long_round_trips` are the round trips of the `short` run and of the
/// `long` and `slow` ones; `part_of` names the part an instruction counts
/// towards.
pub fn account(
    short: &Profile,
    long: &Profile,
    slow: &Profile,
    short_round_trips: u64,
    long_round_trips: u64,
    part_of: &mut dyn FnMut(&Key, &Place) -> String,
) -> Accounting {
    let n = long_round_trips.saturating_sub(short_round_trips).max(1) as f64;
    let long_n = long_round_trips.max(1) as f64;
    let count = |p: &Profile, k: &Key| p.instrs.get(k).map_or(0, |i| i.ir) as f64;
    let place = |k: &Key| {
        long.instrs
            .get(k)
            .or_else(|| slow.instrs.get(k))
            .or_else(|| short.instrs.get(k))
            .map(|i| i.place.clone())
    };
    let mut keys: Vec<&Key> = short
        .instrs
        .keys()
        .chain(long.instrs.keys())
        .chain(slow.instrs.keys())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    // (key, per round trip) of the work, and the wait loops by count
    // difference between long and slow, with their members' counts per
    // round trip in slow and in long. A loop spins a different number of
    // times in every run, so its members are not differenced against
    // `short`: their counts are taken per round trip of one run, set-up
    // included (a wait loop's code runs little outside the loop).
    let mut work: Vec<(&Key, f64)> = Vec::new();
    let mut loops: HashMap<i128, Vec<(&Key, f64, f64)>> = HashMap::new();
    for k in keys {
        let (a, b, c) = (count(short, k), count(long, k), count(slow, k));
        if b == c {
            work.push((k, (b - a) / n));
        } else {
            let d = b as i128 - c as i128;
            loops
                .entry(d)
                .or_default()
                .push((k, c / long_n, b / long_n));
        }
    }
    // A difference of at most one in ten round trips is not a wait loop
    // but work that ran a little more or less in one of the runs (the
    // receiver's path from a matching header to the seal check also runs
    // when the seal has not arrived yet, which happened 114 times more in
    // one run of 10,000 round trips than in the other): taking its smallest
    // member for "nothing came" would subtract the work itself. A real wait
    // loop spins many times per round trip under emulation, and the slowed
    // `slow` run spins thousands of times less (differences of 9,000 to
    // millions per 10,000 round trips seen). Its members count as run in
    // `slow` (the fewest spins), set-up included, as a loop's do.
    let wobble = (long_round_trips / 10).max(1) as i128;
    loops.retain(|d, members| {
        if d.abs() > wobble {
            return true;
        }
        work.extend(members.iter().map(|&(k, in_slow, _)| (k, in_slow)));
        false
    });
    let mut acc = Accounting {
        wait_loops: loops.len(),
        ..Accounting::default()
    };
    for members in loops.values() {
        let floor = members.iter().map(|m| m.1).fold(f64::INFINITY, f64::min);
        for &(k, in_slow, in_long) in members {
            let v = in_slow - floor;
            acc.waiting += in_long - v;
            acc.wait_instructions += 1;
            work.push((k, v));
        }
    }
    let mut parts: Vec<(String, f64)> = Vec::new();
    let mut top: HashMap<String, f64> = HashMap::new();
    for (k, v) in work {
        if v < 0.0 {
            acc.noise -= v;
        }
        acc.per_round_trip += v;
        let Some(pl) = place(k) else { continue };
        let part = part_of(k, &pl);
        match parts.iter_mut().find(|p| p.0 == part) {
            Some(p) => p.1 += v,
            None => parts.push((part, v)),
        }
        let file = pl.file.rsplit('/').next().unwrap_or("???");
        *top.entry(format!("{} [{file}]", short_name(&pl.function)))
            .or_default() += v;
    }
    acc.parts = parts;
    let mut top: Vec<(String, f64)> = top.into_iter().filter(|t| t.1 >= 0.5).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    acc.top = top;
    acc
}

/// A function name without generic arguments and hashes, at most 80 characters.
fn short_name(f: &str) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for ch in f.chars() {
        match ch {
            '<' => {
                if depth == 0 {
                    out.push_str("<..>");
                }
                depth += 1;
            }
            '>' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(ch),
            _ => {}
        }
    }
    if out.chars().count() > 80 {
        out = out.chars().take(77).collect::<String>() + "...";
    }
    out
}

/// The name of the function whose body holds `line` (1-based) of `source`:
/// the nearest `fn NAME` at or above it, `None` if there is none.
pub fn enclosing_fn(source: &str, line: u64) -> Option<String> {
    let lines: Vec<&str> = source.lines().collect();
    let end = (line as usize).min(lines.len());
    lines[..end].iter().rev().find_map(|l| {
        let t = l.trim_start();
        if t.starts_with("//") {
            return None;
        }
        let at = t.find("fn ")?;
        // `fn` must be a whole word: the line's start or after a space.
        if at > 0 && !t[..at].ends_with(' ') {
            return None;
        }
        let name: String = t[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        (!name.is_empty()).then_some(name)
    })
}

/// The parts of rocebus's orders path, by the function whose source
/// line an instruction comes from (`func`, from [`enclosing_fn`]) and its
/// source file; for code without rocebus source (the standard library
/// inlined into rocebus's functions, libibverbs, the rxe provider, libc),
/// Whether `file` is rocebus's own source (or the vendored verbs binding's). The
/// standard library's files (`/rustc/HASH/library/core/src/..`) are not, though their
/// path also holds `core/src/`.
fn is_ours(file: &str) -> bool {
    (file.contains("core/src/") || file.contains("bench/src/") || file.contains("rdma-sys/src/"))
        && !file.contains("/library/")
        && !file.starts_with("/rustc/")
}

/// by the function callgrind attributes it to and its `object`.
pub fn orders_part(
    object: &str,
    file: &str,
    func: Option<&str>,
    callgrind_fn: &str,
) -> &'static str {
    const CREDIT: &[&str] = &[
        "send_credit",
        "refresh_credit",
        "take_credit",
        "on_credit",
        "credit_due",
        "credit_sent",
        "control_word",
    ];
    const POST: &[&str] = &[
        "flush",
        "post",
        "write_wr",
        "post_runs",
        "post_chunks",
        "post_mark",
        "reap",
        "post_ring_writes",
        "take_flush",
        "take_run",
        "flush_rest",
        "flush_runs",
        "post_staged",
        "range_sge",
        "inline",
        "write",
        "set_signaled",
        "set_wr_id",
        "post_staged_as",
        "post_staged_slow",
        "post_run",
        "unflushed",
        "ibv_post_send",
        "ibv_poll_cq",
    ];
    const POLL: &[&str] = &[
        "poll",
        "load_control",
        "poll_slow",
        "load_header",
        "take_sealed",
        "copy_words",
        "copy_relaxed",
        "word_at",
        "copy_payload",
        "check_cm",
        "advance",
        "load_acquire",
        "load_relaxed",
        "expected_seq",
        "offset",
    ];
    const SEAL: &[&str] = &[
        "claim",
        "claim_fast",
        "commit_fast",
        "offer_slow",
        "refused",
        "try_claim",
        "commit",
        "offer",
        "offer_and_flush",
        "payload",
        "payload_mut",
        "abandon",
        "deref",
        "deref_mut",
        "drop",
        "claim_fast_fitting",
        "write_usual",
        "offer_run",
        "commit_flushed",
    ];
    // The C API's own code (`rocebus-ffi`: the guard, the handle's call
    // state, the frame handed to the C handler) and the C harness's
    // (`rc-instructions --api c`); rocebus's code inlined into the C entry
    // points keeps its own file and lands in its own part below.
    if file.contains("ffi/src/") && !file.starts_with("/rustc/") {
        return "C API boundary (rocebus-ffi)";
    }
    if file.contains("bench/c/") {
        return "C harness (rc_latency.c)";
    }
    if is_ours(file) {
        if file.ends_with("ring/frame.rs") {
            return "frame checks/seal";
        }
        let f = func.unwrap_or("");
        // The ring's loads (header, seal, the payload copy) are polling;
        // the rest of `ring/mem.rs` (staging, the prepared post) is posting.
        if file.ends_with("ring/mem.rs") && POLL.contains(&f) {
            return "poll/frame detection";
        }
        if file.ends_with("verbs/qp.rs")
            || file.ends_with("verbs/cq.rs")
            || file.ends_with("ring/mem.rs")
        {
            return "post/doorbell/completions";
        }
        if CREDIT.contains(&f) {
            return "credit";
        }
        if POST.contains(&f) {
            return "post/doorbell/completions";
        }
        if POLL.contains(&f) {
            return "poll/frame detection";
        }
        if SEAL.contains(&f) {
            return "frame checks/seal";
        }
        // The rest of the connection is its send side (the send queue's
        // bookkeeping: `fast`, `refresh`, `has_room`, `on_posted`...).
        if file.ends_with("orders/connection.rs") && !f.is_empty() {
            return "post/doorbell/completions";
        }
    }
    let g = callgrind_fn.to_ascii_lowercase();
    // The verbs library and the provider (stripped: no function names):
    // posting the writes and polling send completions.
    if object.contains("librxe") || object.contains("libibverbs") {
        return "post/doorbell/completions";
    }
    if g.contains("memcpy") || g.contains("memmove") || g.contains("mempcpy") {
        return "payload copy (memcpy)";
    }
    if g.contains("post_send")
        || g.contains("poll_cq")
        || g.contains("spin_lock")
        || g.contains("spin_unlock")
        || g.contains("spin_init")
        || g == "write"
        || g.contains("libc_write")
        || g.contains("ibv_")
        || g.contains("rxe")
    {
        return "post/doorbell/completions";
    }
    // Standard-library code inlined into rocebus's functions (RefCell
    // borrows, slice ranges, atomics) counts towards the function it is in.
    //
    // What is left: standard-library code inlined into a loop that is itself
    // all inlined (`ping_loop`): the line tables name the library's file and
    // callgrind the loop, so nothing says which rocebus function it served.
    let std_inlined = file.starts_with("/rustc/") || file.contains("/library/");
    for (name, part) in [
        ("send_credit", "credit"),
        ("connection::flush", "post/doorbell/completions"),
        ("connection::post", "post/doorbell/completions"),
        ("connection::reap", "post/doorbell/completions"),
        ("post_ring_writes", "post/doorbell/completions"),
        ("receiver::poll", "poll/frame detection"),
        ("subscription::poll", "poll/frame detection"),
        ("publication::offer", "frame checks/seal"),
        ("try_claim", "frame checks/seal"),
        ("commit", "frame checks/seal"),
    ] {
        if g.contains(name) {
            return part;
        }
    }
    if std_inlined {
        return "std inlined in the loop (unattributed)";
    }
    "other"
}

/// The parts of rocebus's market-data path (md-ping: a publisher and a
/// subscriber in one loop), by the function whose source line an
/// instruction comes from (`func`, from [`enclosing_fn`]) and its source
/// file; for code without rocebus source, by the function callgrind
/// attributes it to and its `object`, as [`orders_part`] does. The verbs
/// library and the rxe provider are stripped: their post, CQ polls and
/// receive reposts are one part.
pub fn md_part(object: &str, file: &str, func: Option<&str>, callgrind_fn: &str) -> &'static str {
    const SEND: &str = "post/send";
    const RECV: &str = "poll/receive";
    const CHECKS: &str = "frame checks";
    const SEQ: &str = "sequencing/gap logic";
    const TIMERS: &str = "timers/status/requests";
    const HANDLER: &str = "handler";
    // The subscriber state machine's functions that run on a clock or
    // report, not on a datagram's sequence.
    const SUB_TIMERS: &[&str] = &[
        "poll_timeout",
        "handle_timeout",
        "expects_recovery",
        "poll_transmit",
        "poll_event",
        "check",
        "timeouts",
        "retry_wait_ns",
        "receive_queue_low",
        "track_stall",
        "push_event",
        "counters",
        "session",
        "next_seq",
        // The subscriber's parts (mcast/subscriber/): the loss detector's
        // and the gap-tolerance clock's timer work.
        "expire",
        "poll_request",
        "first_asked",
        "track",
        "deadline",
        "pending",
    ];
    // The publisher's functions that are timers (heartbeats, the flush
    // interval, pacing) and recovery answers, not the send of a message.
    const PUB_TIMERS: &[&str] = &[
        "is_due",
        "heartbeat",
        "answer_retransmit",
        "poll",
        "poll_recovery",
        "send_multicast_repairs",
        "handle_timeout",
        "poll_timeout",
        "idle",
        "poll_event",
        "accept",
        "progress",
        "release",
        "send_answers",
    ];
    if is_ours(file) {
        let f = func.unwrap_or("");
        if file.ends_with("bench/src/md.rs") {
            return if matches!(f, "on_message" | "message") {
                HANDLER
            } else {
                "other"
            };
        }
        if file.ends_with("mcast/wire.rs")
            || file.ends_with("mcast/fragment.rs")
            || file.ends_with("src/auth.rs")
            || f == "check_datagram"
        {
            return CHECKS;
        }
        if file.contains("mcast/subscriber/") {
            return if SUB_TIMERS.contains(&f) { TIMERS } else { SEQ };
        }
        if file.ends_with("mcast/status.rs")
            || file.ends_with("mcast/backoff.rs")
            || file.ends_with("mcast/repair.rs")
            || file.ends_with("io/recovery.rs")
            || file.ends_with("io/link.rs")
        {
            return TIMERS;
        }
        if file.ends_with("io/subscriber.rs") {
            return if f == "poll" { RECV } else { TIMERS };
        }
        if file.ends_with("mcast/publisher.rs")
            || file.ends_with("io/publisher.rs")
            || file.ends_with("mcast/schedule.rs")
        {
            return if PUB_TIMERS.contains(&f) {
                TIMERS
            } else {
                SEND
            };
        }
        if file.contains("verbs/") {
            return if f.contains("recv") || f.contains("receive") || f == "replenish" {
                RECV
            } else {
                SEND
            };
        }
    }
    let g = callgrind_fn.to_ascii_lowercase();
    if object.contains("librxe") || object.contains("libibverbs") {
        return "verbs provider (post, CQ polls, receive reposts)";
    }
    if g.contains("memcpy") || g.contains("memmove") || g.contains("mempcpy") {
        return "payload copy (memcpy)";
    }
    // Standard-library code inlined into rocebus's functions counts
    // towards the function it is in.
    for (name, part) in [
        ("on_message", HANDLER),
        ("subscriberstate::on_datagram", SEQ),
        ("subscriberstate::accept", SEQ),
        ("mcastsubscriber::poll", RECV),
        ("poll_recv", RECV),
        ("mcastpublisher::poll", TIMERS),
        ("mcastpublisher::publish", SEND),
        ("mcastpublisher::flush", SEND),
        ("post_send", SEND),
        ("poll_cq", RECV),
    ] {
        if g.contains(name) {
            return part;
        }
    }
    "other"
}

/// Which parts `callgrind-account` breaks rocebus's instructions down into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Parts {
    /// The orders path's ([`orders_part`]).
    Orders,
    /// The market-data path's ([`md_part`]).
    Md,
}

/// Options of `rocebus-bench callgrind-account`.
#[derive(Debug, Clone, clap::Args)]
pub struct AccountArgs {
    /// Name printed with the figures (rocebus, perftest).
    #[arg(long)]
    pub label: String,
    /// Profile of the run of N round trips.
    #[arg(long)]
    pub short: std::path::PathBuf,
    /// Profile of the run of 2N round trips.
    #[arg(long)]
    pub long: std::path::PathBuf,
    /// Profile of the run of 2N round trips with the slower simulation on.
    #[arg(long)]
    pub slow: std::path::PathBuf,
    /// N: the short run's round trips (the long and slow runs made 2N).
    #[arg(long, short = 'n')]
    pub round_trips: u64,
    /// Break the instructions down by part of rocebus's orders or
    /// market-data path (from the source lines; else by object).
    #[arg(long, value_enum)]
    pub parts: Option<Parts>,
    /// Functions listed, largest first.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
}

/// The text of a source file named in a profile: as named, else relative
/// to this workspace (line tables may hold paths relative to a crate).
fn read_source(file: &str) -> Option<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(file)
        .or_else(|_| std::fs::read_to_string(root.join(file)))
        .or_else(|_| std::fs::read_to_string(root.join("core").join(file)))
        .ok()
}

/// The object's file name.
fn object_name(k: &Key) -> String {
    k.0.rsplit('/').next().unwrap_or("???").to_owned()
}

/// `rocebus-bench callgrind-account`: reads the three profiles, prints the
/// instructions per round trip, their parts and the largest functions, and
/// a `RESULT label=.. instructions=..` line.
pub fn report(args: &AccountArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let read = |p: &std::path::Path| -> anyhow::Result<Profile> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        Profile::parse(&text).with_context(|| format!("parsing {}", p.display()))
    };
    let (short, long, slow) = (read(&args.short)?, read(&args.long)?, read(&args.slow)?);
    let mut sources: HashMap<Rc<str>, Option<String>> = HashMap::new();
    let mut by_part = |k: &Key, pl: &Place| -> String {
        let Some(parts) = args.parts else {
            return object_name(k);
        };
        let src = sources
            .entry(pl.file.clone())
            .or_insert_with(|| read_source(&pl.file));
        let func = src.as_deref().and_then(|s| enclosing_fn(s, pl.line));
        let part = match parts {
            Parts::Orders => orders_part,
            Parts::Md => md_part,
        };
        part(&k.0, &pl.file, func.as_deref(), &pl.function).to_owned()
    };
    let a = account(
        &short,
        &long,
        &slow,
        args.round_trips,
        2 * args.round_trips,
        &mut by_part,
    );
    let mut by_object: Vec<(String, f64)> = Vec::new();
    if args.parts.is_some() {
        let again = account(
            &short,
            &long,
            &slow,
            args.round_trips,
            2 * args.round_trips,
            &mut |k, _| object_name(k),
        );
        by_object = again.parts;
    }
    let l = &args.label;
    println!(
        "{l}: {:.1} user-space instructions per round trip (one message sent, one received); \
         waiting excluded: {:.1} per round trip in {} wait loops ({} instructions); \
         noise (negative counts) {:.2}; totals short {} long {} slow {}",
        a.per_round_trip,
        a.waiting,
        a.wait_loops,
        a.wait_instructions,
        a.noise,
        short.total(),
        long.total(),
        slow.total()
    );
    let show = |what: &str, rows: &[(String, f64)]| {
        let mut rows: Vec<&(String, f64)> = rows.iter().filter(|r| r.1.abs() >= 0.05).collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (name, v) in rows {
            println!("{l} {what} {name}: {v:.1}");
        }
    };
    show("part", &a.parts);
    show("object", &by_object);
    for (name, v) in a.top.iter().take(args.top) {
        println!("{l} function {name}: {v:.1}");
    }
    crate::report::emit_result(&format!(
        "RESULT label={l} instructions={:.1} waiting={:.1} wait_loops={} noise={:.2}",
        a.per_round_trip, a.waiting, a.wait_loops, a.noise
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile as callgrind 3.19 writes it with --dump-instr=yes (cut
    /// down by hand): name and position compression, an inlined file, a
    /// call whose inclusive cost must not count as self cost.
    const SAMPLE: &str = "# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 4242
cmd:  ./ping --x=1
part: 1


desc: I1 cache: 
desc: Timerange: Basic block 0 - 100
desc: Trigger: Program termination

positions: instr line
events: Ir
summary: 45


ob=(1) /usr/bin/ping
fl=(1) /src/main.rs
fn=(1) main
0x1000 10 5
+4 * 2
fi=(2) /src/inline.rs
+2 40 3
fe=(1)
-1 +1 1
cob=(2) /lib/libc.so.6
cfi=(3) ???
cfn=(2) write
calls=2 0x500 0
+3 12 20
+3 * 1

ob=(2)
fl=(3)
fn=(2)
0x500 0 30
+1 0 0

ob=(1)
fl=(1)
fn=(1)
0x1000 10 2
+9 14 1
totals: 45
";

    #[test]
    fn parses_compressed_positions_names_and_calls() {
        let p = Profile::parse(SAMPLE).unwrap();
        assert_eq!(p.totals, Some(45));
        assert_eq!(p.total(), 45);
        let get = |ob: &str, a: u64| p.instrs.get(&(Rc::from(ob), a)).cloned().unwrap();
        // 0x1000 twice in main (two blocks of the same function): added.
        assert_eq!(get("/usr/bin/ping", 0x1000).ir, 7);
        assert_eq!(get("/usr/bin/ping", 0x1004).ir, 2);
        let inl = get("/usr/bin/ping", 0x1006);
        assert_eq!(
            (inl.ir, &*inl.place.file, inl.place.line),
            (3, "/src/inline.rs", 40)
        );
        let back = get("/usr/bin/ping", 0x1005);
        assert_eq!(
            (back.ir, &*back.place.file, back.place.line),
            (1, "/src/main.rs", 41)
        );
        // The call's inclusive cost (20) is not self cost and does not
        // move the position: the next line is relative to 0x1005.
        let after = get("/usr/bin/ping", 0x1008);
        assert_eq!((after.ir, after.place.line), (1, 41));
        assert_eq!(get("/usr/bin/ping", 0x1009).ir, 1);
        let w = get("/lib/libc.so.6", 0x500);
        assert_eq!((w.ir, &*w.place.function), (30, "write"));
        assert_eq!(p.instrs.len(), 8);
    }

    #[test]
    fn refuses_profiles_it_cannot_read() {
        let no_instr = "positions: line\nevents: Ir\nfn=main\n10 5\n";
        assert_eq!(
            Profile::parse(no_instr).unwrap_err(),
            ParseError::NoInstrPositions
        );
        let wrong_total = "positions: instr\nevents: Ir\nfn=main\n0x10 5\ntotals: 6\n";
        assert_eq!(
            Profile::parse(wrong_total).unwrap_err(),
            ParseError::Totals { sum: 5, totals: 6 }
        );
        let unknown_id = "positions: instr\nevents: Ir\nfn=(3)\n0x10 5\n";
        assert_eq!(
            Profile::parse(unknown_id).unwrap_err(),
            ParseError::UnknownId(3, 3)
        );
        assert!(Profile::parse("positions: instr\nevents: Ir\nfn=a\n0x10 x\n").is_err());
        assert!(Profile::parse("positions: instr\nevents: Ir\nfn=a\n-0x10 1\n").is_err());
    }

    /// Builds a profile from `(object, address, function, Ir)`.
    fn profile(rows: &[(&str, u64, &str, u64)]) -> Profile {
        let mut p = Profile::default();
        for &(ob, a, f, ir) in rows {
            p.instrs.insert(
                (Rc::from(ob), a),
                Instr {
                    ir,
                    place: Place {
                        function: Rc::from(f),
                        file: Rc::from("/x/core/src/orders.rs"),
                        line: 1,
                    },
                },
            );
        }
        p
    }

    /// Set-up (cost 1000 in every run) cancels out; the wait loop's body
    /// (instructions 0x20, 0x21: a check run once more than the loop spins,
    /// and the branch run only when nothing came) counts once per round
    /// trip, however long the waits were (and they differ in every run).
    #[test]
    fn set_up_cancels_and_waiting_counts_as_one_check() {
        let n = 100;
        // Per round trip: 0x10 is work run 3 times; the loop spins 7 times
        // in `long`, 2 in `slow`, 5 in `short`; setup 1000 once.
        let run = |rts: u64, spins: u64| {
            profile(&[
                ("o", 0x1, "setup", 1000),
                ("o", 0x10, "post", 3 * rts),
                ("o", 0x20, "poll", (spins + 1) * rts),
                ("o", 0x21, "poll", spins * rts),
            ])
        };
        let (short, long, slow) = (run(n, 5), run(2 * n, 7), run(2 * n, 2));
        let a = account(&short, &long, &slow, n, 2 * n, &mut |_, pl| {
            pl.function.to_string()
        });
        assert!((a.per_round_trip - 4.0).abs() < 1e-9, "{a:?}");
        assert_eq!((a.wait_loops, a.wait_instructions), (1, 2));
        // In `long`, 8 + 7 per round trip ran, 1 of them counts.
        assert!((a.waiting - 14.0).abs() < 1e-9, "{a:?}");
        assert_eq!(a.noise, 0.0);
        let part = |name: &str| a.parts.iter().find(|p| p.0 == name).unwrap().1;
        assert!((part("post") - 3.0).abs() < 1e-9);
        assert!((part("poll") - 1.0).abs() < 1e-9);
        assert!(part("setup").abs() < 1e-9);
    }

    /// Work that ran a little more in one run than in the other (frames
    /// whose seal was late) is work, not a wait loop to subtract.
    #[test]
    fn a_difference_of_a_few_is_work_not_waiting() {
        let n = 1000;
        let run = |rts: u64, late: u64, spins: u64| {
            profile(&[
                ("o", 0x10, "post", 3 * rts),
                // Once per message, and once more per late seal.
                ("o", 0x30, "take", rts + late),
                ("o", 0x31, "take", rts + late),
                // A real wait loop: the check and the nothing-came branch.
                ("o", 0x20, "poll", (spins + 1) * rts),
                ("o", 0x21, "poll", spins * rts),
            ])
        };
        // Late seals: one in the short run; in the long runs none, or 23 more
        // in `slow` than in `long` (1.15% of the round trips, as measured).
        for (late_long, late_slow) in [(0, 1), (0, 23)] {
            let (short, long, slow) = (
                run(n, 1, 5),
                run(2 * n, late_long, 7),
                run(2 * n, late_slow, 2),
            );
            let a = account(&short, &long, &slow, n, 2 * n, &mut |_, pl| {
                pl.function.to_string()
            });
            let part = |name: &str| a.parts.iter().find(|p| p.0 == name).unwrap().1;
            let take = 2.0 * (2 * n + late_slow) as f64 / (2 * n) as f64;
            assert!((part("take") - take).abs() < 1e-9, "{a:?}");
            assert!((part("poll") - 1.0).abs() < 1e-9, "{a:?}");
            assert!((part("post") - 3.0).abs() < 1e-9, "{a:?}");
            assert_eq!((a.wait_loops, a.wait_instructions), (1, 2));
        }
    }

    #[test]
    fn finds_the_enclosing_function_and_the_part() {
        let src = "impl X {\n    pub fn send_credit(&self) {\n        let a = 1;\n        // fn not_this\n        a\n    }\n    fn poll_it() {}\n}\n";
        assert_eq!(enclosing_fn(src, 5).as_deref(), Some("send_credit"));
        assert_eq!(enclosing_fn(src, 7).as_deref(), Some("poll_it"));
        assert_eq!(enclosing_fn(src, 1), None);
        assert_eq!(
            orders_part("b", "/w/core/src/orders.rs", Some("send_credit"), "x"),
            "credit"
        );
        assert_eq!(
            orders_part("b", "/w/core/src/ring/frame.rs", Some("validate"), "x"),
            "frame checks/seal"
        );
        assert_eq!(
            orders_part("b", "/w/core/src/ring/proto.rs", Some("poll"), "x"),
            "poll/frame detection"
        );
        assert_eq!(
            orders_part("/lib/librxe-rdmav34.so", "???", None, "0x3cc0"),
            "post/doorbell/completions"
        );
        assert_eq!(
            orders_part(
                "b",
                "/rustc/x/library/core/src/cell.rs",
                None,
                "rocebus::orders::Connection::post"
            ),
            "post/doorbell/completions"
        );
        assert_eq!(
            orders_part("b", "/w/core/src/ring/mem.rs", Some("take_sealed"), "x"),
            "poll/frame detection"
        );
        assert_eq!(
            orders_part("b", "/w/core/src/ring/mem.rs", Some("post"), "x"),
            "post/doorbell/completions"
        );
        assert_eq!(orders_part("b", "???", None, "main"), "other");
        assert_eq!(
            orders_part(
                "b",
                "/rustc/x/library/core/src/num/uint_macros.rs",
                None,
                "rocebus_bench::rc::ping_loop"
            ),
            "std inlined in the loop (unattributed)"
        );
        assert_eq!(
            orders_part(
                "b",
                "/w/core/src/orders/connection.rs",
                Some("has_room"),
                "x"
            ),
            "post/doorbell/completions"
        );
        assert_eq!(
            orders_part(
                "b",
                "/w/vendor/rdma-sys/src/verbs.rs",
                Some("ibv_post_send"),
                "x"
            ),
            "post/doorbell/completions"
        );
        assert_eq!(
            orders_part(
                "b",
                "/w/core/src/ring/state.rs",
                Some("claim_fast_fitting"),
                "x"
            ),
            "frame checks/seal"
        );
        assert_eq!(
            orders_part("libc.so.6", "???", None, "__mempcpy_avx_unaligned_erms"),
            "payload copy (memcpy)"
        );
    }

    #[test]
    fn finds_the_market_data_parts() {
        let part = |file: &str, f: &str| md_part("b", file, Some(f), "x");
        assert_eq!(
            part("/w/core/src/mcast/io/subscriber.rs", "poll"),
            "poll/receive"
        );
        assert_eq!(
            part("/w/core/src/mcast/io/subscriber.rs", "send_status"),
            "timers/status/requests"
        );
        assert_eq!(
            part("/w/core/src/mcast/subscriber/mod.rs", "accept"),
            "sequencing/gap logic"
        );
        assert_eq!(
            part("/w/core/src/mcast/subscriber/mod.rs", "poll_timeout"),
            "timers/status/requests"
        );
        assert_eq!(
            part("/w/core/src/mcast/subscriber/mod.rs", "check_datagram"),
            "frame checks"
        );
        assert_eq!(part("/w/core/src/mcast/wire.rs", "parse"), "frame checks");
        assert_eq!(
            part("/w/core/src/mcast/io/publisher.rs", "flush"),
            "post/send"
        );
        assert_eq!(
            part("/w/core/src/mcast/io/publisher.rs", "poll"),
            "timers/status/requests"
        );
        assert_eq!(
            part("/w/core/src/mcast/publisher.rs", "commit"),
            "post/send"
        );
        assert_eq!(
            part("/w/core/src/verbs/pool.rs", "poll_recv_from"),
            "poll/receive"
        );
        assert_eq!(part("/w/core/src/verbs/pool.rs", "send"), "post/send");
        assert_eq!(part("/w/bench/src/md.rs", "on_message"), "handler");
        assert_eq!(part("/w/bench/src/md.rs", "ping_loop"), "other");
        assert_eq!(
            md_part("/lib/librxe-rdmav34.so", "???", None, "0x3cc0"),
            "verbs provider (post, CQ polls, receive reposts)"
        );
        assert_eq!(
            md_part(
                "b",
                "/rustc/x/library/core/src/slice/mod.rs",
                None,
                "rocebus::mcast::subscriber::SubscriberState::accept"
            ),
            "sequencing/gap logic"
        );
        assert_eq!(md_part("b", "???", None, "memcpy"), "payload copy (memcpy)");
        assert_eq!(short_name("a::b<c<d>>::e"), "a::b<..>::e");
    }
}
