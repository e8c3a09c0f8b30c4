//! The shared-memory transport across processes: this test binary re-runs
//! itself as the other party (`child_*` tests, ignored unless asked for by
//! the parent through `ROCEBUS_IPC_CHILD`), and the parent kills it to check
//! that crashes are detected on both sides.

use rocebus::clock::Mono;
use rocebus::ipc::{
    FlowControl, IpcConfig, IpcError, IpcEvent, IpcOfferError, IpcPubEvent, IpcPublisher,
    IpcSubscriber,
};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn cfg(dir: &Path) -> IpcConfig {
    IpcConfig {
        dir: dir.to_path_buf(),
        ring_bytes: 64 << 10,
        max_payload: 4096,
        max_subscribers: 4,
        flow: FlowControl::Block,
        liveness_ms: 10,
    }
}

/// The child process, killed when the test ends however it ends.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(child: &str, dir: &Path) -> Kid {
    Kid(Command::new(std::env::current_exe().unwrap())
        .args([child, "--exact", "--ignored", "--nocapture"])
        .env("ROCEBUS_IPC_CHILD", dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap())
}

/// The folder a child process works in; a child run by hand (not by its test) fails.
fn child_dir() -> std::path::PathBuf {
    std::env::var_os("ROCEBUS_IPC_CHILD")
        .expect("child process of the ipc tests: run by them with ROCEBUS_IPC_CHILD set")
        .into()
}

