//! Runs the `rocebus` binary against a counters file made by the test.

use std::process::Command;

use rocebus::counters::{counters_path, CountersFile, Kind};

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rocebus"))
        .args(args)
        .output()
        .expect("run rocebus");
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

#[test]
fn stat_once_and_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let file = CountersFile::create(counters_path(dir.path(), "feed-handler"), 16).unwrap();
    let msgs = file.allocate("messages received").unwrap();
    let low = file.allocate_with("rq low water", Kind::Gauge, 0).unwrap();
    msgs.add(12345);
    low.set(17);
    let sysfs = dir.path().join("sys");
    let dir_s = dir.path().to_str().unwrap();
    let sysfs_s = sysfs.to_str().unwrap();

    let (ok, out, err) = run(&["stat", "--dir", dir_s, "--once", "--sysfs", sysfs_s]);
    assert!(ok, "{err}");
    let pid = std::process::id();
    assert!(
        out.contains(&format!("feed-handler  pid {pid} (running)")),
        "{out}"
    );
    let line = out
        .lines()
        .find(|l| l.contains("messages received"))
        .expect(&out);
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>(),
        ["0", "messages", "received", "12345", "-"]
    );
    assert!(out.contains("rq low water (gauge)"), "{out}");
    assert!(out.contains("RDMA hardware counters: none"), "{out}");

    let (ok, out, err) = run(&["stat", "--dir", dir_s, "--prometheus", "--sysfs", sysfs_s]);
    assert!(ok, "{err}");
    assert!(
        out.contains("# TYPE rocebus_messages_received_total counter\n"),
        "{out}"
    );
    assert!(
        out.contains("rocebus_messages_received_total{component=\"feed-handler\"} 12345\n"),
        "{out}"
    );
    assert!(out.contains("# TYPE rocebus_rq_low_water gauge\n"), "{out}");
    assert!(
        out.contains("rocebus_rq_low_water{component=\"feed-handler\"} 17\n"),
        "{out}"
    );

    // Files named explicitly work too.
    let path = counters_path(dir.path(), "feed-handler");
    let (ok, out, _) = run(&["stat", "--once", "--sysfs", sysfs_s, path.to_str().unwrap()]);
    assert!(ok);
    assert!(out.contains("12345"), "{out}");
}

#[test]
fn missing_dir_is_a_helpful_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let (ok, _, err) = run(&["stat", "--once", "--dir", missing.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("does not exist"), "{err}");
    assert!(err.contains("ROCEBUS_DIR"), "{err}");
}

/// Live mode redraws the table every interval and shows a nonzero rate for a counter that
/// moves between frames.
#[test]
fn stat_live_shows_rates() {
    use std::io::Read as _;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let file = CountersFile::create(counters_path(dir.path(), "engine"), 4).unwrap();
    let ticks = file.allocate("ticks").unwrap();
    let sysfs = dir.path().join("sys");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocebus"))
        .args([
            "stat",
            "--interval",
            "50",
            "--dir",
            dir.path().to_str().unwrap(),
        ])
        .args(["--sysfs", sysfs.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = stdout.read_to_end(&mut all);
        String::from_utf8_lossy(&all).into_owned()
    });
    let end = Instant::now() + Duration::from_millis(600);
    while Instant::now() < end {
        ticks.add(1000);
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let out = reader.join().unwrap();
    let frames: Vec<&str> = out
        .split("\x1b[H\x1b[2J")
        .filter(|f| !f.is_empty())
        .collect();
    assert!(frames.len() >= 3, "{out}");
    let rates: Vec<f64> = frames
        .iter()
        .filter_map(|f| f.lines().find(|l| l.contains("ticks")))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect();
    assert!(rates.iter().any(|&r| r > 0.0), "no positive rate in {out}");
}

/// `GET path` over a fresh connection: (status line, body).
fn http(addr: std::net::SocketAddr, request: &str) -> (String, String) {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a head");
    (head.to_string(), body.to_string())
}

/// `rocebus stat --listen`: the address it prints serves the Prometheus text, read afresh
/// at each scrape; other paths and methods are refused; SIGTERM ends it with status 0.
#[test]
fn stat_listen_serves_metrics_until_sigterm() {
    use std::io::BufRead as _;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let file = CountersFile::create(counters_path(dir.path(), "engine"), 4).unwrap();
    let sent = file.allocate("orders sent").unwrap();
    sent.add(7);
    let sysfs = dir.path().join("sys");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocebus"))
        .args(["stat", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dir.path())
        .arg("--sysfs")
        .arg(&sysfs)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: std::net::SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split("/metrics").next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));

    let (head, body) = http(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"),
        "{head}"
    );
    let series = "rocebus_orders_sent_total{component=\"engine\"}";
    assert!(body.contains(&format!("{series} 7\n")), "{body}");

    // Each scrape reads the counters again, and finds components that started since.
    sent.add(5);
    let other = CountersFile::create(counters_path(dir.path(), "feed-handler"), 4).unwrap();
    other.allocate("gaps").unwrap().add(2);
    let (_, body) = http(addr, "GET /metrics HTTP/1.1\r\n\r\n");
    assert!(body.contains(&format!("{series} 12\n")), "{body}");
    assert!(
        body.contains("rocebus_gaps_total{component=\"feed-handler\"} 2\n"),
        "{body}"
    );

    let (head, _) = http(addr, "GET / HTTP/1.1\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 404 "), "{head}");
    let (head, _) = http(addr, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 405 "), "{head}");

    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "no exit 10 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

/// Before any component has created the counters directory the endpoint still answers
/// (Prometheus sees the target up, with no rocebus series yet).
#[test]
fn stat_listen_without_counters_dir_answers() {
    use std::io::BufRead as _;

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-yet");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocebus"))
        .args(["stat", "--listen", "127.0.0.1:0", "--dir"])
        .arg(&missing)
        .arg("--sysfs")
        .arg(dir.path().join("sys"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: std::net::SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split("/metrics").next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let (head, body) = http(addr, "GET /metrics HTTP/1.1\r\n\r\n");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(body.contains("does not exist yet"), "{body}");
    assert!(!body.lines().any(|l| !l.starts_with('#')), "{body}");
}

#[test]
fn stat_listen_on_a_bad_address_says_so() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (ok, _, err) = run(&["stat", "--listen", &addr]);
    assert!(!ok);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    let (ok, _, err) = run(&["stat", "--listen", "nonsense"]);
    assert!(!ok);
    assert!(err.contains("--listen"), "{err}");
}

