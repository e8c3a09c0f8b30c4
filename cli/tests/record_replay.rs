//! `rocebus record` and `feed-handler replay` end to end on one soft-RoCE guest, with the
//! real binaries: the feed handler publishes a generated day (a capture) on the bus,
//! `rocebus record` records it, the DBN file is read back with the `dbn` crate and counted
//! against what the feed handler published (and against the day's normalized messages
//! counted here from the book); `feed-handler replay` publishes the recording again, a
//! second `rocebus record` records that, and the two recordings are equal record for record
//! (receive times aside). A second test starves the publisher (tiny history, slow pacing) so
//! the recorder's subscriber loses messages for good: the loss is in the recording as an
//! ErrorMsg, followed by the snapshot it resynchronised from.
//!
//! `#[ignore]`d "rdma: ..." so a host without RDMA reports them as not run; `cargo xtask
//! test` runs them in a guest. The binaries are found next to this test's `rocebus` (the
//! runner builds every workspace binary first).

use dbn::decode::{DbnDecoder, DecodeRecordRef};
use dbn::{rtype, ErrorMsg, Mbp1Msg, RecordRef, StatusMsg, SymbolMappingMsg, TradeMsg};
use feed_handler::book::Book;
use feed_handler::generate::{generate, GenConfig};
use feed_handler::itch::decode_exact;
use feed_handler::normalized::{decode, Normalized};
use feed_handler::publish::{MdSink, Publisher};
use rocebus::counters::CountersReader;
use std::io::{BufRead, BufReader, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const DAY: GenConfig = GenConfig {
    seed: 17,
    messages: 20_000,
    symbols: 20,
};

fn rocebus() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rocebus"))
}

fn feed_handler_bin() -> PathBuf {
    let p = rocebus().with_file_name("feed-handler");
    assert!(
        p.exists(),
        "{} missing: build the workspace's binaries first (`cargo build --workspace --bins`)",
        p.display()
    );
    p
}

