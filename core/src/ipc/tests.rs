use super::*;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::time::Instant;

fn cfg(dir: &Path, ring: usize, flow: FlowControl) -> IpcConfig {
    IpcConfig {
        dir: dir.to_path_buf(),
        ring_bytes: ring,
        max_payload: ring / 4,
        max_subscribers: 4,
        flow,
        liveness_ms: 5,
    }
}

/// Payload of message `i`: its number, then bytes derived from it.
fn payload(i: u64, len: usize, out: &mut [u8]) {
    for (k, b) in out[..len].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(k as u8);
    }
    if len >= 8 {
        out[..8].copy_from_slice(&i.to_le_bytes());
    }
}

fn check(i: u64, p: &[u8]) {
    let mut want = vec![0u8; p.len()];
    payload(i, p.len(), &mut want);
    assert_eq!(p, &want[..], "message {i} garbled");
}

/// Polls until connected.
fn connect(s: &mut IpcSubscriber) -> u64 {
    let t = Instant::now();
    let mut session = None;
    while session.is_none() {
        s.poll(Mono::now(), |m| panic!("{m:?} before Connected"), 1)
            .unwrap();
        while let Some(e) = s.poll_event() {
            if let IpcEvent::Connected { session: id, .. } = e {
                session = Some(id)
            }
        }
        assert!(t.elapsed() < Duration::from_secs(5), "never connected");
    }
    session.unwrap()
}

#[test]
fn every_message_arrives_in_order_across_hundreds_of_wraps() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), 64 << 10, FlowControl::Block);
    let mut publisher = IpcPublisher::new(&c, "s").unwrap();
    let mut subs: Vec<IpcSubscriber> = (0..2)
        .map(|_| IpcSubscriber::new(&c, "s").unwrap())
        .collect();
    for s in &mut subs {
        connect(s);
    }
    const N: u64 = 100_000;
    let readers: Vec<_> = subs
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                let mut next = 0u64;
                let mut lens = 0usize;
                while next < N {
                    // Pause now and then so the ring fills whatever the scheduler does.
                    if next % 25_000 == 0 {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    s.poll(
                        Mono::now(),
                        |m| {
                            assert_eq!(m.msg_type, (next % 7) as u16);
                            check(next, m.payload);
                            lens += m.payload.len();
                            next += 1;
                        },
                        64,
                    )
                    .unwrap();
                    assert_eq!(s.poll_event(), None);
                }
                lens
            })
        })
        .collect();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut buf = vec![0u8; 4096];
    let mut sent = 0usize;
    for i in 0..N {
        let len = if i % 100 == 0 {
            rng.gen_range(0..4096)
        } else {
            rng.gen_range(0..200)
        };
        payload(i, len, &mut buf);
        loop {
            match publisher.try_claim((i % 7) as u16, len) {
                Ok(mut claim) => {
                    claim.copy_from_slice(&buf[..len]);
                    claim.commit();
                    break;
                }
                Err(IpcOfferError::BackPressured) => std::hint::spin_loop(),
                Err(e) => panic!("{e}"),
            }
        }
        sent += len;
    }
    for r in readers {
        assert_eq!(r.join().unwrap(), sent);
    }
    assert_eq!(publisher.stats().messages, N);
    assert!(
        publisher.stats().back_pressured > 0,
        "the ring never filled: the test proves nothing"
    );
}

