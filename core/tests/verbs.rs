//! Verbs-layer tests on a real RDMA device (soft-RoCE in the project's
//! guest). They are `#[ignore]`d so a plain `cargo test` on a host without a
//! device reports them as ignored; `cargo xtask test` runs them in the guest.
//!
//! Posting with DMA'd (non-inline) data is `unsafe` by the verbs layer's
//! contract; the tests keep every region alive until the completion is
//! polled, which is argued at each call.
#![allow(unsafe_code)]

use rocebus::verbs::cm::{self, Listener, McastMembership};
use rocebus::verbs::*;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Dev {
    ctx: Arc<Context>,
    pd: Arc<ProtectionDomain>,
    gid_index: u8,
    gid: Gid,
    mtu: u32,
}

impl Dev {
    fn path(&self) -> LocalPath {
        LocalPath {
            port: 1,
            sgid_index: self.gid_index,
            active_mtu: self.mtu,
        }
    }
}

fn dev() -> Dev {
    let ctx = Context::open(None).expect("open RDMA device");
    let pd = ProtectionDomain::new(&ctx).expect("pd");
    let gid_index = ctx.default_gid_index(1).expect("gid index") as u8;
    let gid = ctx.query_gid(1, gid_index as i32).expect("gid");
    let mtu = ctx.query_port(1).expect("port").active_mtu;
    Dev {
        ctx,
        pd,
        gid_index,
        gid,
        mtu,
    }
}