/// `rocebus stat NAME` is the component's file in the directory, `rocebus stat PATH` the file
/// itself; a component that cannot be read is an error (exit 1) naming it, after the
/// readable ones are printed.
#[test]
fn stat_by_name_or_path_and_unreadable_components_fail() {
    let dir = tempfile::tempdir().unwrap();
    let file = CountersFile::create(counters_path(dir.path(), "order-gateway"), 16).unwrap();
    file.allocate("orders").unwrap().add(7);
    let dir_s = dir.path().to_str().unwrap();
    let sysfs = dir.path().join("sys");
    let sysfs_s = sysfs.to_str().unwrap();
    let by_name = [
        "stat",
        "--dir",
        dir_s,
        "--once",
        "--sysfs",
        sysfs_s,
        "order-gateway",
    ];
    let (ok, out, err) = run(&by_name);
    assert!(ok && out.contains("order-gateway  pid"), "{out}{err}");
    let path = counters_path(dir.path(), "order-gateway");
    let (ok, out, err) = run(&["stat", "--once", "--sysfs", sysfs_s, path.to_str().unwrap()]);
    assert!(ok && out.contains("order-gateway  pid"), "{out}{err}");
    for mode in ["--once", "--prometheus", "--json"] {
        let (ok, out, err) = run(&[
            "stat",
            "--dir",
            dir_s,
            mode,
            "--sysfs",
            sysfs_s,
            "order-gateway",
            "feed-handler",
        ]);
        assert!(!ok, "{mode}: a missing component must fail: {out}");
        assert!(
            err.starts_with("error: cannot read ") && err.contains("feed-handler.counters"),
            "{mode}: {err}"
        );
        assert!(
            out.contains("order-gateway"),
            "{mode}: the readable one is printed: {out}"
        );
    }
}

/// `rocebus stat --json`: one JSON object with every component's counters, the files that
/// could not be read, and the device's counters.
#[test]
fn stat_json_is_one_object() {
    let dir = tempfile::tempdir().unwrap();
    let file = CountersFile::create(counters_path(dir.path(), "order-gateway"), 16).unwrap();
    file.allocate("md.ch1.delivered").unwrap().add(7);
    file.allocate_with("open orders", Kind::Gauge, 0)
        .unwrap()
        .set(3);
    std::fs::write(dir.path().join("broken.counters"), b"short").unwrap();
    let sysfs = dir.path().join("sys");
    let hw = sysfs.join("rxe0/ports/1/hw_counters");
    std::fs::create_dir_all(&hw).unwrap();
    std::fs::write(hw.join("rcvd_pkts"), "12\n").unwrap();
    let (ok, out, err) = run(&[
        "stat",
        "--json",
        "--dir",
        dir.path().to_str().unwrap(),
        "--sysfs",
        sysfs.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let gw = &v["components"][0];
    assert_eq!(gw["component"], "order-gateway", "{v}");
    assert_eq!(gw["pid"], std::process::id(), "{v}");
    assert_eq!(gw["running"], true, "{v}");
    assert_eq!(gw["counters"][0]["label"], "md.ch1.delivered", "{v}");
    assert_eq!(gw["counters"][0]["kind"], "counter", "{v}");
    assert_eq!(gw["counters"][0]["value"], 7, "{v}");
    assert_eq!(gw["counters"][1]["kind"], "gauge", "{v}");
    assert_eq!(gw["counters"][1]["value"], 3, "{v}");
    assert!(
        v["errors"][0]["path"]
            .as_str()
            .unwrap()
            .ends_with("broken.counters"),
        "{v}"
    );
    assert_eq!(v["rdma"][0]["name"], "rcvd_pkts", "{v}");
    assert_eq!(v["rdma"][0]["value"], 12, "{v}");
}
