//! Operator commands against a journal that cannot be written (issue 40): a command that
//! changes state is answered `ok` only once its record is durable, and an `error` means
//! nothing changed; a rebuild after a failed append keeps the restart's cancel-on-disconnect
//! deadlines.
//!
//! The journal is made unwritable with a file-size limit (RLIMIT_FSIZE) set in a child
//! process (this test binary re-executed with `GW_CONTROL_CHILD` set), as `disk_full.rs`
//! does; the venue is the in-process simulator, so no Python is needed.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use order_gateway::control::execute;
use order_gateway::driver::FixDriver;
use order_gateway::fix::{SessionConfig, SessionState};
use order_gateway::journal::FsyncPolicy;
use order_gateway::proto::{NewOrder, Side, Symbol, TimeInForce, PRICE_SCALE};
use order_gateway::risk::RiskConfig;
use order_gateway::sim::SimVenue;
use order_gateway::unix_nanos;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use zerocopy::IntoBytes;

const CHILD_ENV: &str = "GW_CONTROL_CHILD";
const ENGINE: u32 = 1;

fn risk() -> RiskConfig {
    toml::from_str(
        r#"
        reference_max_age_ms = 600000
        throttle_interval_ms = 1000
        [[accounts]]
        id = 7
        max_order_qty = 100000
        max_order_notional = 100000000
        credit_limit = 1000000
        max_position = 1000000
        max_open_orders = 100
        max_orders_per_interval = 1000
        collar_bps = 500
        [[engines]]
        id = 1
        accounts = [7]
        token = "e1"
        "#,
    )
    .unwrap()
}

fn session() -> SessionConfig {
    SessionConfig {
        sender_comp_id: "GW".into(),
        target_comp_id: "VENUE".into(),
        heartbeat_secs: 30,
        ..Default::default()
    }
}

/// The gateway on `path` with the simulated venue, under the `never` sync policy: the
/// operator command must sync by itself.
fn open(path: &Path) -> FixDriver<SimVenue> {
    FixDriver::with_link(
        SimVenue::new(),
        session(),
        &risk(),
        path,
        FsyncPolicy::Never,
    )
    .unwrap()
}

fn logged_on(d: &mut FixDriver<SimVenue>) {
    d.connect().unwrap();
    d.poll_with(rocebus::clock::Now::read(), |_, _| {}).unwrap();
    assert_eq!(d.gateway().session().state(), SessionState::Active);
}

fn limit_file_size(bytes: Option<u64>) {
    let hard = getrlimit(Resource::Fsize).maximum;
    setrlimit(
        Resource::Fsize,
        Rlimit {
            current: bytes.or(hard),
            maximum: hard,
        },
    )
    .unwrap();
}

/// The journal cannot grow past its length now.
fn disk_full(path: &Path) {
    limit_file_size(Some(std::fs::metadata(path).unwrap().len()));
}

