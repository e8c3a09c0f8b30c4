//! Test harness: a real QuickFIX venue subprocess and a gateway with an in-process engine.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use order_gateway::client::{Client, OrderState};
use order_gateway::driver::FixDriver;
use order_gateway::fix::SessionConfig;
use order_gateway::journal::FsyncPolicy;
use order_gateway::proto::{Side, Symbol, PRICE_SCALE};
use order_gateway::risk::RiskConfig;
use order_gateway::unix_nanos;

pub const ENGINE: u32 = 1;
pub const ACCOUNT: u32 = 7;
/// A 128-bit key, as `rocebus keygen --bits 128` prints: the binary refuses guessable tokens.
pub const ENGINE_TOKEN: &str = "0c4e8a2f6b1d9e3a5c7f0b2d4e6a8c1f";

/// The guest's address (`ROCEBUS_GUEST_ADDR`), else the RDMA device's IPv4 GID.
pub fn local_ip() -> IpAddr {
    if let Some(a) = std::env::var("ROCEBUS_GUEST_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
    {
        return a;
    }
    let ctx = rocebus::verbs::Context::open(None).expect("an RDMA device");
    let i = ctx.default_gid_index(1).unwrap();
    IpAddr::V4(ctx.query_gid(1, i).unwrap().ipv4().expect("IPv4 GID"))
}

/// A port for a listener of a test: one no TCP socket holds, that this process has not
/// handed out before, and below the kernel's ephemeral range (32768 and up by default).
/// The tests bind rdma_cm ports, which the TCP port allocator does not see, and rdma_cm
/// takes the ports of its own connecting ids from that ephemeral range: a port the TCP
/// allocator offers there can be one an rdma_cm connection holds, or one this process
/// handed out a moment ago to another rdma_cm listener ("Address already in use" from
/// `rdma_bind_addr`, seen in a CI run).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    // A start that differs between the processes of one guest (tests run one process at
    // a time, but a port may linger in a listener's teardown).
    let seed = std::process::id() as u64 * 7919
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()));
    const LOW: u64 = 20_000;
    const SPAN: u64 = 12_000;
    for i in 0..SPAN {
        let port = (LOW + (seed + i * 97) % SPAN) as u16;
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN);
}

/// A fresh scratch directory under the system temp dir (`/tmp`, writable in the guest too).
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("order-gateway-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The Python that runs the venue: `ROCEBUS_PYTHON` (set by `cargo xtask test` to the venv
/// with quickfix), else `PYTHON`, else `python3` from `PATH`.
pub fn python() -> String {
    ["ROCEBUS_PYTHON", "PYTHON"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "python3".into())
}

/// The QuickFIX venue subprocess.
pub struct Venue {
    child: Child,
    stdin: ChildStdin,
    pub port: u16,
    pub dir: PathBuf,
}

impl Venue {
    /// Starts `venue/venue.py`; fails the test with instructions if Python or QuickFIX is absent.
    pub fn start(dir: &Path, port: u16) -> Venue {
        Venue::start_with(dir, port, &[])
    }

    /// [`Venue::start`] with more venue.py options (`--reset-on-logon`, `--username U`...).
    pub fn start_with(dir: &Path, port: u16, args: &[&str]) -> Venue {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("venue/venue.py");
        let python = python();
        let mut child = Command::new(&python)
            .arg(&script)
            .arg("--port")
            .arg(port.to_string())
            .arg("--dir")
            .arg(dir)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {python}: {e}. Install Python 3 and `pip install -r order-gateway/venue/requirements.txt`")
            });
        let stdin = child.stdin.take().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.starts_with("READY") {
            let status = child.wait().unwrap();
            panic!(
                "QuickFIX venue did not start ({status}); is quickfix installed? \
                 `pip install -r order-gateway/venue/requirements.txt` (see stderr above)"
            );
        }
        Venue {
            child,
            stdin,
            port,
            dir: dir.to_owned(),
        }
    }

    /// Sends a command line to the venue (see venue.py: `reset`, `seqreset N`).
    pub fn command(&mut self, line: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Whether the venue process is still running (QuickFIX has not killed it).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, like a crash.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `received.log` lines: (msgtype or "dup", ClOrdID, ...).
    pub fn received(&self) -> Vec<Vec<String>> {
        received(&self.dir)
    }

    /// See [`logons_received`].
    pub fn logons_received(&self) -> usize {
        logons_received(&self.dir)
    }
}

/// Logons from the gateway (35=A from GW) that reached QuickFIX, accepted or not: its FileLog
/// records every incoming message (`<dir>/log/*.messages.current.log`) before checking it.
pub fn logons_received(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir.join("log")) else {
        return 0;
    };
    let mut n = 0;
    for p in entries.map(|e| e.unwrap().path()) {
        if !p.to_string_lossy().ends_with("messages.current.log") {
            continue;
        }
        n += std::fs::read_to_string(&p)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                let fields: Vec<&str> = l.split('\x01').collect();
                fields.contains(&"35=A") && fields.contains(&"49=GW")
            })
            .count();
    }
    n
}

