//! `rocebus stat --listen` scraped by a real Prometheus server on this host.
//!
//! The counters file is written the way every component publishes (a `CountersFile` in the
//! counters directory, counters allocated and updated through the library's API); the real
//! gateway's counters reach the same endpoint in `order-gateway/tests/metrics.rs`, which
//! runs in the soft-RoCE guest, where Prometheus itself is too slow to start under
//! emulation (still not listening after 60 s; `prometheus --version` alone took 14-26 s).
//!
//! Prometheus is the Debian package `prometheus` (`cargo xtask setup` installs it), or the
//! binary `ROCEBUS_PROMETHEUS` names; without it the test fails and says how to install it.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rocebus::counters::{counters_path, CountersFile, Kind};

/// The Prometheus binary: `ROCEBUS_PROMETHEUS`, else `prometheus` from `PATH`. Fails the
/// test with the install hint when it cannot be run.
fn prometheus() -> String {
    let bin = std::env::var("ROCEBUS_PROMETHEUS")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "prometheus".into());
    let ok = Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "cannot run Prometheus ({bin}): this test scrapes `rocebus stat --listen` with a real \
         Prometheus server. Install it (`apt-get install prometheus`; `cargo xtask setup` \
         does) or point ROCEBUS_PROMETHEUS at its binary"
    );
    bin
}

/// A child process killed and reaped when the test ends, however it ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// `GET path`: the body if the status is 200, else the whole answer as the error.
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
        .ok_or_else(|| format!("no head: {out}"))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(out);
    }
    Ok(body.to_string())
}