/// Space returns: waits for the driver's probe to find the journal writable.
fn disk_back(d: &mut FixDriver<SimVenue>) {
    limit_file_size(None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.is_degraded() {
        assert!(Instant::now() < deadline, "still degraded");
        d.poll_with(rocebus::clock::Now::read(), |_, _| {}).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Set up a child's process: a write past the file-size limit fails (EFBIG) instead of
/// killing the process, as in the gateway binary.
fn child_dir() -> std::path::PathBuf {
    let dir = std::env::var(CHILD_ENV)
        .unwrap_or_else(|_| panic!("child process of the control tests: run with {CHILD_ENV}"));
    signal_hook::flag::register(
        signal_hook::consts::SIGXFSZ,
        Arc::new(AtomicBool::new(false)),
    )
    .unwrap();
    dir.into()
}

/// Runs the test `name` in a child process and checks it printed `marker`.
fn run_child(name: &str, marker: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            name,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains(marker), "{text}");
}

#[test]
#[ignore = "child: run by kill_is_acknowledged_only_once_durable"]
fn child_kill_while_the_journal_fails() {
    let dir = child_dir();
    let path = dir.join("gw.journal");
    let mut d = open(&path);
    logged_on(&mut d);

    // The disk fills up: the kill is refused, and nothing changed.
    disk_full(&path);
    let answer = execute("kill", &mut d, 0, unix_nanos());
    assert!(
        answer.starts_with("error") && answer.contains("nothing changed"),
        "{answer}"
    );
    assert!(!d.gateway().risk().kills().0, "a refused kill is not on");
    assert!(d.is_degraded());
    // Known unwritable: refused at once, still nothing changed.
    let answer = execute("kill --account 7", &mut d, 0, unix_nanos());
    assert!(answer.starts_with("error"), "{answer}");
    assert!(d.gateway().risk().kills().2.is_empty());
    let answer = execute("cancel-all", &mut d, 0, unix_nanos());
    assert!(answer.starts_with("error"), "{answer}");

    // Space returns: the kill is taken, and durable before the answer (the `never` policy
    // syncs nothing by itself).
    disk_back(&mut d);
    let answer = execute("kill", &mut d, 0, unix_nanos());
    assert!(answer.starts_with("ok: kill switch on"), "{answer}");
    assert!(d.gateway().risk().kills().0);
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(
        d.journal_durable_len(),
        len,
        "answered before it was synced"
    );

    // A resume that cannot be journaled leaves the kill switch on.
    disk_full(&path);
    let answer = execute("resume", &mut d, 0, unix_nanos());
    assert!(answer.starts_with("error"), "{answer}");
    assert!(
        d.gateway().risk().kills().0,
        "a refused resume lifted the kill"
    );
    limit_file_size(None);

    // As after kill -9: no clean stop, the next start reads the journal.
    drop(d);
    let d = open(&path);
    assert!(
        d.gateway().risk().kills().0,
        "the kill switch is off after a restart"
    );
    println!("CONTROL-KILL-OK");
}

/// `control kill` while the journal cannot be written answers an error and changes nothing;
/// once it is writable the kill is answered `ok` only after it is synced, and it survives a
/// restart without a clean stop; a `resume` that fails leaves it on.
#[test]
fn kill_is_acknowledged_only_once_durable() {
    run_child("child_kill_while_the_journal_fails", "CONTROL-KILL-OK");
}

#[test]
#[ignore = "child: run by restart_deadlines_survive_a_failed_append"]
fn child_deadlines_through_a_failed_append() {
    let dir = child_dir();
    let path = dir.join("gw.journal");
    // A day where engine 1 logged on, then the gateway stopped without a word.
    let mut d = open(&path);
    d.with_gateway(|gw, out| gw.on_engine_logon(ENGINE, out))
        .unwrap();
    drop(d);
    // The restart arms its cancel-on-disconnect deadline for engine 1 (as the service does).
    let mut d = open(&path);
    let now = unix_nanos();
    let timeout = 5_000_000_000;
    d.stage(|gw, _| gw.arm_restart_cancel_on_disconnect(now, timeout));
    let armed = d.gateway().restart_deadlines().to_vec();
    assert_eq!(armed, [(ENGINE, now + timeout)]);
    let aapl = Symbol::new("AAPL").unwrap();
    d.stage(|gw, _| gw.on_reference_price(aapl, 100 * PRICE_SCALE, now));

    // An append fails: the core is rebuilt from the journal, the deadline kept.
    disk_full(&path);
    let order = NewOrder::new(
        1,
        7,
        aapl,
        Side::Buy,
        10,
        100 * PRICE_SCALE,
        TimeInForce::Day,
    );
    d.stage_engine_message(
        ENGINE,
        order.as_bytes(),
        rocebus::clock::Wall::from_nanos(now),
    );
    d.flush_with(|_, _| {}).unwrap();
    assert_eq!(d.journal_failures(), 1);
    assert_eq!(
        d.gateway().restart_deadlines(),
        &armed[..],
        "the rebuild lost the deadline"
    );
    // The disk recovers, the venue is back, the deadline passes: the cancel-on-disconnect
    // runs as it would have without the failure.
    disk_back(&mut d);
    logged_on(&mut d);
    let later = rocebus::clock::Now {
        mono: rocebus::clock::Mono::now(),
        wall: rocebus::clock::Wall::from_nanos(now + timeout + 1),
    };
    d.poll_with(later, |_, _| {}).unwrap();
    assert!(d.gateway().restart_deadlines().is_empty());
    assert_eq!(d.gateway().counters().deferred_cancel_on_disconnect, 1);
    println!("CONTROL-DEADLINE-OK");
}

/// The restart's cancel-on-disconnect deadlines survive the rebuild after a failed append
/// (`Gateway::inherit_live_state`), and fire once the venue is back.
#[test]
fn restart_deadlines_survive_a_failed_append() {
    run_child(
        "child_deadlines_through_a_failed_append",
        "CONTROL-DEADLINE-OK",
    );
}
