//! The operator's metrics path end to end, on a real RDMA device (soft-RoCE in the project's
//! guest; `cargo xtask test` runs it, a plain `cargo test` reports it ignored): the real
//! `order-gateway run --venue sim` binary, subscribed to a market-data publisher and traded
//! by an engine over RC, publishes its counters file; `rocebus stat --listen` serves it on
//! `/metrics`, and the page must carry the gateway's counters (service and market data)
//! with the values the file holds.
//!
//! The GID each side of the orders path sends from is in `rocebus stat` too (issue 43): the
//! gateway's engine listener and an engine's connection, each bound to an address added for
//! the test (so its GID is not the device's first IPv4 entry) with `gid_index` naming that
//! entry; what `rocebus stat --once` and `--json` must show (index, GID, type, netdev,
//! device, port, MTU) is read from sysfs and `ibv_devinfo`.
//!
//! That a real Prometheus server scrapes and queries this endpoint is tested on the host
//! (`cli/tests/prometheus.rs`): under the guest's emulation Prometheus was still not
//! listening 60 s after it was started (`prometheus --version` alone took 14-26 s).

mod common;
#[path = "../../core/tests/support/gid_stat.rs"]
mod gid_stat;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{free_port, local_ip, scratch, ACCOUNT, ENGINE, ENGINE_TOKEN};
use feed_handler::book::{Event as BookEvent, Level, Side as BookSide};
use feed_handler::itch::Stock;
use feed_handler::normalized;
use feed_handler::view::MarketView;
use gid_stat::{assert_stat_names, second_address_gid, wait_for_label, KernelGid, Service};
use order_gateway::client::{Client, EngineSession, LogonProgress};
use order_gateway::proto::{Side, Symbol, PRICE_SCALE};
use rocebus::clock::{now_ns, Mono};
use rocebus::counters::{counters_path, CountersFile, CountersReader};
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::{Handler, McastPublisher};
use rocebus::orders::OrdersConfig;

const CHANNEL: u16 = 17;
/// Keys of 128 bits (`rocebus keygen --bits 128`): the binary refuses guessable ones.
const ORDERS_TOKEN: &str = "6f1d3a9c0b7e42d58a1f9c3e7b2d4a60";
/// Orders the engine sends: the value `engine requests` must reach Prometheus with.
const ORDERS: u64 = 4;

/// The `rocebus` binary, built next to this package's binaries when the workspace's
/// binaries are built (as `cargo xtask test` does).
fn rocebus_bin() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_order-gateway")).with_file_name("rocebus");
    assert!(
        p.exists(),
        "{} missing: build the workspace's binaries first (`cargo build --workspace --bins`)",
        p.display()
    );
    p
}

fn bus_toml(port: u16) -> String {
    format!(
        r#"
max_datagram_payload = 1024
history_depth = 1024
heartbeat_interval_ns = 1000000
[batching]
max_messages = 64
flush_interval_ns = 20000
[recovery]
timeout_ns = 50000000
max_retries = 20
snapshot_timeout_ns = 2000000000
[[channels]]
id = {CHANNEL}
name = "metrics"
line_a = "239.9.0.17"
port = {port}
"#
    )
}

/// The gateway binary's config with the venue simulator: `extra` ends it (`[market_data]`,
/// `[rdma]`).
fn gateway_toml(listen: SocketAddr, dir: &Path, extra: &str) -> String {
    format!(
        r#"
[service]
listen = "{listen}"
idle = {{ kind = "backoff", max_spins = 1000, max_yields = 100, max_park_us = 50 }}
reconnect_secs = 1
logon_timeout_ms = 5000
control_socket = "{dir}/gw.control"
counters = true
[service.orders]
token = "{ORDERS_TOKEN}"
ring_size = 65536
max_payload = 1024
[fix]
venue_addr = "sim"
sender_comp_id = "GW"
target_comp_id = "VENUE"
heartbeat_secs = 30
[journal]
path = "{dir}/gw.journal"
fsync = "never"
[risk]
reference_max_age_ms = 60000
throttle_interval_ms = 1000
[[risk.accounts]]
id = {ACCOUNT}
max_order_qty = 100000
max_order_notional = 100000000
credit_limit = 1000000000000
max_position = 1000000000
max_open_orders = 100000
max_orders_per_interval = 100000
collar_bps = 500
[[risk.engines]]
id = {ENGINE}
accounts = [{ACCOUNT}]
token = "{ENGINE_TOKEN}"
{extra}"#,
        dir = dir.display()
    )
}

