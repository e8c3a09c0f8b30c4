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

/// Child, run as `nobody` by the test below: tries to read, write, truncate
/// and join the parent's stream (in `ROCEBUS_IPC_CHILD`), then squats the
/// stream name in a directory everyone can write (`ROCEBUS_IPC_SQUAT`, like
/// `/dev/shm`) with a publisher of its own and a forged message. Panics on
/// anything the second user should not have managed.
#[test]
#[ignore = "child: process of the tests below, run by them"]
fn child_second_user() {
    let dir = child_dir();
    let c = cfg(&dir);
    let file = c.path("s");
    let denied = |what: &str, r: std::io::Result<std::fs::File>| match r {
        Ok(_) => panic!("a second user could {what} {}", file.display()),
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::PermissionDenied,
            "{what}: {e}"
        ),
    };
    denied("read", std::fs::File::open(&file));
    denied("write", std::fs::OpenOptions::new().write(true).open(&file));
    denied(
        "truncate",
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&file),
    );
    assert!(
        std::fs::read_dir(&dir).is_err(),
        "a second user could list the stream directory"
    );
    // Joining takes a slot (the only thing a subscriber writes): refused.
    let mut s = IpcSubscriber::new(&c, "s").unwrap().expect_owner(0);
    assert!(s.try_connect().is_err(), "a second user joined the stream");
    // The squat: first to make the directory in a shared place.
    let squat =
        std::path::PathBuf::from(std::env::var_os("ROCEBUS_IPC_SQUAT").expect("ROCEBUS_IPC_SQUAT"));
    let mut p = IpcPublisher::new(&cfg(&squat), "s").unwrap();
    p.offer(7, b"forged").unwrap();
    println!("squatted {}", p.path().display());
}

/// A second local user (the child runs as `nobody`, so this needs root,
/// which these tests run as) cannot read, write, truncate, join or stall a
/// stream, and a stream name it squats in a shared directory is refused by
/// the owner's publisher and subscriber with a clear error instead of being
/// read; the real stream goes on delivering every message to its subscriber.
#[test]
fn a_second_local_user_cannot_read_truncate_join_stall_or_squat_a_stream() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    let base = tempfile::tempdir().unwrap();
    // Others may pass through the base (as through /tmp) ...
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let streams = base.path().join("streams");
    let c = cfg(&streams);
    let mut p = IpcPublisher::new(&c, "s").unwrap();
    let mut sub = IpcSubscriber::new(&c, "s").unwrap();
    // It joins at the newest frame: publish once it has joined.
    assert!(
        sub.try_connect().unwrap().is_some(),
        "the owner's subscriber joins"
    );
    let (mut sent, mut got) = (0u64, 0u64);
    let mut pump = |p: &mut IpcPublisher, sub: &mut IpcSubscriber, upto: u64| {
        let t = Instant::now();
        while got < upto {
            if sent < upto && p.offer(1, &sent.to_le_bytes()).is_ok() {
                sent += 1;
            }
            p.poll(Mono::now());
            while p.poll_event().is_some() {}
            sub.poll(
                Mono::now(),
                |m| {
                    assert_eq!(m.payload, got.to_le_bytes(), "message {got}");
                    got += 1;
                },
                64,
            )
            .unwrap();
            assert!(t.elapsed() < Duration::from_secs(10), "stalled at {got}");
        }
    };
    pump(&mut p, &mut sub, 1000);
    let len = std::fs::metadata(p.path()).unwrap().len();
    // ... and into a shared directory, sticky and writable by all, like /dev/shm.
    let open = base.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let squat = open.join("rocebus-ipc");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["child_second_user", "--exact", "--ignored", "--nocapture"])
        .env("ROCEBUS_IPC_CHILD", &streams)
        .env("ROCEBUS_IPC_SQUAT", &squat)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("running the second user as nobody needs root");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the second user: {text}");
    assert!(text.contains("squatted"), "{text}");
    // The real stream: untouched, no slot taken, still delivering.
    assert_eq!(std::fs::metadata(p.path()).unwrap().len(), len);
    pump(&mut p, &mut sub, 20_000);
    assert_eq!(p.subscribers().len(), 1);
    assert_eq!(p.stats().impostor_slots, 0);
    // The squatted name: the owner's subscriber and publisher refuse it,
    // saying whose it is; the forged message is never read.
    let sc = cfg(&squat);
    let mut s = IpcSubscriber::new(&sc, "s").unwrap();
    let err = s.try_connect().unwrap_err();
    assert!(
        matches!(err, IpcError::UnsafeDir { .. } | IpcError::NotOwner { .. }),
        "{err}"
    );
    let err = IpcPublisher::new(&sc, "s").unwrap_err();
    assert!(matches!(err, IpcError::UnsafeDir { .. }), "{err}");
    assert!(
        err.to_string().contains(&squat.display().to_string()),
        "{err}"
    );
}