fn local_ip() -> IpAddr {
    if let Some(ip) = std::env::var("ROCEBUS_GUEST_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
    {
        return ip;
    }
    let ctx = rocebus::verbs::Context::open(None).expect("an RDMA device");
    let idx = ctx.default_gid_index(1).expect("gid index");
    let gid = ctx.query_gid(1, idx).expect("gid");
    IpAddr::V4(gid.ipv4().expect("an IPv4 GID (ROCEBUS_GUEST_ADDR)"))
}

/// A feed-handler config reading `capture`, publishing one channel.
fn config(dir: &Path, ip: IpAddr, capture: &Path, group: &str, port: u16, starve: bool) -> PathBuf {
    // The recorder connects once the publisher is up, which has started publishing: the
    // session's start comes from the history (join_replay_max covers the whole day).
    let (history, pacing, join) = if starve {
        (64, "max_datagrams_per_sec = 500\nburst = 4\n", 4096)
    } else {
        (
            16384,
            "max_datagrams_per_sec = 20000\nburst = 32\n",
            1_000_000,
        )
    };
    // A subscriber whose ring stays full this long is dropped and rejoins from a snapshot
    // (a loss, which this test does not allow): the recorder here is a debug build in a guest
    // that CI may emulate on a loaded host, where it stalled past the 1 s default (12 drops in
    // one run). Dropping slow subscribers is md_rcfanout.rs's
    // `rdma_md_rc_fanout_stalled_subscriber_is_dropped_others_unaffected`; this test is about
    // what a recording holds.
    // The publishers linger 10 s for a recorder still behind (a debug build in a loaded
    // emulator was 794 messages behind when a 3 s linger ended, pre-check 12-07).
    let slow = "[market_data.rc_fanout]\nslow_subscriber_ns = 120000000000\n";
    let text = format!(
        "[feed]\ngroup = \"239.9.9.9:26999\"\ninterface = \"{ip}\"\ncapture = {capture:?}\n\
         [publish]\nlocal_ip = \"{ip}\"\n\
         [service]\nidle = {{ kind = \"yield\" }}\nlinger_ms = 10000\n\
         [market_data]\nmax_datagram_payload = 1024\nhistory_depth = {history}\nheartbeat_interval_ns = 1000000\n\
         [market_data.batching]\nmax_messages = 64\nflush_interval_ns = 50000\n\
         [market_data.pacing]\n{pacing}\
         [market_data.recovery]\ntimeout_ns = 50000000\nmax_retries = 5\nsnapshot_timeout_ns = 2000000000\njoin_replay_max = {join}\n\
         {slow}\
         [[market_data.channels]]\nid = 1\nname = \"rec\"\nline_a = \"{group}\"\nport = {port}\n"
    );
    let path = dir.join(format!("fh-{port}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

/// A running `rocebus record`, its stderr lines forwarded.
struct Recording {
    child: Child,
    lines: mpsc::Receiver<String>,
    path: PathBuf,
}

impl Recording {
    fn start(config: &Path, ip: IpAddr, path: PathBuf) -> Self {
        let mut child = Command::new(rocebus())
            .arg("record")
            .arg("--config")
            .arg(config)
            .args(["--local", &ip.to_string(), "--publisher", &ip.to_string()])
            .args(["--progress-ms", "200", "-o"])
            .arg(&path)
            .stderr(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start rocebus record");
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                // Straight to stderr, past the test harness's capture: the guest's log shows
                // how far a slow run got.
                let _ = writeln!(std::io::stderr(), "[record] {l}");
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let r = Self { child, lines, path };
        r.wait_for(
            |l| l.contains("recording channels") || l.contains("waiting for the publisher"),
            "start",
        );
        r
    }

    /// Waits for a stderr line satisfying `f` (180 s at most: the guest may be emulated).
    fn wait_for(&self, mut f: impl FnMut(&str) -> bool, what: &str) {
        let until = Instant::now() + Duration::from_secs(180);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if f(&l) => return,
                Ok(_) => {}
                Err(_) => panic!("rocebus record: no {what} within 180 s"),
            }
        }
    }

    /// Waits until `n` messages were recorded, then stops it with SIGTERM; returns its
    /// final stdout line.
    fn stop_after(self, n: u64) -> (String, PathBuf) {
        self.wait_for(
            |l| {
                l.split_whitespace()
                    .nth(2)
                    .and_then(|w| w.parse::<u64>().ok())
                    .is_some_and(|got| got >= n)
                    && l.contains(" messages (")
            },
            &format!("{n} messages"),
        );
        self.term()
    }

    fn term(self) -> (String, PathBuf) {
        let pid = self.child.id().to_string();
        let st = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(st.success());
        let out = self.child.wait_with_output().expect("wait rocebus record");
        assert!(out.status.success(), "rocebus record: {}", out.status);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("[record] {text}");
        (text, self.path)
    }
}

fn run_feed_handler(config: &Path, counters: &Path) -> u64 {
    let st = Command::new(feed_handler_bin())
        // The recorder is waiting for it: the feed is read once it is connected (with none,
        // a feed that ends before the recorder's connection is up exits at once and the
        // recorder sees nothing: CI pre-check 12-07, over RC fan-out).
        .args([
            "run",
            "--exit-on-end-of-session",
            "--wait-subscribers",
            "1",
            "--config",
        ])
        .arg(config)
        .arg("--counters")
        .arg(counters)
        .status()
        .expect("start feed-handler");
    assert!(st.success(), "feed-handler: {st}");
    let reader = CountersReader::open(counters).expect("counters file");
    let published = reader
        .iter()
        .find(|e| e.label.as_str() == "feed.published")
        .map(|e| e.value)
        .expect("feed.published");
    published
}

#[derive(Default)]
struct Bus(Vec<Vec<u8>>);
impl MdSink for Bus {
    type Error = std::convert::Infallible;
    fn publish(&mut self, _: u16, message: &[u8]) -> Result<(), Self::Error> {
        self.0.push(message.to_vec());
        Ok(())
    }
}

/// The day as a capture file, and its normalized messages per kind: (bbo, levels, trades,
/// status).
fn day(dir: &Path) -> (PathBuf, [u64; 4]) {
    let path = dir.join("day.itch50");
    let (bytes, _) = feed_handler::generate::generate_binaryfile(&DAY);
    std::fs::write(&path, bytes).expect("write capture");
    let mut book = Book::new();
    let mut p = Publisher::new(Bus::default(), 1);
    generate(&DAY, |m| {
        book.apply(&decode_exact(m).expect("valid"), &mut p)
    });
    let mut k = [0u64; 4];
    for m in &p.sink().0 {
        match decode(m).expect("normalized") {
            Normalized::Bbo(_) => k[0] += 1,
            Normalized::Level(_) => k[1] += 1,
            Normalized::Trade(_) => k[2] += 1,
            Normalized::Status(_) => k[3] += 1,
            Normalized::FeedLoss(_) => panic!("no loss in a capture"),
        }
    }
    (path, k)
}

/// A record's bytes with the receive times cleared.
fn without_recv(r: RecordRef<'_>) -> Vec<u8> {
    match r.header().rtype {
        rtype::MBP_1 => {
            let mut m = r.get::<Mbp1Msg>().unwrap().clone();
            (m.ts_recv, m.ts_in_delta) = (0, 0);
            m.as_ref().to_vec()
        }
        rtype::MBP_0 => {
            let mut m = r.get::<TradeMsg>().unwrap().clone();
            (m.ts_recv, m.ts_in_delta) = (0, 0);
            m.as_ref().to_vec()
        }
        rtype::STATUS => {
            let mut m = r.get::<StatusMsg>().unwrap().clone();
            m.ts_recv = 0;
            m.as_ref().to_vec()
        }
        rtype::SYMBOL_MAPPING => r.get::<SymbolMappingMsg>().unwrap().as_ref().to_vec(),
        rtype::ERROR => r.get::<ErrorMsg>().unwrap().as_ref().to_vec(),
        other => panic!("unexpected rtype {other:#x}"),
    }
}

fn records(path: &Path) -> Vec<Vec<u8>> {
    let mut dec = DbnDecoder::from_zstd_file(path).expect("a finished zstd DBN file");
    let mut out = Vec::new();
    while let Some(r) = dec.decode_record_ref().expect("decodes") {
        out.push(without_recv(r));
    }
    out
}

/// Per kind: (bbo, levels, trades, status, snapshot clears, snapshot levels, error texts).
#[derive(Debug, Default)]
struct Read {
    kinds: [u64; 4],
    clears: u64,
    snapshot_levels: u64,
    errors: Vec<String>,
}

fn read(path: &Path) -> Read {
    let mut dec = DbnDecoder::from_zstd_file(path).expect("a finished zstd DBN file");
    let mut r = Read::default();
    while let Some(rec) = dec.decode_record_ref().expect("decodes") {
        if let Some(m) = rec.get::<Mbp1Msg>() {
            let f = m.flags.raw();
            match (f & dbn::flags::SNAPSHOT != 0, m.action as u8) {
                (true, b'R') => r.clears += 1,
                (true, _) => r.snapshot_levels += 1,
                (false, b'N') => r.kinds[0] += 1,
                (false, _) => r.kinds[1] += 1,
            }
        } else if rec.get::<TradeMsg>().is_some() {
            r.kinds[2] += 1;
        } else if rec.get::<StatusMsg>().is_some() {
            r.kinds[3] += 1;
        } else if let Some(e) = rec.get::<ErrorMsg>() {
            r.errors.push(e.err().expect("utf-8").to_owned());
        }
    }
    r
}

#[test]
#[ignore = "rdma: runs the feed handler, rocebus record and feed-handler replay on soft-RoCE"]
fn rdma_record_replay_record_is_identical() {
    record_replay_record(false);
}

/// The same over a channel with `transport = "rc"` (a fabric without multicast): the feed
/// handler, `rocebus record` and `feed-handler replay` all take the channel's transport
/// from the configuration. Before, all three refused it (`WrongTransport`).
#[test]
#[ignore = "rdma: runs the feed handler, rocebus record and feed-handler replay over RC fan-out"]
fn rdma_record_replay_record_is_identical_over_rc() {
    record_replay_record(true);
}

fn record_replay_record(rc: bool) {
    let ip = local_ip();
    let dir = tempfile::tempdir().expect("temp dir");
    let (capture, kinds) = day(dir.path());
    let port = if rc { 7752 } else { 7750 };
    let cfg = config(dir.path(), ip, &capture, "239.7.7.1", port, false);
    if rc {
        let text = std::fs::read_to_string(&cfg).expect("config");
        let text = text.replace("line_a = \"239.7.7.1\"", "transport = \"rc\"");
        assert!(text.contains("transport = \"rc\""), "{text}");
        std::fs::write(&cfg, text).expect("config");
    }

    let rec = Recording::start(&cfg, ip, dir.path().join("first.dbn.zst"));
    let published = run_feed_handler(&cfg, &dir.path().join("fh.counters"));
    assert_eq!(
        published,
        kinds.iter().sum::<u64>(),
        "feed handler published the day"
    );
    let (summary, first) = rec.stop_after(published);
    assert!(
        summary.contains(&format!(" {published} messages (")),
        "{summary}"
    );
    assert!(summary.contains(" 0 bus losses"), "{summary}");
    let got = read(&first);
    assert_eq!(got.kinds, kinds, "recording holds every published message");
    assert!(got.errors.is_empty(), "{:?}", got.errors);

    // Replay the recording and record it again.
    let rec = Recording::start(&cfg, ip, dir.path().join("second.dbn.zst"));
    let out = Command::new(feed_handler_bin())
        .arg("replay")
        .arg(&first)
        .arg("--config")
        .arg(&cfg)
        // Paced: unpaced, the replay outruns a debug-build recorder in an emulated guest
        // (its receive queue overflows), as any publisher would.
        .args(["--linger-ms", "10000", "--rate", "10000"])
        // The recorder is waiting for it: the replay starts once it is connected (a
        // recorder that joined thousands of messages in lost the start: CI pre-check 12-07).
        .args(["--wait-subscribers", "1"])
        .env("RUST_LOG", "info")
        .stderr(Stdio::inherit())
        .output()
        .expect("feed-handler replay");
    assert!(out.status.success(), "feed-handler replay: {}", out.status);
    let totals = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("[replay] {totals}");
    assert!(
        totals.contains(&format!("published: {published},")),
        "{totals}"
    );
    let (_, second) = rec.stop_after(published);
    let (a, b) = (records(&first), records(&second));
    assert_eq!(a.len(), b.len(), "as many records");
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x, y, "record {i} differs");
    }
}

#[test]
#[ignore = "rdma: a starved publisher loses messages for good; the recording says so"]
fn rdma_record_unrecoverable_bus_loss_is_recorded() {
    let ip = local_ip();
    let dir = tempfile::tempdir().expect("temp dir");
    let (capture, _) = day(dir.path());
    let cfg = config(dir.path(), ip, &capture, "239.7.7.2", 7760, true);
    let rec = Recording::start(&cfg, ip, dir.path().join("lossy.dbn.zst"));
    run_feed_handler(&cfg, &dir.path().join("fh.counters"));
    // The feed handler lingered while the recorder resynchronised; what it got is in.
    let (summary, path) = rec.term();
    let got = read(&path);
    eprintln!(
        "recorded {:?}, {} clears, {} snapshot levels, losses {:?}",
        got.kinds,
        got.clears,
        got.snapshot_levels,
        got.errors.len()
    );
    assert!(!got.errors.is_empty(), "no loss recorded: {summary}");
    assert!(
        got.errors
            .iter()
            .all(|e| e.starts_with("rocebus bus loss: channel 1 sequences ")),
        "{:?}",
        got.errors
    );
    assert!(
        summary.contains(&format!(" {} bus losses", got.errors.len())),
        "{summary}"
    );
    assert!(
        got.clears > 0,
        "the resync's snapshot is recorded: {summary}"
    );
}