/// Every payload word is a well-formed header of the lap in which its position
/// comes round again, so a frame of the next lap whose following header word
/// was not zeroed would be followed into stale payload: the subscriber checks
/// every message's number, type and length over many wraps of varied lengths.
#[test]
fn stale_payload_that_looks_like_next_lap_headers_is_never_read_as_a_frame() {
    let dir = tempfile::tempdir().unwrap();
    let ring = 64 << 10;
    let c = cfg(dir.path(), ring, FlowControl::Block);
    let mut publisher = IpcPublisher::new(&c, "h").unwrap();
    let mut sub = IpcSubscriber::new(&c, "h").unwrap();
    connect(&mut sub);
    const N: u64 = 60_000;
    // Mostly short frames (the publisher zeroes a few lines ahead after each
    // commit), every 50th up to 2 KiB (its claim zeroes up to its end first).
    let len_of = |i: u64| {
        let words = if i % 50 == 0 { 250 } else { 23 };
        8 + (i.wrapping_mul(2_654_435_761) % words) as usize * 8
    };
    let start = Instant::now();
    let reader = std::thread::spawn(move || {
        let mut next = 0u64;
        while next < N {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "stuck at message {next}"
            );
            // Pause now and then, so the publisher fills the ring and wraps onto
            // unread laps whatever the scheduler does (a reader that always keeps up
            // would prove nothing: asserted at the end).
            if next % 10_000 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            sub.poll(
                Mono::now(),
                |m| {
                    assert_eq!(
                        (m.msg_type, m.payload.len()),
                        (1, len_of(next)),
                        "message {next}"
                    );
                    assert_eq!(m.payload[..8], next.to_le_bytes(), "message {next}");
                    next += 1;
                },
                64,
            )
            .unwrap();
            if let Some(e) = sub.poll_event() {
                panic!("unexpected {e:?} at message {next}");
            }
        }
    });
    let log2 = ring.trailing_zeros();
    'send: for i in 0..N {
        let len = len_of(i);
        loop {
            match publisher.try_claim(1, len) {
                Ok(mut claim) => {
                    let pos = claim.pos;
                    claim[..8].copy_from_slice(&i.to_le_bytes());
                    for w in 1..len / 8 {
                        let x = pos + HEADER_LEN as u64 + 8 * w as u64;
                        let forged = 8 | (3 << 32) | (lap_tag(x + ring as u64, log2) << 48);
                        claim[8 * w..8 * w + 8].copy_from_slice(&forged.to_le_bytes());
                    }
                    claim.commit();
                    break;
                }
                // A reader that failed holds the ring for ever: stop and
                // report its failure.
                Err(IpcOfferError::BackPressured)
                    if reader.is_finished() || start.elapsed() > Duration::from_secs(40) =>
                {
                    break 'send
                }
                Err(IpcOfferError::BackPressured) => std::hint::spin_loop(),
                Err(e) => panic!("{e}"),
            }
        }
    }
    reader.join().unwrap();
    assert!(
        publisher.stats().back_pressured > 0,
        "the ring never filled"
    );
}

#[test]
fn a_subscriber_started_first_connects_and_follows_a_restarted_publisher() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), 64 << 10, FlowControl::Block);
    let mut s = IpcSubscriber::new(&c, "feed").unwrap();
    assert_eq!(s.poll(Mono::now(), |m| panic!("{m:?}"), 10), Ok(0));
    assert_eq!(s.poll_event(), None);
    assert!(!s.is_connected());
    let mut p = IpcPublisher::new(&c, "feed").unwrap();
    let first = connect(&mut s);
    p.offer(3, b"hello").unwrap();
    let mut got = Vec::new();
    s.poll(Mono::now(), |m| got.push(m.payload.to_vec()), 10)
        .unwrap();
    assert_eq!(got, vec![b"hello".to_vec()]);
    drop(p);
    assert!(
        !c.path("feed").exists(),
        "a closed stream's file is removed"
    );
    let t = Instant::now();
    let mut gone = None;
    while gone.is_none() {
        s.poll(Mono::now(), |m| panic!("{m:?}"), 10).unwrap();
        if let Some(IpcEvent::PublisherGone { clean }) = s.poll_event() {
            gone = Some(clean)
        }
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    assert_eq!(gone, Some(true));
    let _p2 = IpcPublisher::new(&c, "feed").unwrap();
    assert_ne!(connect(&mut s), first, "a new publisher has a new session");
}

#[test]
fn the_slowest_subscriber_holds_the_publisher_in_block_mode() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), 64 << 10, FlowControl::Block);
    let mut p = IpcPublisher::new(&c, "b").unwrap();
    let mut s = IpcSubscriber::new(&c, "b").unwrap();
    connect(&mut s);
    let msg = [7u8; 1000];
    let mut sent = 0u64;
    while p.offer(1, &msg).is_ok() {
        sent += 1;
        assert!(sent < 1000, "never back-pressured");
    }
    assert!(sent >= 60, "only {sent} fit a 64 KiB ring");
    let mut got = 0u64;
    s.poll(
        Mono::now(),
        |m| {
            assert_eq!(m.payload, msg);
            got += 1;
        },
        usize::MAX,
    )
    .unwrap();
    assert_eq!(got, sent);
    p.offer(1, &msg).unwrap();
    assert_eq!(p.subscribers().len(), 1);
}

