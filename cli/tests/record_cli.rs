//! `rocebus record` on the host: its help and its configuration errors (no RDMA device is
//! needed to get that far).

use std::process::{Command, Output};

fn rocebus(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rocebus"))
        .args(args)
        .output()
        .expect("run rocebus")
}

#[test]
fn record_help_explains_what_is_recorded() {
    let out = rocebus(&["record", "--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for word in [
        "--config",
        "--channel",
        "--local",
        "--publisher",
        "--output",
        "--date",
        "SIGTERM",
        "ErrorMsg",
        "snapshot",
        "feed-handler replay",
        "Zstandard",
    ] {
        assert!(text.contains(word), "`record --help` lacks {word}:\n{text}");
    }
    // `rocebus stat` is still there.
    let out = rocebus(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stat") && text.contains("record"), "{text}");
}

#[test]
fn record_refuses_a_bad_config_or_channel() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("out.dbn");
    let args = |config: &str, extra: &[&str]| {
        let mut a = vec![
            "record".to_owned(),
            "--config".to_owned(),
            config.to_owned(),
            "--local".to_owned(),
            "127.0.0.1".to_owned(),
            "--publisher".to_owned(),
            "127.0.0.1".to_owned(),
            "-o".to_owned(),
            out_file.display().to_string(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |a: Vec<String>| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let out = rocebus(&a);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing = dir.path().join("missing.toml");
    let err = run(args(&missing.display().to_string(), &[]));
    assert!(err.contains("missing.toml"), "{err}");
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/md.toml");
    let text = std::fs::read_to_string(&example).unwrap();
    assert!(text.contains("[[channels]]"), "md.toml has channels");
    let err = run(args(&example.display().to_string(), &["--channel", "999"]));
    assert!(err.contains("channel 999"), "{err}");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[market_data]\nno_such_key = 1\n").unwrap();
    let err = run(args(&bad.display().to_string(), &[]));
    assert!(err.contains("bad.toml"), "{err}");
}

/// `--duration` counts from the start, waiting for publishers included, and a host without an
/// RDMA device fails at once: `record --duration 1` never waits for ever.
#[test]
fn record_with_no_device_or_no_publisher_ends_within_its_duration() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("out.dbn");
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/md.toml");
    let t = std::time::Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rocebus"))
        .args(["record", "--config"])
        .arg(&example)
        // TEST-NET-1: no device has it, no publisher answers there.
        .args([
            "--local",
            "192.0.2.1",
            "--publisher",
            "192.0.2.2",
            "--duration",
            "1",
            "-o",
        ])
        .arg(&out_file)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            panic!("record --duration 1 still waits after 20 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("no RDMA device") || err.contains("did not answer within --duration"),
        "{err}"
    );
}
