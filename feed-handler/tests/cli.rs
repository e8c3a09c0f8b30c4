//! The `feed-handler run` command line on the host: help text and configuration errors
//! (no RDMA device is needed to get that far).

use std::process::{Command, Output};

fn feed_handler(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_feed-handler"))
        .args(args)
        .output()
        .expect("run feed-handler")
}

#[test]
fn run_help_explains_the_service() {
    let out = feed_handler(&["run", "--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for word in [
        "--config",
        "--capture",
        "--duration",
        "--exit-on-end-of-session",
        "--counters",
        "SIGTERM",
        "rocebus stat",
        "re-requests",
    ] {
        assert!(text.contains(word), "`run --help` lacks {word}:\n{text}");
    }
    let out = feed_handler(&["--help"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("run"));
}

#[test]
fn bad_config_names_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/feed-handler.toml");
    let text = std::fs::read_to_string(example).unwrap();
    let cases = [
        (
            text.replace("max_retries = 5", "max_retrys = 5"),
            "max_retrys",
        ),
        (
            text.replace("line_a = \"239.1.10.2\"", "line_a = \"10.1.10.2\""),
            "market_data.channels[1].line_a",
        ),
        (
            text.replace("group = \"239.1.1.1:26477\"", "group = \"nowhere\""),
            "group",
        ),
    ];
    for (i, (bad, key)) in cases.iter().enumerate() {
        assert_ne!(bad, &text, "case {i} changed nothing");
        let path = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, bad).unwrap();
        let out = feed_handler(&["run", "--config", path.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("bad{i}.toml")) && err.contains(key),
            "case {i}: {err}"
        );
    }
    let out = feed_handler(&["run", "--config", "does/not/exist.toml"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does/not/exist.toml"));
}

/// An error is one line of message and causes, without a backtrace, though the user's
/// environment asks for backtraces (`RUST_BACKTRACE=1`, common among Rust developers).
#[test]
fn an_error_is_one_line_whatever_rust_backtrace_says() {
    let out = Command::new(env!("CARGO_BIN_EXE_feed-handler"))
        .args(["decode", "no/such/capture.itch"])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("no/such/capture.itch"),
        "{err}"
    );
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
}

/// An empty input is an error for every command that reads a capture, never a silent exit 0.
#[test]
fn an_empty_capture_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.itch");
    std::fs::write(&empty, b"").unwrap();
    let path = empty.to_str().unwrap();
    for cmd in ["decode", "book", "bbo"] {
        let out = feed_handler(&[cmd, path]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{cmd}: exit 0 on an empty file: {err}"
        );
        assert!(err.contains("empty.itch"), "{cmd}: {err}");
    }
}

/// Issue 41: the shipped sample secret, and any secret with fewer than 128 bits of key
/// material, stops the start before anything is opened, naming the key and `rocebus keygen`.
#[test]
fn a_guessable_market_data_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/feed-handler.toml");
    let text = std::fs::read_to_string(example).unwrap();
    assert!(text.contains("secret = \"change-me-md\""));
    for (i, bad) in [
        text.clone(),
        text.replace("secret = \"change-me-md\"", "secret = \"0123456789abcdef\""),
    ]
    .iter()
    .enumerate()
    {
        let path = dir.path().join(format!("weak{i}.toml"));
        std::fs::write(&path, bad).unwrap();
        let out = feed_handler(&["run", "--config", path.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("market_data.auth.secret") && err.contains("rocebus keygen"),
            "case {i}: {err}"
        );
    }
}

/// Issue 43: a memlock limit (RLIMIT_MEMLOCK) below what the configured rings pin stops the
/// start before any device is opened, naming the bytes needed and how to raise the limit.
/// The child runs with `ulimit -l 64` (and without CAP_IPC_LOCK, which pins past any limit,
/// when the test runs as root).
#[test]
fn a_memlock_limit_below_the_rings_is_a_start_up_error_naming_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/feed-handler.toml");
    let text = std::fs::read_to_string(example).unwrap().replace(
        "secret = \"change-me-md\"",
        "secret = \"b27984bb334881df4564221f4c19a30d\"",
    );
    let path = dir.path().join("fh.toml");
    std::fs::write(&path, &text).unwrap();
    let cfg = feed_handler::config::Config::load(&path).unwrap();
    let needed = cfg.market_data.publisher_pinned_bytes();
    assert!(
        needed > 65536,
        "the example's rings exceed 64 KiB: {needed}"
    );
    let ipc_lock = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|c| c & (1 << 14) != 0);
    let drop_cap = if ipc_lock {
        "setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock"
    } else {
        ""
    };
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -l 64 && exec {drop_cap} \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_feed-handler"))
        .args(["run", "--config", path.to_str().unwrap()])
        .output()
        .expect("run feed-handler under ulimit -l 64");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("memlock limit (RLIMIT_MEMLOCK) is 65536 bytes")
            && err.contains(&format!("at least {needed} bytes"))
            && err.contains("ulimit -l"),
        "{err}"
    );
}