/// The gateway's `[market_data]`: reference prices from the bus of `bus.toml` on `ip`.
fn market_data_toml(ip: IpAddr) -> String {
    format!(
        r#"[market_data]
config = "bus.toml"
channels = [{CHANNEL}]
local = "{ip}"
publisher = "{ip}"
confirm_ms = 50
reconnect_ms = 200
"#
    )
}

/// The feed handler's messages for one quote: both levels, then the BBO.
fn quote(locate: u16, s: &str, bid: u32, ask: u32) -> Vec<Vec<u8>> {
    let stock = Stock::new(s);
    let lvl = |price| Level {
        price,
        shares: 100,
        orders: 1,
    };
    let events = [
        BookEvent::Level {
            locate,
            stock,
            timestamp: 1,
            side: BookSide::Bid,
            level: lvl(bid),
        },
        BookEvent::Level {
            locate,
            stock,
            timestamp: 1,
            side: BookSide::Ask,
            level: lvl(ask),
        },
        BookEvent::Bbo {
            locate,
            stock,
            timestamp: 1,
            bid: Some(lvl(bid)),
            ask: Some(lvl(ask)),
        },
    ];
    events
        .iter()
        .map(|e| {
            let mut buf = [0u8; normalized::MAX_LEN];
            let n = normalized::encode(e, &mut buf);
            buf[..n].to_vec()
        })
        .collect()
}

/// The feed handler's side: a publisher on its own thread, serving snapshots from a view.
struct Feed {
    tx: Option<mpsc::Sender<Vec<Vec<u8>>>>,
    thread: Option<JoinHandle<()>>,
}