/// Child: publishes `n` numbered messages on "x", then keeps the stream
/// open until killed.
#[test]
#[ignore = "child: process of the tests below, run by them"]
fn child_publisher() {
    let dir = child_dir();
    let mut p = IpcPublisher::new(&cfg(&dir), "x").unwrap();
    // Publish once the parent joined, so that it must see all of them.
    while p.subscribers().is_empty() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut i = 0u64;
    loop {
        if i < 100_000 {
            match p.offer(1, &i.to_le_bytes()) {
                Ok(()) => i += 1,
                Err(IpcOfferError::BackPressured) => {}
                Err(e) => panic!("{e}"),
            }
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
        p.poll(Mono::now());
        while p.poll_event().is_some() {}
    }
}

/// Child: joins "x" and never reads.
#[test]
#[ignore = "child: process of the tests below, run by them"]
fn child_stuck_subscriber() {
    let dir = child_dir();
    let mut s = IpcSubscriber::new(&cfg(&dir), "x").unwrap();
    let mut connected = false;
    while !connected {
        s.poll(Mono::now(), |_| {}, 0).unwrap();
        connected |= matches!(s.poll_event(), Some(IpcEvent::Connected { .. }));
    }
    std::fs::write(dir.join("joined"), b"").unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_subscriber_in_another_process_gets_every_message_then_sees_the_publisher_die() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = IpcSubscriber::new(&cfg(dir.path()), "x").unwrap();
    let mut kid = spawn("child_publisher", dir.path());
    let mut next = 0u64;
    let t = Instant::now();
    while next != 100_000 {
        s.poll(
            Mono::now(),
            |m| {
                let i = u64::from_le_bytes(m.payload.try_into().unwrap());
                assert_eq!(i, next, "a message was lost or reordered");
                next += 1;
            },
            64,
        )
        .unwrap();
        match s.poll_event() {
            None => {}
            Some(IpcEvent::Connected { publisher_pid, .. }) => {
                assert_eq!(publisher_pid, kid.0.id())
            }
            other => panic!("{other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(60), "stuck at {next}");
    }
    // Being already published, a second publisher is refused.
    match IpcPublisher::new(&cfg(dir.path()), "x") {
        Err(IpcError::AlreadyPublished { pid, .. }) => assert_eq!(pid, kid.0.id()),
        other => panic!("{other:?}"),
    }
    kid.0.kill().unwrap();
    kid.0.wait().unwrap();
    let t = Instant::now();
    let mut gone = None;
    while gone.is_none() {
        s.poll(Mono::now(), |m| panic!("{m:?}"), 64).unwrap();
        match s.poll_event() {
            None => {}
            Some(IpcEvent::PublisherGone { clean }) => gone = Some(clean),
            other => panic!("{other:?}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the dead publisher was never noticed"
        );
    }
    assert_eq!(gone, Some(false), "killed, not closed");
    // Its stale file does not stop a new publisher.
    let _p = IpcPublisher::new(&cfg(dir.path()), "x").unwrap();
}

/// A publisher that died but whose parent has not reaped it yet (a zombie:
/// its pid and start time are still in /proc) is gone all the same.
#[test]
fn a_killed_publisher_not_yet_reaped_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = IpcSubscriber::new(&cfg(dir.path()), "x").unwrap();
    let mut kid = spawn("child_publisher", dir.path());
    let t = Instant::now();
    let mut got = 0u64;
    while got == 0 {
        got += s.poll(Mono::now(), |_| {}, 64).unwrap() as u64;
        assert!(t.elapsed() < Duration::from_secs(60), "never connected");
    }
    kid.0.kill().unwrap();
    let stat = format!("/proc/{}/stat", kid.0.id());
    let t = Instant::now();
    let mut gone = None;
    while gone.is_none() {
        s.poll(Mono::now(), |_| {}, 64).unwrap();
        match s.poll_event() {
            None | Some(IpcEvent::Connected { .. }) => {}
            Some(IpcEvent::PublisherGone { clean }) => gone = Some(clean),
            other => panic!("{other:?}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the dead (zombie) publisher was never noticed"
        );
    }
    assert_eq!(gone, Some(false), "killed, not closed");
    // Still not reaped: the test is about a zombie.
    let state = std::fs::read_to_string(&stat).unwrap();
    assert!(state.contains(") Z "), "not a zombie: {state}");
    // A new publisher is not refused by the zombie's stale file either.
    let _p = IpcPublisher::new(&cfg(dir.path()), "x").unwrap();
}

#[test]
fn a_dead_subscriber_stops_holding_the_publisher_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = IpcPublisher::new(&cfg(dir.path()), "x").unwrap();
    let mut kid = spawn("child_stuck_subscriber", dir.path());
    let t = Instant::now();
    while !dir.path().join("joined").exists() {
        assert!(t.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(5));
    }
    let msg = [1u8; 1000];
    while p.offer(1, &msg).is_ok() {}
    assert_eq!(p.offer(1, &msg), Err(IpcOfferError::BackPressured));
    kid.0.kill().unwrap();
    kid.0.wait().unwrap();
    let t = Instant::now();
    while p.offer(1, &msg).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "still held by a dead subscriber"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    p.poll(Mono::now());
    assert_eq!(
        p.poll_event(),
        Some(IpcPubEvent::SubscriberGone {
            slot: 0,
            pid: kid.0.id()
        })
    );
    assert_eq!(p.poll_event(), None);
    assert_eq!(p.stats().dead_subscribers, 1);
}

/// Child: the truncation cases, each of which used to end in SIGBUS. Exits
/// normally when every party came through; the parent checks it did.
#[test]
#[ignore = "child: process of the tests below, run by them"]
fn child_truncation() {
    let dir = child_dir();
    let c = cfg(&dir);
    let mut p = IpcPublisher::new(&c, "t").unwrap();
    let mut joined = IpcSubscriber::new(&c, "t").unwrap();
    assert!(joined.try_connect().unwrap().is_some());
    p.offer(1, b"before").unwrap();
    // Cut to 4 KiB from outside, as in the report.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(p.path())
        .unwrap();
    f.set_len(4096).unwrap();
    // A subscriber joining now is refused with an error, without mapping.
    let mut late = IpcSubscriber::new(&c, "t").unwrap();
    match late.try_connect() {
        Err(IpcError::Truncated { len: 4096, .. }) => {}
        other => panic!("expected Truncated, got {other:?}"),
    }
    // The publisher finds it at its next check and grows the file back
    // before anyone touches the cut pages again.
    std::thread::sleep(Duration::from_millis(20));
    p.poll(Mono::now());
    assert_eq!(p.stats().truncations, 1);
    p.offer(1, b"after").unwrap();
    let mut n = 0;
    for _ in 0..10 {
        n += joined.poll(Mono::now(), |_| {}, 16).unwrap();
    }
    let _ = n;
    std::fs::write(dir.join("done"), b"").unwrap();
}

#[test]
fn a_truncated_stream_file_is_an_error_not_a_sigbus() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let mut kid = spawn("child_truncation", dir.path());
    let status = kid.0.wait().unwrap();
    assert_eq!(
        status.signal(),
        None,
        "the child died of a signal: {status}"
    );
    assert!(status.success(), "{status}");
    assert!(dir.path().join("done").exists(), "the child ran the cases");
}