#[test]
fn a_subscriber_a_ring_behind_is_dropped_and_continues_in_drop_mode() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), 64 << 10, FlowControl::Drop);
    let mut p = IpcPublisher::new(&c, "d").unwrap();
    let mut slow = IpcSubscriber::new(&c, "d").unwrap();
    connect(&mut slow);
    let mut buf = [0u8; 500];
    for i in 0..1000u64 {
        payload(i, buf.len(), &mut buf);
        p.offer(2, &buf).expect("drop mode never back-pressures");
    }
    assert_eq!(p.stats().dropped_subscribers, 1);
    assert_eq!(p.poll(Mono::now()), 1);
    assert!(matches!(
        p.poll_event(),
        Some(IpcPubEvent::SubscriberDropped { .. })
    ));
    assert_eq!(p.poll_event(), None);
    slow.poll(
        Mono::now(),
        |m| {
            check(
                u64::from_le_bytes(m.payload[..8].try_into().unwrap()),
                m.payload,
            )
        },
        usize::MAX,
    )
    .unwrap();
    assert!(
        matches!(slow.poll_event(), Some(IpcEvent::Dropped { skipped_bytes }) if skipped_bytes > 0)
    );
    assert_eq!(slow.poll_event(), None);
    // Caught up: new messages arrive whole.
    for i in 1000..1010u64 {
        payload(i, buf.len(), &mut buf);
        p.offer(2, &buf).unwrap();
    }
    let mut next = 1000;
    slow.poll(
        Mono::now(),
        |m| {
            check(next, m.payload);
            next += 1
        },
        usize::MAX,
    )
    .unwrap();
    assert_eq!(slow.poll_event(), None);
    assert_eq!(next, 1010);
}

#[test]
fn an_abandoned_claim_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), 64 << 10, FlowControl::Block);
    let mut p = IpcPublisher::new(&c, "a").unwrap();
    let mut s = IpcSubscriber::new(&c, "a").unwrap();
    connect(&mut s);
    drop(p.try_claim(1, 100).unwrap());
    p.try_claim(1, 50).unwrap().abort();
    p.offer(1, b"after").unwrap();
    let mut got = Vec::new();
    s.poll(Mono::now(), |m| got.push(m.payload.to_vec()), 10)
        .unwrap();
    assert_eq!(got, vec![b"after".to_vec()]);
}

#[test]
fn junk_written_into_the_ring_is_reported_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), 64 << 10, FlowControl::Block);
    let mut p = IpcPublisher::new(&c, "j").unwrap();
    let mut s = IpcSubscriber::new(&c, "j").unwrap();
    connect(&mut s);
    p.offer(1, b"ok").unwrap();
    // A misbehaving process writes a header of this lap whose length runs
    // far outside the ring at the next frame's place.
    let next = data_off(4) as u64 + 16;
    let h: u64 = 0xFFFF_FF00 | (1 << 32) | (lap_tag(16, 16) << 48);
    let f = OpenOptions::new().write(true).open(c.path("j")).unwrap();
    f.write_at(&h.to_le_bytes(), next).unwrap();
    let mut got = Vec::new();
    s.poll(Mono::now(), |m| got.push(m.payload.to_vec()), 10)
        .unwrap();
    assert_eq!(got, vec![b"ok".to_vec()]);
    assert!(matches!(s.poll_event(), Some(IpcEvent::Corrupt(_))));
    assert!(!s.is_connected());
}

#[test]
fn bad_configuration_and_names_are_refused_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 64 << 10, FlowControl::Block);
    c.ring_bytes = 100_000;
    assert!(IpcPublisher::new(&c, "x")
        .unwrap_err()
        .to_string()
        .contains("power of two"));
    c.ring_bytes = 64 << 10;
    c.max_payload = 64 << 10;
    assert!(IpcSubscriber::new(&c, "x")
        .unwrap_err()
        .to_string()
        .contains("quarter"));
    c.max_payload = 1024;
    assert!(matches!(
        IpcPublisher::new(&c, "../etc"),
        Err(IpcError::Name(_))
    ));
    let mut p = IpcPublisher::new(&c, "x").unwrap();
    assert_eq!(
        p.offer(1, &[0; 2000]),
        Err(IpcOfferError::TooLarge {
            len: 2000,
            max: 1024
        })
    );
    // The one reserved range of every transport, not only the padding type.
    for t in [PAD_TYPE, 0xFF00, 0xFFFE] {
        assert_eq!(p.offer(t, b""), Err(IpcOfferError::ReservedType), "{t:#x}");
    }
    assert_eq!(p.offer(0xFEFF, b""), Ok(()));
    let toml: IpcConfig = toml::from_str("ring_bytes = 131072\nflow = \"drop\"").unwrap();
    assert_eq!((toml.ring_bytes, toml.flow), (131072, FlowControl::Drop));
}

