//! The binary's configuration errors name the file, the key and the problem.

use std::process::Command;

fn gateway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_order-gateway"))
}

fn shipped() -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/order-gateway.toml");
    std::fs::read_to_string(p).unwrap()
}

fn example() -> String {
    with_keys(&shipped())
}

/// The shipped example with its sample tokens replaced by keys (the gateway refuses the
/// samples: see `the_shipped_sample_tokens_are_refused`).
fn with_keys(text: &str) -> String {
    text.replace(
        "token = \"change-me\"",
        "token = \"4c1e7a0d9b3f62e58a17c4d0b9e36f21a5d87c04e2b91f3a6c58d07e4b29a1f3\"",
    )
    .replace(
        "token = \"change-me-engine-1\"",
        "token = \"8f2b5c7e1a9d04c36e8b2f1d7a5c90e4\"",
    )
}

fn check(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("my-gateway.toml");
    std::fs::write(&path, text).unwrap();
    let out = gateway()
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn example_config_checks_ok() {
    let (ok, msg) = check(&example());
    assert!(ok, "{msg}");
}

/// Issue 41: tokens that can be guessed offline from one captured handshake are refused,
/// the shipped samples first, with the key and the way to make a real one.
#[test]
fn the_shipped_sample_tokens_are_refused() {
    let (ok, msg) = check(&shipped());
    assert!(!ok);
    assert!(
        msg.contains("service.orders.token") && msg.contains("rocebus keygen"),
        "{msg}"
    );
    let engine_only = shipped().replace(
        "token = \"change-me\"",
        &format!(
            "token = {:?}",
            "4c1e7a0d9b3f62e58a17c4d0b9e36f21a5d87c04e2b91f3a6c58d07e4b29a1f3"
        ),
    );
    let (ok, msg) = check(&engine_only);
    assert!(!ok);
    assert!(
        msg.contains("engine 1: token") && msg.contains("rocebus keygen"),
        "{msg}"
    );
    let short = example().replace(
        "4c1e7a0d9b3f62e58a17c4d0b9e36f21a5d87c04e2b91f3a6c58d07e4b29a1f3",
        "0123456789abcdef",
    );
    let (ok, msg) = check(&short);
    assert!(!ok);
    assert!(msg.contains("64 bits") && msg.contains("128"), "{msg}");
}

#[test]
fn bad_configs_fail_naming_file_key_and_problem() {
    let (ok, msg) = check(&example().replace("heartbeat_secs", "heartbeat_sec"));
    assert!(!ok);
    assert!(
        msg.contains("my-gateway.toml") && msg.contains("heartbeat_sec"),
        "{msg}"
    );
    let (ok, msg) = check(&example().replace("max_payload = 16384", "max_payload = 900000"));
    assert!(!ok);
    assert!(
        msg.contains("my-gateway.toml") && msg.contains("service.orders.max_payload"),
        "{msg}"
    );
    let (ok, msg) = check(&example().replace("[service]", "[servic]"));
    assert!(!ok);
    assert!(msg.contains("servic"), "{msg}");
}

#[test]
fn missing_file_is_named() {
    let out = gateway()
        .args(["check", "--config", "no/such/gateway.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no/such/gateway.toml"), "{err}");
}

#[test]
fn help_explains_the_commands() {
    let out = gateway().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("run") && text.contains("check") && text.contains("RDMA"),
        "{text}"
    );
}

#[test]
fn run_help_explains_venue_and_market_data() {
    let out = gateway().args(["run", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--venue") && text.contains("sim") && text.contains("fix"),
        "{text}"
    );
    assert!(text.contains("market_data"), "{text}");
    let out = gateway()
        .args(["run", "--venue", "nasdaq", "--config", "x.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nasdaq") && err.contains("sim"), "{err}");
}

#[test]
fn bad_market_data_section_is_named() {
    let text = example();
    let cut = text.find("\n[reference_prices]").unwrap();
    let with_md = |extra: &str| {
        format!(
            "{}[market_data]\nconfig = \"no-such-md.toml\"\nlocal = \"10.0.0.1\"\npublisher = \"10.0.0.1\"\n{extra}",
            &text[..=cut]
        )
    };
    let (ok, msg) = check(&with_md(""));
    assert!(!ok);
    assert!(
        msg.contains("my-gateway.toml")
            && msg.contains("market_data.config")
            && msg.contains("no-such-md.toml"),
        "{msg}"
    );
    let (ok, msg) = check(&with_md("local = \"somewhere\"\n"));
    assert!(!ok);
    assert!(
        msg.contains("my-gateway.toml") && msg.contains("local"),
        "{msg}"
    );
}

#[test]
fn control_without_a_running_gateway_names_the_socket_and_bad_commands_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("gw.control");
    let cfg = example().replace(
        "control_socket = \".rocebus/order-gateway.control\"",
        &format!("control_socket = {:?}", sock.display().to_string()),
    );
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, cfg).unwrap();
    let out = gateway()
        .args(["control", "--config"])
        .arg(&path)
        .arg("status")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&sock.display().to_string()) && err.contains("running"),
        "{err}"
    );
    let out = gateway()
        .args(["control", "--config"])
        .arg(&path)
        .args(["kill", "--account", "seven"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("account number"), "{err}");
    let out = gateway().args(["control", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("kill")
            && text.contains("resume")
            && text.contains("cancel-all")
            && text.contains("status"),
        "{text}"
    );
}

/// What an operator sees when the start fails, whatever their environment: the error as one
/// line of message and causes (no backtrace, though `RUST_BACKTRACE=1` is set, as it is for
/// many Rust developers), and log lines without colour codes when stderr is a pipe; with
/// `ROCEBUS_LOG_COLOR=always` they are coloured all the same.
#[test]
fn errors_are_one_line_and_logs_plain_in_a_pipe_whatever_rust_backtrace_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    let journal = dir.path().join("gw.journal");
    let control = dir.path().join("gw.control");
    let text = example()
        // TEST-NET-1: no device anywhere has it, so the start fails after the journal.
        .replace(
            "listen = \"198.18.0.1:7470\"",
            "listen = \"192.0.2.1:7470\"",
        )
        .replace(
            "path = \".rocebus/order-gateway.journal\"",
            &format!("path = {:?}", journal.display().to_string()),
        )
        .replace(
            "control_socket = \".rocebus/order-gateway.control\"",
            &format!("control_socket = {:?}", control.display().to_string()),
        );
    std::fs::write(&path, text).unwrap();
    let run = |color: Option<&str>| {
        let mut c = gateway();
        c.args(["run", "--venue", "sim", "--config"])
            .arg(&path)
            .env("RUST_BACKTRACE", "1")
            .env("RUST_LIB_BACKTRACE", "1")
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR");
        match color {
            Some(v) => c.env("ROCEBUS_LOG_COLOR", v),
            None => c.env_remove("ROCEBUS_LOG_COLOR"),
        };
        let out = c.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(None);
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.iter().any(|l| l.contains("journal replayed")),
        "{err}"
    );
    let last = lines.last().copied().unwrap_or("");
    assert!(
        last.starts_with("error: no engine can reach this gateway") && last.contains("192.0.2.1"),
        "{err}"
    );
    assert!(
        lines.iter().filter(|l| l.starts_with("error:")).count() == 1
            && !err.to_lowercase().contains("backtrace")
            && !err.contains("Caused by"),
        "{err}"
    );
    assert!(!err.contains('\x1b'), "colour codes in a pipe: {err:?}");
    assert!(run(Some("always")).contains('\x1b'), "forced colour");
    let bad = run(Some("sometimes"));
    assert!(
        bad.contains("ROCEBUS_LOG_COLOR=\"sometimes\": expected always, never or auto"),
        "{bad}"
    );
}

