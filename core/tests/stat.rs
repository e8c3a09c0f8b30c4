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
        out.contains(&format!(
            "rocebus_messages_received_total{{component=\"feed-handler\",pid=\"{pid}\"}} 12345\n"
        )),
        "{out}"
    );
    assert!(out.contains("# TYPE rocebus_rq_low_water gauge\n"), "{out}");
    assert!(
        out.contains(&format!(
            "rocebus_rq_low_water{{component=\"feed-handler\",pid=\"{pid}\"}} 17\n"
        )),
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