impl Feed {
    fn start(cfg: McastConfig, ip: IpAddr) -> Feed {
        let (tx, rx) = mpsc::channel::<Vec<Vec<u8>>>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut p = McastPublisher::new(&cfg, CHANNEL, now_ns(), ip).expect("publisher");
            ready_tx.send(()).unwrap();
            let mut view = MarketView::new();
            loop {
                match rx.try_recv() {
                    Ok(msgs) => {
                        for m in msgs {
                            let seq = p.offer(Mono::now(), &m).expect("publish");
                            view.on_message(seq, &m);
                        }
                        p.flush(Mono::now()).unwrap();
                    }
                    Err(mpsc::TryRecvError::Disconnected) => return,
                    Err(mpsc::TryRecvError::Empty) => {}
                }
                p.poll(Mono::now(), &view).expect("publisher poll");
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("publisher up");
        Feed {
            tx: Some(tx),
            thread: Some(thread),
        }
    }

    fn publish(&self, msgs: Vec<Vec<u8>>) {
        self.tx.as_ref().unwrap().send(msgs).unwrap();
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A child process killed (and reaped) when the test ends, however it ends.
struct Proc(Child);

impl Proc {
    /// Sends `signal` and waits up to 10 s for the exit; true if it exited with status 0.
    fn stop(&mut self, signal: rustix::process::Signal) -> bool {
        let pid = rustix::process::Pid::from_child(&self.0);
        let _ = rustix::process::kill_process(pid, signal);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.0.try_wait() {
                return st.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// The gateway's counter `label` as its counters file holds it now.
fn file_value(path: &Path, label: &str) -> Option<u64> {
    let reader = CountersReader::open(path).ok()?;
    let value = reader
        .iter()
        .find(|e| e.label.as_str() == label)
        .map(|e| e.value);
    value
}

/// Waits until the file's counter `label` equals `want`.
fn wait_file(path: &Path, label: &str, want: u64, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = file_value(path, label);
        if got == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{label:?} in {} is {got:?}, want {want}; gateway log:\n{}",
            path.display(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET path` from an HTTP server; the body, if the status is 200.
fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or(format!("no head: {out}"))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{head}\n{body}"));
    }
    Ok(body.to_string())
}

/// The value of the sample `name{component="order-gateway",...}` on a Prometheus page.
/// The value of the gateway's series `name` with the extra labels `labels` (`,k="v"`...).
fn page_value(page: &str, name: &str, labels: &str) -> Option<u64> {
    let prefix = format!("{name}{{component=\"order-gateway\"{labels}}} ");
    page.lines()
        .find(|l| l.starts_with(&prefix))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// The soft-RoCE device the guest runs on and its `sent_pkts` counter file.
fn rxe_sent_pkts() -> (String, PathBuf) {
    let root = Path::new("/sys/class/infiniband");
    let mut devices: Vec<_> = std::fs::read_dir(root)
        .expect("an RDMA device")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    devices.sort();
    devices
        .into_iter()
        .map(|d| {
            let f = root.join(&d).join("ports/1/hw_counters/sent_pkts");
            (d, f)
        })
        .find(|(_, f)| f.exists())
        .expect("a soft-RoCE device with hw_counters/sent_pkts")
}

#[test]
#[ignore = "rdma: runs order-gateway on an RDMA device, its counters served by rocebus stat --listen"]
fn gateway_counters_reach_metrics_endpoint() {
    let t0 = Instant::now();
    let step = |what: &str| eprintln!("{:>6.1} s  {what}", t0.elapsed().as_secs_f64());
    let rocebus = rocebus_bin();
    let ip = local_ip();
    let dir = scratch("metrics");
    let counters = dir.join("counters");
    let bus_port = free_port();
    std::fs::write(dir.join("bus.toml"), bus_toml(bus_port)).unwrap();
    let feed = Feed::start(McastConfig::from_toml_str(&bus_toml(bus_port)).unwrap(), ip);

    // The real gateway binary, with the venue simulator and the bus for reference prices.
    let listen = SocketAddr::new(ip, free_port());
    std::fs::write(
        dir.join("gw.toml"),
        gateway_toml(listen, &dir, &market_data_toml(ip)),
    )
    .unwrap();
    let gw_log = dir.join("gw.log");
    let mut gw = Proc(
        Command::new(env!("CARGO_BIN_EXE_order-gateway"))
            .args(["run", "--venue", "sim", "--config"])
            .arg(dir.join("gw.toml"))
            .env("ROCEBUS_DIR", &counters)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&gw_log).unwrap())
            .spawn()
            .expect("start order-gateway"),
    );
    let file = counters_path(&counters, "order-gateway");
    wait_file(&file, "fix session active", 1, &gw_log);
    wait_file(&file, "md channels subscribed", 1, &gw_log);
    step("gateway up, FIX session active, market data subscribed");

    // Market data: one quote (3 messages) reaches the gateway's subscriber.
    let md_messages = quote(1, "AAPL", 990_000, 1_010_000);
    let md_count = md_messages.len() as u64;
    feed.publish(md_messages);
    wait_file(&file, "md messages", md_count, &gw_log);
    step("market data applied");

    // An engine sends its orders and waits for each answer.
    let mut engine = EngineSession::connect(
        &OrdersConfig {
            ring_size: 65536,
            max_payload: 1024,
            token: ORDERS_TOKEN.into(),
            ..OrdersConfig::default()
        },
        listen,
        ENGINE,
        ENGINE_TOKEN,
        1,
    )
    .expect("engine logon");
    for _ in 0..ORDERS {
        let id = engine
            .new_order(
                ACCOUNT,
                Symbol::new("AAPL").unwrap(),
                Side::Buy,
                10,
                100 * PRICE_SCALE,
            )
            .expect("order queued");
        engine.flush().expect("flush");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut answered = false;
        while !answered {
            assert!(Instant::now() < deadline, "no answer to order {id}");
            engine
                .poll(|r| answered |= r.is_ok_and(|r| r.cl_ord_id() == id), 64)
                .expect("engine connection");
        }
    }
    wait_file(&file, "engine requests", ORDERS, &gw_log);
    wait_file(&file, "engine logons", 1, &gw_log);
    step("orders answered");

    // The endpoint, on a port of its choosing: it prints the address it serves.
    let mut stat = Proc(
        Command::new(&rocebus)
            .args(["stat", "--listen", "127.0.0.1:0", "--dir"])
            .arg(&counters)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start rocebus stat --listen"),
    );
    let mut line = String::new();
    BufReader::new(stat.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let target: SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split("/metrics").next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    step("rocebus stat --listen up");

    // The page carries the values the gateway's file holds (which no longer change: the
    // engine and the feed are quiet).
    let md_delivered = file_value(&file, &format!("md.ch{CHANNEL}.delivered")).unwrap();
    assert!(
        md_delivered >= md_count,
        "subscriber delivered {md_delivered}"
    );
    // The NIC's own counters ride along as one labelled metric: soft-RoCE's packets sent,
    // which the RC traffic above moved, read from sysfs around the scrape.
    let (nic, sent_file) = rxe_sent_pkts();
    let read_sent = || -> u64 {
        std::fs::read_to_string(&sent_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let sent_before = read_sent();
    let page = http_get(target, "/metrics").expect("GET /metrics");
    let sent_after = read_sent();
    let series = format!(
        "rocebus_nic_total{{device=\"{nic}\",port=\"1\",group=\"hw_counters\",counter=\"sent_pkts\"}} "
    );
    let sent: u64 = page
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} on /metrics:\n{page}"));
    assert!(
        sent > 0 && sent_before <= sent && sent <= sent_after,
        "{nic} sent_pkts {sent} on the page, {sent_before}..{sent_after} in sysfs"
    );
    assert!(
        page.contains("# TYPE rocebus_nic_total counter\n"),
        "{page}"
    );
    let channel = format!(",channel=\"{CHANNEL}\"");
    let expect = [
        ("rocebus_engine_requests_total", "", ORDERS),
        ("rocebus_engine_logons_total", "", 1),
        ("rocebus_fix_session_active", "", 1),
        ("rocebus_md_messages_total", "", md_count),
        ("rocebus_md_channels_subscribed", "", 1),
        ("rocebus_md_delivered_total", channel.as_str(), md_delivered),
        ("rocebus_process_up", "", 1),
    ];
    for (name, labels, want) in &expect {
        assert_eq!(
            page_value(&page, name, labels),
            Some(*want),
            "{name}{{{labels}}} on /metrics:\n{page}"
        );
    }
    // Stable names: the channel is a label, never part of the name; no pid label.
    assert!(
        page.contains("# TYPE rocebus_md_delivered_total counter\n"),
        "{page}"
    );
    assert!(!page.contains("pid=\""), "{page}");

    // SIGTERM stops the endpoint cleanly.
    assert!(
        stat.stop(rustix::process::Signal::TERM),
        "rocebus stat --listen did not exit cleanly on SIGTERM"
    );
    gw.stop(rustix::process::Signal::INT);
    drop(feed);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts `order-gateway run --venue sim` listening on `listen` from the entry of `gid`
/// (`[rdma] gid_index`), its counters in `dir/counters`, logging at its own default.
fn start_gid_gateway(dir: &Path, listen: SocketAddr, gid: &KernelGid) -> (Service, PathBuf) {
    let config = dir.join("gw.toml");
    let text = gateway_toml(listen, dir, &format!("[rdma]\ngid_index = {}\n", gid.index));
    std::fs::write(&config, text).unwrap();
    let counters = dir.join("counters");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_order-gateway"));
    cmd.args(["run", "--venue", "sim", "--config"])
        .arg(&config)
        .env("ROCEBUS_DIR", &counters)
        .env_remove("RUST_LOG");
    let gw = Service::spawn(cmd, dir.join("gw.log"));
    (gw, counters_path(&counters, "order-gateway"))
}

#[test]
#[ignore = "rdma: runs order-gateway on an RDMA device and reads its GID with rocebus stat"]
fn rdma_gateway_stat_names_the_listener_gid() {
    let (second, want) = second_address_gid(141);
    let dir = scratch("stat-gid-gw");
    let listen = SocketAddr::new(second.ip(), free_port());
    let (gw, file) = start_gid_gateway(&dir, listen, &want);
    gw.assert_reports(
        &rocebus_bin(),
        &file,
        "order-gateway",
        "engine listener GID",
        &want,
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The engine's side through the engine crate's `EngineSession::export_rdma`, as the demo's
/// `sample-engine` calls it, connected from a third address with its `rc.gid_index` (what
/// an engine's `[rdma] gid_index` sets): the entry its queue pair sends from.
#[test]
#[ignore = "rdma: connects an engine to order-gateway on an RDMA device and reads its GID with rocebus stat"]
fn rdma_engine_stat_names_its_gateway_connection_gid() {
    let (gw_addr, gw_gid) = second_address_gid(142);
    let (engine_addr, want) = second_address_gid(143);
    assert_ne!(want.index, gw_gid.index);
    let dir = scratch("stat-gid-engine");
    let listen = SocketAddr::new(gw_addr.ip(), free_port());
    let (gw, gw_file) = start_gid_gateway(&dir, listen, &gw_gid);
    wait_for_label(&gw_file, "rdma.gid_index", &gw.log);
    let mut cfg = OrdersConfig {
        ring_size: 65536,
        max_payload: 1024,
        token: ORDERS_TOKEN.into(),
        // The gateway has only just started (under emulation, on a loaded host).
        connect_timeout_ms: 30_000,
        ..OrdersConfig::default()
    };
    cfg.rc.gid_index = Some(u8::try_from(want.index).unwrap());
    let mut logon = EngineSession::start(
        &cfg,
        listen,
        engine_addr.ip(),
        ENGINE,
        ENGINE_TOKEN,
        Client::new(1),
    )
    .expect("engine logon starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let session = loop {
        let step = logon.poll().unwrap_or_else(|e| {
            panic!(
                "engine logon from {} failed: {e:?}; gateway log:\n{}",
                engine_addr.0,
                std::fs::read_to_string(&gw.log).unwrap_or_default()
            )
        });
        match step {
            LogonProgress::Done(s) => break s,
            LogonProgress::Pending(p) => logon = p,
        }
        assert!(
            Instant::now() < deadline,
            "engine logon timed out; gateway log:\n{}",
            std::fs::read_to_string(&gw.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let counters = dir.join("engine-counters");
    let file = CountersFile::create(counters_path(&counters, "engine"), 16).unwrap();
    let _rdma = session.export_rdma(&file, &cfg.rc).unwrap();
    let shown = assert_stat_names(&rocebus_bin(), &counters, "engine", &want);
    // Its own entry, not the gateway's.
    assert!(!shown.contains(&gw_gid.gid.to_string()), "{shown}");
    drop(session);
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `cmd` until it exits (at most `limit`): its status and its standard error.
fn run_to_exit(mut cmd: Command, limit: Duration) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "still running after {limit:?}: {}",
                reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, reader.join().unwrap())
}

/// A gateway whose `[service] core` names a core it cannot be pinned to stops with an
/// error naming it (issue 42): a trading thread that silently runs unpinned shares its core
/// and its cache with whatever the scheduler puts there. Without the check it would start
/// and run (the test would time out waiting for it to exit).
#[test]
#[ignore = "rdma: runs order-gateway on an RDMA device with a core it cannot pin to"]
fn rdma_gateway_with_a_core_it_cannot_pin_to_exits_with_an_error() {
    let dir = scratch("pin-gw");
    let listen = SocketAddr::new(local_ip(), free_port());
    let config = dir.join("gw.toml");
    let text = gateway_toml(listen, &dir, "").replace("[service]\n", "[service]\ncore = 100000\n");
    std::fs::write(&config, text).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_order-gateway"));
    cmd.args(["run", "--venue", "sim", "--config"])
        .arg(&config)
        .env("ROCEBUS_DIR", dir.join("counters"));
    let (status, stderr) = run_to_exit(cmd, Duration::from_secs(60));
    assert!(!status.success(), "exited {status:?}: {stderr}");
    assert!(
        stderr.contains("core 100000"),
        "the error does not name the core: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