/// Percent-encodes a query-string value.
fn encode_query(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The values of an instant query through Prometheus's HTTP API, one per series.
fn query(prom: SocketAddr, q: &str) -> Result<Vec<String>, String> {
    let body = http_get(prom, &format!("/api/v1/query?query={}", encode_query(q)))?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if v["status"] != "success" {
        return Err(body);
    }
    let results = v["data"]["result"].as_array().ok_or_else(|| body.clone())?;
    Ok(results
        .iter()
        .filter_map(|r| r["value"][1].as_str().map(str::to_owned))
        .collect())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn prometheus_scrapes_stat_listen() {
    let prometheus = prometheus();
    let dir = tempfile::tempdir().unwrap();
    let counters = dir.path().join("counters");
    // As the gateway publishes: its counters file, a counter and a gauge.
    let gw = CountersFile::create(counters_path(&counters, "order-gateway"), 8).unwrap();
    let requests = gw.allocate("engine requests").unwrap();
    let open = gw.allocate_with("open orders", Kind::Gauge, 0).unwrap();
    requests.add(4);
    open.set(3);

    let mut stat = Proc(
        Command::new(env!("CARGO_BIN_EXE_rocebus"))
            .args(["stat", "--listen", "127.0.0.1:0", "--dir"])
            .arg(&counters)
            .arg("--sysfs")
            .arg(dir.path().join("no-sysfs"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
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

    let prom_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 100ms\n  scrape_timeout: 90ms\n\
             scrape_configs:\n  - job_name: rocebus\n    \
             static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let log = dir.path().join("prometheus.log");
    let _prom = Proc(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start prometheus"),
    );

    let wait = |q: &str, want: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = query(prom_addr, q);
            if got.as_deref() == Ok(&[want.to_string()][..]) {
                return;
            }
            if Instant::now() >= deadline {
                let targets = http_get(prom_addr, "/api/v1/targets").unwrap_or_else(|e| e);
                panic!(
                    "Prometheus answers {got:?} to {q}, want [{want}]\ntargets: {targets}\n\
                     prometheus log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let sel = r#"{component="order-gateway",job="rocebus"}"#;
    wait(&format!("rocebus_engine_requests_total{sel}"), "4");
    wait(&format!("rocebus_open_orders{sel}"), "3");
    wait(r#"up{job="rocebus"}"#, "1");

    // Every scrape reads the counters again: new values, and a component started since.
    requests.add(6);
    let fh = CountersFile::create(counters_path(&counters, "feed-handler"), 4).unwrap();
    fh.allocate("md.ch1.delivered").unwrap().add(25);
    wait(&format!("rocebus_engine_requests_total{sel}"), "10");
    fh.allocate("md.ch2.delivered").unwrap().add(7);
    // One metric, the channel a label.
    wait(
        r#"rocebus_md_delivered_total{component="feed-handler",channel="1"}"#,
        "25",
    );
    wait(
        r#"sum(rocebus_md_delivered_total{component="feed-handler"})"#,
        "32",
    );
    wait(r#"rocebus_process_up{component="feed-handler"}"#, "1");
}

/// `promtool` beside the Prometheus binary (Debian's `prometheus` package ships both).
fn promtool() -> String {
    let prom = prometheus();
    let beside = std::path::Path::new(&prom).with_file_name("promtool");
    if beside.is_absolute() && beside.exists() {
        beside.display().to_string()
    } else {
        "promtool".into()
    }
}

/// Every shape of counter label the components use, a process that has exited and an RDMA
/// device's counters, printed by `rocebus stat --prometheus` and checked by Prometheus's own
/// `promtool check metrics` (parse errors and lint problems both fail it): the page is valid
/// exposition, metric names carry no channel, slot, reason or pid, and the exited process is
/// marked `rocebus_process_up 0`.
#[test]
fn promtool_accepts_stat_prometheus() {
    let promtool = promtool();
    let dir = tempfile::tempdir().unwrap();
    let counters = dir.path().join("counters");
    let gw = CountersFile::create(counters_path(&counters, "order-gateway"), 32).unwrap();
    gw.allocate("engine requests").unwrap().add(4);
    gw.allocate_with("open orders", Kind::Gauge, 0)
        .unwrap()
        .set(3);
    gw.allocate("md.ch1.delivered").unwrap().add(10);
    gw.allocate("md.ch2.delivered").unwrap().add(11);
    gw.allocate("engines disconnected: too many malformed frames")
        .unwrap()
        .add(1);
    gw.allocate("engines disconnected: silent past engine_timeout_ms")
        .unwrap()
        .add(2);
    gw.allocate("odd \"quoted\" \\ label: with \"quotes\"")
        .unwrap()
        .add(5);
    gw.allocate("gaps").unwrap().add(1);
    gw.allocate("gaps").unwrap().add(2);
    let fh = CountersFile::create(counters_path(&counters, "feed-handler"), 32).unwrap();
    for k in 0..2 {
        fh.allocate_with(&format!("md.pub.ch0.sub{k}.lag"), Kind::Gauge, 0)
            .unwrap()
            .set(k);
        fh.allocate(&format!("md.pub.ch0.sub{k}.repairs_asked"))
            .unwrap()
            .add(k);
    }
    fh.allocate_with("md.pub.ch0.subscribers", Kind::Gauge, 0)
        .unwrap()
        .set(2);
    // A process that has exited: its file stays, its writer's pid is gone.
    let old = counters_path(&counters, "sample-engine");
    let engine = CountersFile::create(&old, 4).unwrap();
    engine.allocate("orders sent").unwrap().add(9);
    drop(engine);
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let mut bytes = std::fs::read(&old).unwrap();
    bytes[24..28].copy_from_slice(&gone_pid.to_ne_bytes());
    std::fs::write(&old, &bytes).unwrap();
    let sysfs = dir.path().join("sys");
    let hw = sysfs.join("rxe0/ports/1/hw_counters");
    std::fs::create_dir_all(&hw).unwrap();
    std::fs::write(hw.join("rcvd_pkts"), "12\n").unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_rocebus"))
        .args(["stat", "--prometheus", "--dir"])
        .arg(&counters)
        .arg("--sysfs")
        .arg(&sysfs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let page = String::from_utf8(out.stdout).unwrap();

    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {promtool}: {e} (`apt-get install prometheus`)"));
    check
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let verdict = check.wait_with_output().unwrap();
    assert!(
        verdict.status.success() && verdict.stdout.is_empty() && verdict.stderr.is_empty(),
        "promtool check metrics refused the page:\n{}{}\npage:\n{page}",
        String::from_utf8_lossy(&verdict.stdout),
        String::from_utf8_lossy(&verdict.stderr)
    );

    for want in [
        "rocebus_md_delivered_total{component=\"order-gateway\",channel=\"2\"} 11\n",
        "rocebus_engines_disconnected_total{component=\"order-gateway\",reason=\"silent past engine_timeout_ms\"} 2\n",
        "rocebus_md_pub_subscriber_lag{component=\"feed-handler\",channel=\"0\",peer=\"1\"} 1\n",
        "rocebus_process_up{component=\"order-gateway\"} 1\n",
        "rocebus_process_up{component=\"sample-engine\"} 0\n",
        "rocebus_orders_sent_total{component=\"sample-engine\"} 9\n",
        "rocebus_nic_total{device=\"rxe0\",port=\"1\",group=\"hw_counters\",counter=\"rcvd_pkts\"} 12\n",
    ] {
        assert!(page.contains(want), "no {want:?} in\n{page}");
    }
    assert!(!page.contains("pid="), "{page}");
    assert!(
        !page.contains("_ch1_") && !page.contains("_sub0_"),
        "{page}"
    );
}