fn local_ip() -> IpAddr {
    std::env::var("ROCEBUS_GUEST_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
        .or_else(|| dev().gid.ipv4().map(IpAddr::V4))
        .expect("a local IPv4 address on the RDMA device (ROCEBUS_GUEST_ADDR)")
}

fn poll_one(cq: &CompletionQueue, timeout: Duration) -> WorkCompletion {
    let mut wc = [WorkCompletion::empty()];
    let t = Instant::now();
    loop {
        if cq.poll(&mut wc).expect("poll") == 1 {
            let [w] = wc;
            return w;
        }
        assert!(t.elapsed() < timeout, "no completion within {timeout:?}");
        std::thread::yield_now();
    }
}

/// Two RC QPs on one device connected to each other without rdma_cm.
fn rc_pair(
    d: &Dev,
    opts: &RcOptions,
) -> (
    QueuePair,
    QueuePair,
    Arc<CompletionQueue>,
    Arc<CompletionQueue>,
) {
    let cqa = CompletionQueue::new(&d.ctx, 256).unwrap();
    let cqb = CompletionQueue::new(&d.ctx, 256).unwrap();
    let a = QueuePair::new(&d.pd, QpType::Rc, &cqa, &cqa, QpCaps::default()).unwrap();
    let b = QueuePair::new(&d.pd, QpType::Rc, &cqb, &cqb, QpCaps::default()).unwrap();
    let access = Access::REMOTE_WRITE | Access::REMOTE_READ;
    for (x, y) in [(&a, &b), (&b, &a)] {
        x.init_rc(1, access).unwrap();
        let peer = RcPeer {
            qpn: y.qpn(),
            psn: 100,
            gid: d.gid,
        };
        x.rtr_rc(&peer, &d.path(), opts).unwrap();
    }
    a.rts_rc(100, opts).unwrap();
    b.rts_rc(100, opts).unwrap();
    (a, b, cqa, cqb)
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_smoke_open_query_register() {
    let names = device_names().unwrap();
    assert!(!names.is_empty());
    let d = dev();
    let port = d.ctx.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    assert!(port.active_mtu >= 256, "{port:?}");
    let gids = d.ctx.gids(1).unwrap();
    assert!(
        gids.iter().any(|(_, g)| g.ipv4().is_some()),
        "no IPv4-mapped GID in {gids:?}"
    );
    let mut mr = MemoryRegion::new(&d.pd, 1 << 20, Access::REMOTE_WRITE).unwrap();
    assert_eq!(mr.len(), 1 << 20);
    assert_ne!(mr.rkey(), 0);
    mr.write_at(10, b"hello").unwrap();
    assert_eq!(mr.to_vec(10, 5).unwrap(), b"hello");
    assert!(matches!(
        mr.write_at(1 << 20, b"x"),
        Err(VerbsError::SgeOutOfBounds { .. })
    ));
    println!(
        "device {} gids {gids:?} mtu {}",
        d.ctx.name(),
        port.active_mtu
    );
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_rc_loopback_write_read_send_imm_inline_batch() {
    let d = dev();
    let (a, b, cqa, cqb) = rc_pair(&d, &RcOptions::default());
    let mut src = MemoryRegion::new(&d.pd, 64 * 1024, Access::LOCAL_WRITE).unwrap();
    let dst =
        MemoryRegion::new(&d.pd, 64 * 1024, Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
    let pattern: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
    src.write_at(0, &pattern).unwrap();

    // RDMA WRITE larger than the MTU.
    let sge = [Sge::new(&src, 0, pattern.len()).unwrap()];
    let mut wr = [SendWr::write(1, &sge, dst.addr() + 100, dst.rkey()).signaled()];
    // SAFETY: src stays alive and unmodified until the completion below.
    unsafe { a.post_send(&mut wr).unwrap() };
    let wc = poll_one(&cqa, Duration::from_secs(10));
    assert_eq!(
        (wc.wr_id(), wc.status(), wc.opcode()),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(dst.to_vec(100, pattern.len()).unwrap(), pattern);

    // RDMA READ back into another part of src.
    let rsge = [Sge::new(&src, 20_000, 3000).unwrap()];
    let mut wr = [SendWr::read(2, &rsge, dst.addr() + 100, dst.rkey()).signaled()];
    // SAFETY: src stays alive and unread until the completion.
    unsafe { a.post_send(&mut wr).unwrap() };
    let wc = poll_one(&cqa, Duration::from_secs(10));
    assert_eq!(
        (wc.status(), wc.opcode()),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(src.to_vec(20_000, 3000).unwrap(), pattern[..3000]);

    // SEND / RECV and SEND with immediate.
    let rbuf = MemoryRegion::new(&d.pd, 8192, Access::LOCAL_WRITE).unwrap();
    let rs0 = [Sge::new(&rbuf, 0, 4096).unwrap()];
    let rs1 = [Sge::new(&rbuf, 4096, 4096).unwrap()];
    let mut rwr = [RecvWr::new(10, &rs0), RecvWr::new(11, &rs1)];
    // SAFETY: rbuf outlives both completions polled below.
    unsafe { b.post_recv(&mut rwr).unwrap() };
    let s0 = [Sge::new(&src, 0, 1500).unwrap()];
    let s1 = [Sge::new(&src, 1500, 64).unwrap()];
    let mut swr = [
        SendWr::send(3, &s0),
        SendWr::send_with_imm(4, &s1, 0xdead_beef).signaled(),
    ];
    // SAFETY: src alive until completion of the last (signaled) WR, which
    // implies the first completed too.
    unsafe { a.post_send(&mut swr).unwrap() };
    assert_eq!(poll_one(&cqa, Duration::from_secs(10)).wr_id(), 4);
    let r0 = poll_one(&cqb, Duration::from_secs(10));
    let r1 = poll_one(&cqb, Duration::from_secs(10));
    assert_eq!((r0.wr_id(), r0.byte_len(), r0.imm()), (10, 1500, None));
    assert_eq!(
        (r1.wr_id(), r1.byte_len(), r1.imm()),
        (11, 64, Some(0xdead_beef))
    );
    assert_eq!(rbuf.to_vec(0, 1500).unwrap(), pattern[..1500]);
    assert_eq!(rbuf.to_vec(4096, 64).unwrap(), pattern[1500..1564]);

    // WRITE with immediate consumes a receive at the peer.
    let rs = [Sge::new(&rbuf, 0, 16).unwrap()];
    let mut rwr = [RecvWr::new(12, &rs)];
    // SAFETY: rbuf alive until completion.
    unsafe { b.post_recv(&mut rwr).unwrap() };
    let ws = [Sge::new(&src, 0, 256).unwrap()];
    let mut wr = [SendWr::write_with_imm(5, &ws, dst.addr() + 30_000, dst.rkey(), 77).signaled()];
    // SAFETY: src alive until completion.
    unsafe { a.post_send(&mut wr).unwrap() };
    assert!(poll_one(&cqa, Duration::from_secs(10)).is_success());
    let r = poll_one(&cqb, Duration::from_secs(10));
    assert_eq!((r.opcode(), r.imm()), (WcOpcode::RecvRdmaWithImm, Some(77)));
    assert_eq!(dst.to_vec(30_000, 256).unwrap(), pattern[..256]);

    // Inline writes, batched: 16 WRs, one doorbell, only the last signaled.
    let msgs: Vec<[u8; 32]> = (0..16u8).map(|i| [i; 32]).collect();
    let sges: Vec<[Sge<'_>; 1]> = msgs.iter().map(|m| [Sge::inline(m)]).collect();
    let mut batch: Vec<SendWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let w = SendWr::write(
                100 + i as u64,
                s,
                dst.addr() + 40_000 + 32 * i as u64,
                dst.rkey(),
            )
            .inline();
            if i == 15 {
                w.signaled()
            } else {
                w
            }
        })
        .collect();
    a.post_send_inline(&mut batch).unwrap();
    assert_eq!(poll_one(&cqa, Duration::from_secs(10)).wr_id(), 115);
    for i in 0..16usize {
        assert_eq!(dst.to_vec(40_000 + 32 * i, 32).unwrap(), [i as u8; 32]);
    }
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_wrong_rkey_is_remote_access_error() {
    let d = dev();
    let (a, _b, cqa, _cqb) = rc_pair(&d, &RcOptions::default());
    let dst = MemoryRegion::new(&d.pd, 4096, Access::REMOTE_WRITE).unwrap();
    let data = [1u8; 8];
    let sge = [Sge::inline(&data)];
    let mut wr = [SendWr::write(9, &sge, dst.addr(), dst.rkey() ^ 0x5a5a_0000)
        .inline()
        .signaled()];
    a.post_send_inline(&mut wr).unwrap();
    let wc = poll_one(&cqa, Duration::from_secs(10));
    assert_eq!(wc.wr_id(), 9);
    assert_eq!(wc.status(), WcStatus::RemoteAccess);
    assert_eq!(a.state().unwrap(), QpState::Error);
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_vanished_peer_is_retry_exceeded_within_timeout() {
    let d = dev();
    // 4.096 us * 2^12 = 16.8 ms per try, 2 retries: ~50 ms (x a few under emulation).
    let opts = RcOptions {
        timeout: 12,
        retry_count: 2,
        ..RcOptions::default()
    };
    let (a, b, cqa, _cqb) = rc_pair(&d, &opts);
    drop(b); // the peer QP disappears: nothing will ever answer
    let data = [7u8; 8];
    let sge = [Sge::inline(&data)];
    let mut wr = [SendWr::send(21, &sge).inline().signaled()];
    let t = Instant::now();
    a.post_send_inline(&mut wr).unwrap();
    let wc = poll_one(&cqa, Duration::from_secs(20));
    assert_eq!((wc.wr_id(), wc.status()), (21, WcStatus::RetryExceeded));
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(a.state().unwrap(), QpState::Error);
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_overfilled_send_queue_is_typed_error() {
    let d = dev();
    let cq = CompletionQueue::new(&d.ctx, 64).unwrap();
    let caps = QpCaps {
        max_send_wr: 8,
        ..QpCaps::default()
    };
    let qp = QueuePair::new(&d.pd, QpType::Rc, &cq, &cq, caps).unwrap();
    // A QP in RTS towards a QPN nobody owns: nothing is ever acknowledged,
    // so every posted request keeps its slot until the queue is full.
    qp.init_rc(1, Access::LOCAL).unwrap();
    let nobody = RcPeer {
        qpn: 0x00ab_cdef,
        psn: 0,
        gid: d.gid,
    };
    qp.rtr_rc(&nobody, &d.path(), &RcOptions::default())
        .unwrap();
    qp.rts_rc(0, &RcOptions::default()).unwrap();
    let granted = qp.caps().max_send_wr as usize;
    let data = [0u8; 4];
    let sge = [Sge::inline(&data)];
    // Post one at a time until the queue refuses: nothing is acknowledged,
    // so that must happen right after `granted` posts.
    let mut posted = 0usize;
    let err = loop {
        let mut wr = [SendWr::send(posted as u64, &sge).inline()];
        match qp.post_send_inline(&mut wr) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(
            posted <= 4 * granted + 64,
            "queue of {granted} never filled after {posted} posts"
        );
    };
    match err {
        VerbsError::PostSend {
            index: 0, source, ..
        } => {
            assert_eq!(source.raw_os_error(), Some(libc_enomem()), "{source}");
        }
        other => panic!("expected PostSend error, got {other:?}"),
    }
    assert!(posted >= 8, "refused after only {posted} posts");
    println!("send queue: granted {granted}, refused after {posted} posts");
}

fn libc_enomem() -> i32 {
    12
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_ud_unicast_with_address_handle() {
    let d = dev();
    let cq = CompletionQueue::new(&d.ctx, 64).unwrap();
    let tx = QueuePair::new(&d.pd, QpType::Ud, &cq, &cq, QpCaps::default()).unwrap();
    let rcq = CompletionQueue::new(&d.ctx, 64).unwrap();
    let rx = QueuePair::new(&d.pd, QpType::Ud, &rcq, &rcq, QpCaps::default()).unwrap();
    tx.activate_ud(1, 0x1111, 0).unwrap();
    rx.activate_ud(1, 0x1111, 0).unwrap();
    let buf = MemoryRegion::new(&d.pd, 4096, Access::LOCAL_WRITE).unwrap();
    let rs = [Sge::new(&buf, 0, GRH_LEN + 1024).unwrap()];
    let mut rwr = [RecvWr::new(1, &rs)];
    // SAFETY: buf outlives the completion polled below.
    unsafe { rx.post_recv(&mut rwr).unwrap() };
    let ah = AddressHandle::new(
        &d.pd,
        AhAttr {
            dgid: d.gid,
            sgid_index: d.gid_index,
            port: 1,
            hop_limit: 64,
        },
    )
    .unwrap();
    let msg = b"datagram to myself";
    let s = [Sge::inline(msg)];
    let mut wr = [SendWr::send(2, &s)
        .ud(&ah, rx.qpn(), 0x1111)
        .inline()
        .signaled()];
    tx.post_send_inline(&mut wr).unwrap();
    assert!(poll_one(&cq, Duration::from_secs(10)).is_success());
    let wc = poll_one(&rcq, Duration::from_secs(10));
    assert!(wc.is_success(), "{wc:?}");
    assert_eq!(wc.byte_len() as usize, GRH_LEN + msg.len());
    assert_eq!(wc.src_qp(), tx.qpn());
    assert_eq!(buf.to_vec(GRH_LEN, msg.len()).unwrap(), msg);
}

fn ud_mcast_roundtrip(group: IpAddr, send: bool, recv: bool, count: u32) {
    let d = dev();
    let ip = local_ip();
    let cq = CompletionQueue::new(&d.ctx, 512).unwrap();
    let scq = CompletionQueue::new(&d.ctx, 64).unwrap();
    let qp = QueuePair::new(
        &d.pd,
        QpType::Ud,
        &cq,
        &cq,
        QpCaps {
            max_recv_wr: 256,
            ..QpCaps::default()
        },
    )
    .unwrap();
    // A separate sending QP: the receiving QP does not see its own sends.
    let sqp = QueuePair::new(&d.pd, QpType::Ud, &scq, &scq, QpCaps::default()).unwrap();
    // A side that only sends joins as a send-only full member (it attracts
    // no traffic); a receiving side joins as a full member.
    let send_only = send && !recv;
    let m = McastMembership::join(ip, group, send_only, Duration::from_secs(10)).expect("join");
    assert_eq!(m.qkey(), RDMA_UDP_QKEY);
    qp.activate_ud(m.port_num(), m.qkey(), 0).unwrap();
    sqp.activate_ud(m.port_num(), m.qkey(), 0).unwrap();
    let buf = MemoryRegion::new(&d.pd, 256 * 2048, Access::LOCAL_WRITE).unwrap();
    if recv {
        m.attach(&qp).unwrap();
        let sges: Vec<[Sge<'_>; 1]> = (0..256)
            .map(|i| [Sge::new(&buf, i * 2048, 2048).unwrap()])
            .collect();
        let mut rwrs: Vec<RecvWr<'_>> = sges
            .iter()
            .enumerate()
            .map(|(i, s)| RecvWr::new(i as u64, s))
            .collect();
        // SAFETY: buf outlives every receive completion (polled below, or
        // flushed when the QP is destroyed before buf).
        unsafe { qp.post_recv(&mut rwrs).unwrap() };
    }
    if send {
        if std::env::var("ROCEBUS_HOSTS").as_deref() == Ok("2") {
            std::thread::sleep(Duration::from_secs(2)); // let the peer join and post receives
        }
        let ah = m
            .address_handle(&d.pd, &rocebus::verbs::UdClass::default())
            .unwrap();
        for i in 0..count {
            let msg = format!("mcast {i}");
            let s = [Sge::inline(msg.as_bytes())];
            let mut wr = [SendWr::send(i as u64, &s)
                .ud(&ah, m.remote_qpn(), m.qkey())
                .inline()
                .signaled()];
            sqp.post_send_inline(&mut wr).unwrap();
            let mut wc = [WorkCompletion::empty(), WorkCompletion::empty()];
            let t = Instant::now();
            'sent: loop {
                let n = scq.poll(&mut wc).unwrap();
                for w in &wc[..n] {
                    if w.opcode() == WcOpcode::Send {
                        assert!(w.is_success());
                        break 'sent;
                    }
                }
                assert!(t.elapsed() < Duration::from_secs(10));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    if recv {
        let mut got = 0;
        let t = Instant::now();
        let mut wc: Vec<WorkCompletion> = (0..16).map(|_| WorkCompletion::empty()).collect();
        while got < count {
            let n = cq.poll(&mut wc).unwrap();
            for w in &wc[..n] {
                if w.opcode() == WcOpcode::Recv {
                    assert!(w.is_success(), "{w:?}");
                    let len = w.byte_len() as usize - GRH_LEN;
                    let bytes = buf
                        .to_vec(w.wr_id() as usize * 2048 + GRH_LEN, len)
                        .unwrap();
                    assert!(
                        bytes.starts_with(b"mcast "),
                        "{:?}",
                        String::from_utf8_lossy(&bytes)
                    );
                    got += 1;
                }
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "received {got} of {count}"
            );
        }
    }
    m.detach(&qp).ok();
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_ud_multicast_through_rdma_cm_loopback() {
    ud_mcast_roundtrip("239.1.2.3".parse().unwrap(), true, true, 10);
}

#[test]
#[ignore = "rdma: needs two soft-RoCE guests (cargo xtask test)"]
fn rdma_two_hosts_ud_multicast() {
    let idx: u32 = std::env::var("ROCEBUS_GUEST_INDEX")
        .expect("run by cargo xtask test in two guests")
        .parse()
        .unwrap();
    let group = "239.1.2.4".parse().unwrap();
    if idx == 0 {
        ud_mcast_roundtrip(group, true, false, 10);
    } else {
        ud_mcast_roundtrip(group, false, true, 10);
    }
}

fn cm_exchange(listen_ip: IpAddr, port: u16, server: bool) {
    cm_exchange_with(listen_ip, port, server, RcOptions::default())
}

fn cm_exchange_with(listen_ip: IpAddr, port: u16, server: bool, opts: RcOptions) {
    let d = dev();
    let cq = CompletionQueue::new(&d.ctx, 64).unwrap();
    let mr = MemoryRegion::new(&d.pd, 4096, Access::REMOTE_WRITE).unwrap();
    let mut mine = Vec::new();
    mine.extend_from_slice(&mr.addr().to_le_bytes());
    mine.extend_from_slice(&mr.rkey().to_le_bytes());
    if server {
        let qp = QueuePair::new(&d.pd, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
        let l = Listener::bind(SocketAddr::new(listen_ip, port)).unwrap();
        let req = l
            .next_request(Duration::from_secs(30))
            .unwrap()
            .expect("a connect request");
        assert_eq!(&req.private_data()[..5], b"hello");
        let conn = req
            .accept(
                &qp,
                &opts,
                Access::REMOTE_WRITE,
                &mine,
                Duration::from_secs(10),
            )
            .unwrap();
        // The client writes into our region, then disconnects.
        let t = Instant::now();
        while mr.to_vec(0, 6).unwrap() != b"wrote!" {
            assert!(t.elapsed() < Duration::from_secs(10), "peer never wrote");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            conn.wait_disconnected(Duration::from_secs(10)).unwrap(),
            "no DISCONNECTED event"
        );
    } else {
        let mut hello = b"hello".to_vec();
        hello.extend_from_slice(&[0; 20]);
        // The server thread may not listen yet (a loaded host takes more than a moment to
        // open the device and bind): "nobody listens on that port" is retried with a fresh
        // queue pair, anything else fails the test.
        let started = Instant::now();
        let (qp, conn, theirs) = loop {
            let qp = QueuePair::new(&d.pd, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
            let r = cm::resolve(
                SocketAddr::new(listen_ip, port),
                None,
                Duration::from_secs(10),
            )
            .unwrap();
            match r.connect(&qp, &opts, Access::LOCAL, &hello, Duration::from_secs(10)) {
                Ok((conn, theirs)) => break (qp, conn, theirs),
                Err(VerbsError::ConnectionRejected { status: 8, .. })
                    if started.elapsed() < Duration::from_secs(30) =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("connect: {e}"),
            }
        };
        let addr = u64::from_le_bytes(theirs[..8].try_into().unwrap());
        let rkey = u32::from_le_bytes(theirs[8..12].try_into().unwrap());
        let s = [Sge::inline(b"wrote!")];
        let mut wr = [SendWr::write(1, &s, addr, rkey).inline().signaled()];
        qp.post_send_inline(&mut wr).unwrap();
        assert!(poll_one(&cq, Duration::from_secs(10)).is_success());
        conn.disconnect().unwrap();
    }
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_cm_connect_accept_private_data_disconnect() {
    let ip = local_ip();
    let server = std::thread::spawn(move || cm_exchange(ip, 7471, true));
    std::thread::sleep(Duration::from_millis(500));
    cm_exchange(ip, 7471, false);
    server.join().unwrap();
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_gid_selected_by_address_is_roce_v2_and_pins_a_cm_connection() {
    let ip = local_ip();
    let d = dev();
    let policy = GidPolicy {
        local_ip: Some(ip),
        ..GidPolicy::default()
    };
    let table = d.ctx.gid_table(1).expect("sysfs GID table");
    let choice = select_gid(&table, &policy).expect("a RoCE v2 GID for the local address");
    eprintln!("{choice}; table: {}", table.listing());
    assert_eq!(choice.entry.gid_type, GidType::RoceV2);
    assert!(gid_matches_ip(choice.entry.gid, ip));
    assert_eq!(
        d.ctx.query_gid(1, choice.index() as i32).unwrap(),
        choice.entry.gid
    );
    // Both ends pin the chosen index; rdma_cm resolved the same address.
    let opts = RcOptions {
        gid_index: Some(choice.index() as u8),
        ..RcOptions::default()
    };
    let server = std::thread::spawn(move || cm_exchange_with(ip, 7474, true, opts));
    std::thread::sleep(Duration::from_millis(500));
    cm_exchange_with(ip, 7474, false, opts);
    server.join().unwrap();
}

#[test]
#[ignore = "rdma: needs two soft-RoCE guests (cargo xtask test)"]
fn rdma_two_hosts_cm_connect_and_write() {
    let idx = std::env::var("ROCEBUS_GUEST_INDEX").expect("two guests");
    if idx == "0" {
        cm_exchange(local_ip(), 7472, true);
    } else {
        let peer: IpAddr = std::env::var("ROCEBUS_PEER_ADDR").unwrap().parse().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        cm_exchange(peer, 7472, false);
    }
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_cm_connect_to_nobody_is_rejected() {
    let d = dev();
    let cq = CompletionQueue::new(&d.ctx, 16).unwrap();
    let qp = QueuePair::new(&d.pd, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    let r = cm::resolve(
        SocketAddr::new(local_ip(), 7999),
        None,
        Duration::from_secs(10),
    )
    .unwrap();
    match r.connect(
        &qp,
        &RcOptions::default(),
        Access::LOCAL,
        b"x",
        Duration::from_secs(10),
    ) {
        Err(VerbsError::ConnectionRejected { .. }) | Err(VerbsError::CmUnexpectedEvent { .. }) => {}
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_listener_rejects_with_reason() {
    let ip = local_ip();
    let (bound, is_bound) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let l = Listener::bind(SocketAddr::new(ip, 7473)).unwrap();
        bound.send(()).unwrap();
        let req = l.next_request(Duration::from_secs(30)).unwrap().unwrap();
        req.reject(b"bad token").unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    // Connect only once the listener is bound (a fixed sleep lost that race on a loaded host).
    is_bound
        .recv_timeout(Duration::from_secs(30))
        .expect("the listener binds");
    let d = dev();
    let cq = CompletionQueue::new(&d.ctx, 16).unwrap();
    let qp = QueuePair::new(&d.pd, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    let r = cm::resolve(SocketAddr::new(ip, 7473), None, Duration::from_secs(10)).unwrap();
    match r.connect(
        &qp,
        &RcOptions::default(),
        Access::LOCAL,
        b"x",
        Duration::from_secs(10),
    ) {
        Err(VerbsError::ConnectionRejected { reason, .. }) => {
            assert!(reason.contains("bad token"), "{reason}")
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    server.join().unwrap();
}

/// On a host without RDMA (the build machines), "no device" is a typed
/// error, not a crash; with a device, discovery lists it.
#[test]
fn no_device_is_a_typed_error_not_a_crash() {
    let has_dev = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    match (has_dev, device_names()) {
        (false, Err(VerbsError::NoDevice)) => {
            let e = Context::open(None).unwrap_err();
            assert!(e.to_string().contains("rdma link add"), "{e}");
        }
        (true, Ok(names)) => assert!(!names.is_empty()),
        (h, r) => panic!("device present: {h}, discovery said {r:?}"),
    }
}

/// A UD pool that only sends: 8 slots of 512 bytes, every fourth signaled,
/// up to 128 bytes inline, `dests_per_send` destinations per send.
fn inline_sender(d: &Dev, dests_per_send: u32) -> PooledQp {
    PooledQp::new(
        &d.pd,
        QpType::Ud,
        PoolConfig {
            recv_slots: 0,
            recv_len: 0,
            recv_batch: 1,
            recv_low_water: 0,
            send_slots: 8,
            send_len: 512,
            signal_every: 4,
            dests_per_send,
            max_inline: 128,
        },
    )
    .unwrap()
}

/// `PooledQp::send_inline` posts without copying into a send slot but still
/// takes the slot's sequence until a signaled completion frees it, so the
/// send queue never holds more requests than the ring (which devices that
/// retire work only on completions, unlike soft-RoCE, need): many more
/// datagrams than slots all arrive, in order. Staged messages and messages
/// over the inline limit are declined (the caller stages instead).
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_pool_send_inline_keeps_the_send_queue_bounded() {
    let d = dev();
    let mut tx = inline_sender(&d, 1);
    let mut rx = PooledQp::new(
        &d.pd,
        QpType::Ud,
        PoolConfig {
            recv_slots: 256,
            recv_len: 512,
            recv_batch: 16,
            recv_low_water: 8,
            send_slots: 0,
            send_len: 0,
            signal_every: 1,
            dests_per_send: 1,
            max_inline: 0,
        },
    )
    .unwrap();
    tx.qp().activate_ud(1, 0x1111, 0).unwrap();
    rx.qp().activate_ud(1, 0x1111, 0).unwrap();
    rx.post_receives().unwrap();
    let ah = AddressHandle::new(
        &d.pd,
        AhAttr {
            dgid: d.gid,
            sgid_index: d.gid_index,
            port: 1,
            hop_limit: 64,
        },
    )
    .unwrap();
    let dest = [Dest::Ud {
        ah: &ah,
        qpn: rx.qp().qpn(),
        qkey: 0x1111,
    }];
    assert!(tx.max_inline() >= 64, "inline granted: {}", tx.max_inline());
    // Declined: longer than the inline limit; and while a message is staged.
    assert!(!tx.send_inline(&[7u8; 200], &dest).unwrap());
    tx.stage(b"staged first").unwrap();
    assert!(!tx.send_inline(b"must wait", &dest).unwrap());
    tx.post_staged(&dest).unwrap();

    const N: u64 = 200;
    let mut got = Vec::new();
    let mut sent = 0u64;
    let t = Instant::now();
    while (got.len() as u64) < N + 1 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "got {} of {}",
            got.len(),
            N + 1
        );
        if sent < N {
            let msg = format!("inline {sent:04}");
            let before = tx.sends_in_flight();
            if tx.send_inline(msg.as_bytes(), &dest).unwrap() {
                sent += 1;
                // Each send holds a slot until a signaled completion frees
                // it (send_inline polls only when the ring is full).
                if before < tx.send_slots() {
                    assert_eq!(tx.sends_in_flight(), before + 1);
                }
                assert!(tx.sends_in_flight() <= tx.send_slots());
            } else {
                // Every slot in flight: completions free them.
                tx.poll_send().unwrap();
            }
        }
        rx.poll_recv(|b| got.push(String::from_utf8_lossy(b).into_owned()))
            .unwrap();
    }
    assert_eq!(got[0], "staged first");
    for (i, g) in got[1..].iter().enumerate() {
        assert_eq!(g, &format!("inline {i:04}"));
    }
    assert_eq!(tx.stats().sent, N + 1);
}

/// `PooledQp::send_prepared` sends to the destinations prepared once, each
/// enabled one getting every message in order, with the send queue bounded
/// by the ring as for `send_inline`; switching a destination off and on
/// again re-links the prepared requests; with none enabled it declines. An
/// address handle of another protection domain is refused. The receivers'
/// rings (64 slots) are reposted many times over through their prepared
/// receive chains.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_pool_send_prepared_follows_enabled_destinations() {
    let d = dev();
    let mut tx = inline_sender(&d, 2);
    let rx_cfg = PoolConfig {
        recv_slots: 64,
        recv_len: 512,
        recv_batch: 16,
        recv_low_water: 8,
        send_slots: 0,
        send_len: 0,
        signal_every: 1,
        dests_per_send: 1,
        max_inline: 0,
    };
    let mut rx = [
        PooledQp::new(&d.pd, QpType::Ud, rx_cfg).unwrap(),
        PooledQp::new(&d.pd, QpType::Ud, rx_cfg).unwrap(),
    ];
    tx.qp().activate_ud(1, 0x1111, 0).unwrap();
    for r in &mut rx {
        r.qp().activate_ud(1, 0x1111, 0).unwrap();
        r.post_receives().unwrap();
    }
    let attr = AhAttr {
        dgid: d.gid,
        sgid_index: d.gid_index,
        port: 1,
        hop_limit: 64,
    };
    let ah = Arc::new(AddressHandle::new(&d.pd, attr).unwrap());
    let dests: Vec<UdDest> = rx
        .iter()
        .map(|r| UdDest {
            ah: ah.clone(),
            qpn: r.qp().qpn(),
            qkey: 0x1111,
        })
        .collect();
    // Nothing prepared yet: declined.
    assert!(!tx.send_prepared(b"nowhere").unwrap());
    let other_pd = ProtectionDomain::new(&d.ctx).unwrap();
    let foreign = Arc::new(AddressHandle::new(&other_pd, attr).unwrap());
    assert!(tx
        .prepare_ud_dests(&[UdDest {
            ah: foreign,
            qpn: 1,
            qkey: 0x1111
        }])
        .is_err());
    tx.prepare_ud_dests(&dests).unwrap();
    assert!(
        !tx.send_prepared(&[7u8; 200]).unwrap(),
        "over the inline limit"
    );

    let mut got: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    // Sends `msgs` and waits until each receiver has `want[i]` messages.
    let mut run = |tx: &mut PooledQp, msgs: std::ops::Range<u64>, want: [usize; 2]| {
        let mut next = msgs.start;
        let t = Instant::now();
        while next < msgs.end || got[0].len() < want[0] || got[1].len() < want[1] {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "got {} and {} of {want:?}",
                got[0].len(),
                got[1].len()
            );
            if next < msgs.end {
                if tx.send_prepared(format!("m {next:04}").as_bytes()).unwrap() {
                    next += 1;
                    assert!(tx.sends_in_flight() <= tx.send_slots());
                } else {
                    tx.poll_send().unwrap();
                }
            }
            for (r, g) in rx.iter_mut().zip(got.iter_mut()) {
                r.poll_recv(|b| g.push(String::from_utf8_lossy(b).into_owned()))
                    .unwrap();
            }
        }
    };
    run(&mut tx, 0..200, [200, 200]);
    tx.set_ud_dest_enabled(0, false);
    run(&mut tx, 200..300, [200, 300]);
    tx.set_ud_dest_enabled(0, true);
    tx.set_ud_dest_enabled(1, false);
    run(&mut tx, 300..400, [300, 300]);
    tx.set_ud_dest_enabled(0, false);
    assert!(!tx.send_prepared(b"nobody").unwrap());
    tx.set_ud_dest_enabled(1, true);
    run(&mut tx, 400..450, [300, 350]);
    // Nothing else arrived late.
    std::thread::sleep(Duration::from_millis(100));
    for (r, g) in rx.iter_mut().zip(got.iter_mut()) {
        r.poll_recv(|b| g.push(String::from_utf8_lossy(b).into_owned()))
            .unwrap();
    }
    let expect = |ranges: &[std::ops::Range<u64>]| -> Vec<String> {
        ranges
            .iter()
            .flat_map(|r| r.clone().map(|i| format!("m {i:04}")))
            .collect()
    };
    assert_eq!(got[0], expect(&[0..200, 300..400]));
    assert_eq!(got[1], expect(&[0..300, 400..450]));
    assert_eq!(tx.stats().sent, 450);
    assert!(rx[0].stats().recv_posted >= 300 + 64 - 16);
}