pub fn received(dir: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(dir.join("received.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('|').map(str::to_owned).collect())
        .collect()
}

impl Drop for Venue {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn risk_config() -> RiskConfig {
    toml::from_str(&format!(
        r#"
        reference_max_age_ms = 3600000
        throttle_interval_ms = 1000
        restricted_symbols = ["XXXX"]
        # These tests stream the same few orders; the repeated-order check has its own.
        max_identical_orders = 0
        [[accounts]]
        id = {ACCOUNT}
        max_order_qty = 100000
        max_order_notional = 100000000
        credit_limit = 1000000000000
        max_position = 1000000000
        max_open_orders = 100000
        max_orders_per_interval = 1000000
        collar_bps = 1000
        [[engines]]
        id = {ENGINE}
        accounts = [{ACCOUNT}]
        token = "{ENGINE_TOKEN}"
        "#
    ))
    .unwrap()
}

pub fn session_config() -> SessionConfig {
    SessionConfig {
        sender_comp_id: "GW".into(),
        target_comp_id: "VENUE".into(),
        heartbeat_secs: 5,
        resend_timeout_ms: 0,
        ..Default::default()
    }
}

pub fn symbols() -> [Symbol; 3] {
    [
        Symbol::new("AAPL").unwrap(),
        Symbol::new("MSFT").unwrap(),
        Symbol::new("REJ").unwrap(),
    ]
}

/// Opens the gateway on `journal` and logs on to the venue at `port`.
pub fn gateway(port: u16, journal: &Path) -> FixDriver {
    gateway_with(port, journal, FsyncPolicy::Never)
}

/// [`gateway`] with a sync policy.
pub fn gateway_with(port: u16, journal: &Path, fsync: FsyncPolicy) -> FixDriver {
    gateway_session(port, journal, fsync, session_config())
}

/// [`gateway`] with a sync policy and session parameters.
pub fn gateway_session(
    port: u16,
    journal: &Path,
    fsync: FsyncPolicy,
    session: SessionConfig,
) -> FixDriver {
    let mut d = FixDriver::open_with(
        &format!("127.0.0.1:{port}"),
        session,
        &risk_config(),
        journal,
        fsync,
    )
    .unwrap();
    d.with_gateway(|gw, _| {
        for s in symbols() {
            gw.on_reference_price(s, 100 * PRICE_SCALE, unix_nanos());
        }
    })
    .unwrap();
    connect(&mut d);
    d
}

/// Connects and waits for the session to become active.
pub fn connect(d: &mut FixDriver) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if !d.is_connected() && d.connect().is_err() {
            assert!(Instant::now() < deadline, "could not connect to the venue");
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        d.poll(Duration::from_millis(5)).unwrap();
        if d.gateway().session().state() == order_gateway::fix::SessionState::Active {
            return;
        }
        assert!(Instant::now() < deadline, "FIX logon did not complete");
    }
}

/// Engine-side bookkeeping: every response delivered, counting duplicates of final answers.
#[derive(Default)]
pub struct Engine {
    pub client: Client,
    pub errors: Vec<String>,
    pub responses: u64,
    pub finals: HashMap<u64, u32>,
    pub cancels_sent: std::collections::HashSet<u64>,
}

impl Engine {
    pub fn new(first_id: u64) -> Engine {
        Engine {
            client: Client::new(first_id),
            ..Engine::default()
        }
    }

    pub fn deliver(&mut self, d: &mut FixDriver) {
        for (engine, r) in d.take_engine_responses() {
            assert_eq!(engine, ENGINE);
            self.responses += 1;
            match self.client.on_response(r.as_bytes()) {
                Ok(_) => {
                    let id = r.cl_ord_id();
                    if self.client.order(id).is_some_and(|o| o.state.is_final()) {
                        *self.finals.entry(id).or_default() += 1;
                    }
                }
                Err(e) => self.errors.push(format!("{e:?} for {}", r.cl_ord_id())),
            }
        }
    }

    /// Sends order number `i` of the standard mix.
    pub fn send(&mut self, d: &mut FixDriver, i: u64) -> u64 {
        let [aapl, msft, rej] = symbols();
        let (sym, qty) = match i % 10 {
            0..=4 => (aapl, 50),
            5..=8 => (msft, 300),
            _ if i % 20 == 9 => (rej, 10),
            _ => (aapl, 2000),
        };
        let side = if i % 2 == 0 { Side::Buy } else { Side::Sell };
        let (id, m) = self
            .client
            .new_order(ACCOUNT, sym, side, qty, 100 * PRICE_SCALE);
        d.engine_message(ENGINE, zerocopy::IntoBytes::as_bytes(&m))
            .unwrap();
        id
    }

    pub fn open(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .client
            .orders()
            .filter(|(_, o)| !o.state.is_final())
            .map(|(id, _)| id)
            .collect();
        v.sort_unstable();
        v
    }

    /// Cancels every resting order (acked, unfilled, big).
    pub fn cancel_resting(&mut self, d: &mut FixDriver) {
        let resting: Vec<u64> = self
            .client
            .orders()
            .filter(|(id, o)| {
                o.state == OrderState::New && o.qty > 1000 && !self.cancels_sent.contains(id)
            })
            .map(|(id, _)| id)
            .collect();
        self.cancels_sent.extend(&resting);
        for id in resting {
            let c = self.client.cancel(id);
            d.engine_message(ENGINE, zerocopy::IntoBytes::as_bytes(&c))
                .unwrap();
        }
    }
}

/// Polls until `done` or the deadline.
pub fn pump(d: &mut FixDriver, e: &mut Engine, secs: u64, mut done: impl FnMut(&Engine) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done(e) {
        assert!(
            Instant::now() < deadline,
            "timed out; open orders: {:?}; client errors: {:?}",
            &e.open()[..e.open().len().min(10)],
            &e.errors[..e.errors.len().min(10)]
        );
        d.poll(Duration::from_millis(2)).unwrap();
        e.deliver(d);
    }
}