/// `control` reads only the socket's path from the configuration: a configuration whose FIX
/// password comes from an environment variable that is not set in the operator's shell (or
/// that does not even validate) still finds the socket; `--socket PATH` needs no file.
#[test]
fn control_needs_only_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("gw.control");
    let cfg = example()
        .replace(
            "control_socket = \".rocebus/order-gateway.control\"",
            &format!("control_socket = {:?}", sock.display().to_string()),
        )
        .replace(
            "# password_env = \"ORDER_GATEWAY_FIX_PASSWORD\"",
            "password_env = \"ROCEBUS_TEST_UNSET_PASSWORD_VARIABLE\"",
        );
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, cfg).unwrap();
    let (ok, msg) = check(&std::fs::read_to_string(&path).unwrap());
    assert!(!ok, "the full configuration needs the password: {msg}");
    // No gateway runs: the error names the socket read from the file, not the password.
    let out = gateway()
        .args(["control", "--config"])
        .arg(&path)
        .arg("status")
        .env_remove("ROCEBUS_TEST_UNSET_PASSWORD_VARIABLE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&sock.display().to_string()) && !err.contains("password"),
        "{err}"
    );
    let out = gateway()
        .args(["control", "--socket"])
        .arg(&sock)
        .arg("status")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&sock.display().to_string()),
        "{err}"
    );
}

/// `control status --json` prints one JSON object (the gateway's report, from the real
/// control socket and the real `status` of a gateway with the venue simulator); exit codes
/// stay those of the text form.
#[test]
fn control_status_json_is_one_object() {
    use order_gateway::control::{execute, ControlServer};
    use order_gateway::driver::FixDriver;
    use order_gateway::journal::FsyncPolicy;
    use order_gateway::sim::SimVenue;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let cfg = order_gateway::config::Config::parse(&example()).unwrap();
    let sock = dir.path().join("gw.control");
    let mut server = ControlServer::bind(&sock).unwrap();
    let journal = dir.path().join("gw.journal");
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&done);
    let gw = std::thread::spawn(move || {
        let mut d = FixDriver::with_link(
            SimVenue::new(),
            cfg.fix.session(),
            &cfg.risk,
            &journal,
            FsyncPolicy::Never,
        )
        .unwrap();
        d.connect().unwrap();
        d.poll_with(rocebus::clock::Now::read(), |_, _| {}).unwrap();
        // ORDERING: Relaxed: a stop flag, no data published with it.
        while !stop.load(Ordering::Relaxed) {
            server.poll(|line| execute(line, &mut d, 2, order_gateway::unix_nanos()));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    });
    let control = |args: &[&str]| {
        gateway()
            .args(["control", "--socket"])
            .arg(&sock)
            .args(args)
            .output()
            .unwrap()
    };
    let out = control(&["status", "--json"]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["venue_session"], "active", "{v}");
    assert_eq!(v["engines_connected"], 2, "{v}");
    assert_eq!(v["journal_ok"], true, "{v}");
    assert_eq!(v["kill_global"], false, "{v}");
    assert!(
        v["accounts"].as_array().is_some_and(|a| !a.is_empty()),
        "{v}"
    );
    assert!(v["firm"]["max_open_orders"].as_u64().unwrap() > 0, "{v}");
    // The text form is unchanged.
    let out = control(&["status"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success() && text.starts_with("ok\nvenue session       active\n"),
        "{text}"
    );
    // A refused command still exits 1.
    let out = control(&["kill", "--account", "999999"]);
    assert_eq!(out.status.code(), Some(1));
    // ORDERING: Relaxed: see the loop.
    done.store(true, Ordering::Relaxed);
    gw.join().unwrap();
}
