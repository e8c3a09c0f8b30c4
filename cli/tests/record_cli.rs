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