#[test]
fn a_zombie_process_is_not_alive() {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = child.id();
    let start = process_start(pid).unwrap();
    assert!(alive(pid.into(), start), "a running process is alive");
    assert!(
        !alive(pid.into(), start + 1),
        "a later process with its pid"
    );
    child.kill().unwrap();
    // Not reaped yet: the process is a zombie, with its pid and start time.
    let t = Instant::now();
    while process_stat(pid).map(|(state, _)| state) != Some(b'Z') {
        assert!(t.elapsed() < Duration::from_secs(5), "never a zombie");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(process_start(pid), Some(start));
    assert!(!alive(pid.into(), start), "a zombie is not alive");
    child.wait().unwrap();
    assert!(!alive(pid.into(), start), "reaped");
    assert!(alive(
        std::process::id().into(),
        process_start(std::process::id()).unwrap()
    ));
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn stream_files_are_0600_in_a_0700_directory_made_for_them() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("streams");
    let c = cfg(&dir, 64 << 10, FlowControl::Block);
    // Whatever the umask (the old code's file was 0644 under the usual 022).
    let p = IpcPublisher::new(&c, "s").unwrap();
    assert_eq!(mode_of(&dir), 0o700);
    assert_eq!(mode_of(p.path()), 0o600);
    // No temporary file is left behind, and its name was not the pid.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["rocebus-s.ipc"]);
}

#[test]
fn a_directory_others_can_write_is_refused_by_both_sides() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("open");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let c = cfg(&dir, 64 << 10, FlowControl::Block);
    let err = IpcPublisher::new(&c, "s").unwrap_err();
    assert!(matches!(err, IpcError::UnsafeDir { .. }), "{err}");
    assert!(
        err.to_string().contains("group or others can write it"),
        "{err}"
    );
    let mut s = IpcSubscriber::new(&c, "s").unwrap();
    assert!(matches!(s.try_connect(), Err(IpcError::UnsafeDir { .. })));
    assert!(matches!(s.refused(), Some(IpcError::UnsafeDir { .. })));
    // A symlink to a private directory is refused too (it could be
    // swapped for another).
    let private = base.path().join("private");
    std::fs::create_dir(&private).unwrap();
    let link = base.path().join("link");
    std::os::unix::fs::symlink(&private, &link).unwrap();
    let err = IpcPublisher::new(&cfg(&link, 64 << 10, FlowControl::Block), "s").unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
}

#[test]
fn a_symlink_at_the_stream_path_is_refused_and_its_target_untouched() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("streams");
    let c = cfg(&dir, 64 << 10, FlowControl::Block);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let victim = base.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, c.path("s")).unwrap();
    let mut s = IpcSubscriber::new(&c, "s").unwrap();
    let err = s.try_connect().unwrap_err();
    assert!(err.to_string().contains("is a symlink"), "{err}");
    let err = IpcPublisher::new(&c, "s").unwrap_err();
    assert!(err.to_string().contains("is a symlink"), "{err}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn owner_and_mode_checks_by_value() {
    let p = Path::new("f");
    assert!(check_owner(p, 1000, 0o100600, 1000).is_ok());
    assert!(matches!(
        check_owner(p, 0, 0o100600, 1000),
        Err(IpcError::NotOwner {
            owner: 0,
            expected: 1000,
            ..
        })
    ));
    assert!(matches!(
        check_owner(p, 1000, 0o100644, 1000),
        Err(IpcError::UnsafeFile { .. })
    ));
    assert_eq!(dir_problem(true, 7, 0o40700, 7), None);
    assert_eq!(dir_problem(true, 7, 0o40755, 7), None);
    assert!(dir_problem(true, 7, 0o41777, 7).is_some());
    assert!(dir_problem(true, 7, 0o40770, 7).is_some());
    assert!(dir_problem(true, 8, 0o40700, 7).is_some());
    assert!(dir_problem(false, 7, 0o120777, 7).is_some());
}

#[test]
fn a_stream_of_another_user_or_readable_by_others_is_refused() {
    let base = tempfile::tempdir().unwrap();
    let c = cfg(base.path(), 64 << 10, FlowControl::Block);
    let p = IpcPublisher::new(&c, "s").unwrap();
    // A subscriber told to expect another user refuses ours (the directory
    // is ours, so that is what it finds first).
    let mut s = IpcSubscriber::new(&c, "s").unwrap().expect_owner(4242);
    let err = s.try_connect().unwrap_err();
    assert!(err.to_string().contains("not uid 4242"), "{err}");
    // A file others can read is refused.
    std::fs::set_permissions(
        p.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let mut s = IpcSubscriber::new(&c, "s").unwrap();
    assert!(matches!(s.try_connect(), Err(IpcError::UnsafeFile { .. })));
    std::fs::set_permissions(
        p.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    // A file squatted by another user, in our directory: needs root to
    // make (chown), which these tests run as.
    let path = std::ffi::CString::new(p.path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::chown(path.as_ptr(), 65534, 65534) };
    assert_eq!(
        rc,
        0,
        "chown needs root: {}",
        std::io::Error::last_os_error()
    );
    let err = s.try_connect().unwrap_err();
    assert!(
        matches!(err, IpcError::NotOwner { owner: 65534, .. }),
        "{err}"
    );
    assert!(!s.is_connected());
}

#[test]
fn a_slot_of_a_live_process_that_is_no_subscriber_cannot_hold_the_publisher() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), 64 << 10, FlowControl::Block);
    let mut p = IpcPublisher::new(&c, "s").unwrap();
    // Another process of the owner writes a slot naming pid 1 (alive for
    // ever, its start time right) at position 0.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(p.path())
        .unwrap();
    let s0 = slot_off(0);
    for (off, v) in [
        (S_PID, 1),
        (S_PID_START, process_start(1).unwrap()),
        (S_POS, 0),
        (S_STATE, SLOT_LIVE),
    ] {
        f.write_all_at(&v.to_le_bytes(), (s0 + off) as u64).unwrap();
    }
    let msg = [1u8; 1000];
    while p.offer(1, &msg).is_ok() {}
    assert_eq!(p.offer(1, &msg), Err(IpcOfferError::BackPressured));
    let t = Instant::now();
    while p.offer(1, &msg).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "held by a slot naming pid 1"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
    p.poll(Mono::now());
    assert_eq!(
        p.poll_event(),
        Some(IpcPubEvent::SubscriberGone { slot: 0, pid: 1 })
    );
    assert_eq!(p.poll_event(), None);
    assert_eq!(p.stats().impostor_slots, 1);
    // A real subscriber is still seen and kept.
    let mut s = IpcSubscriber::new(&c, "s").unwrap();
    connect(&mut s);
    std::thread::sleep(Duration::from_millis(10));
    p.poll(Mono::now());
    assert_eq!(p.poll_event(), None);
    assert_eq!(p.subscribers().len(), 1);
}

#[test]
fn a_subscriber_maps_the_ring_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), 64 << 10, FlowControl::Block);
    let _p = IpcPublisher::new(&c, "s").unwrap();
    let mut s = IpcSubscriber::new(&c, "s").unwrap();
    connect(&mut s);
    let j = s.joined.as_ref().unwrap();
    let ring = j.data;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mine: Vec<&str> = maps
        .lines()
        .filter(|l| l.split_ascii_whitespace().nth(4) == Some(&j.ino.to_string()))
        .collect();
    // The publisher's whole mapping (rw, offset 0), the subscriber's
    // header and slots (rw, offset 0) and its ring (read-only, at `data`).
    let ro: Vec<&&str> = mine
        .iter()
        .filter(|l| l.split_ascii_whitespace().nth(1) == Some("r--s"))
        .collect();
    assert_eq!(ro.len(), 1, "{mine:?}");
    let off = u64::from_str_radix(ro[0].split_ascii_whitespace().nth(2).unwrap(), 16).unwrap();
    assert_eq!(off, ring as u64);
}

/// Publishers of different streams starting at once in a stream directory that does not
/// exist yet: each one's create races the others'. Before, the losers failed with EEXIST
/// from `DirBuilder::create` (the C ABI's tests met it); now every one opens its stream.
#[test]
fn publishers_racing_to_create_the_stream_directory_all_start() {
    for round in 0..20 {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join(format!("streams-{round}"));
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (dir, barrier) = (dir.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let c = cfg(&dir, 1 << 16, FlowControl::Block);
                    barrier.wait();
                    IpcPublisher::new(&c, &format!("s{i}")).map(|_| ())
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap().expect("every publisher starts");
        }
    }
}
