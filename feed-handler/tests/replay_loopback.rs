//! replay -> MoldUDP64 over UDP on loopback -> receiver, with injected loss fully recovered.

use feed_handler::binaryfile::{push_record, StreamReader};
use feed_handler::book::{Book, Event};
use feed_handler::generate::{generate, GenConfig};
use feed_handler::itch::decode_exact;
use feed_handler::moldudp64::GapConfig;
use feed_handler::udp::{ReceiverConfig, ReplayConfig, Replayer, UdpReceiver};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

#[test]
fn loss_is_recovered_and_books_match() {
    replay_with_loss(false);
}

/// The same from a capture read as it is sent (`feed-handler replay`'s path), its
/// re-requests answered from the streamed replay's history.
#[test]
fn streamed_capture_loss_is_recovered_and_books_match() {
    replay_with_loss(true);
}

fn replay_with_loss(streamed: bool) {
    let mut messages: Vec<Vec<u8>> = Vec::new();
    generate(
        &GenConfig {
            seed: 3,
            messages: 20_000,
            symbols: 20,
        },
        |m| messages.push(m.to_vec()),
    );

    let retrans_bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let mut receiver = UdpReceiver::new(&ReceiverConfig {
        group: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        interface: Ipv4Addr::LOCALHOST,
        // Set below, once the replayer has bound its port.
        sources: Vec::new(),
        retrans_server: Some(retrans_bind),
        gap: GapConfig {
            retransmit_timeout: Duration::from_millis(20),
            max_retries: 50,
            ..GapConfig::default()
        },
        recv_buffer: 0,
    })
    .expect("receiver");
    let mut cfg = ReplayConfig::new(receiver.local_addr().expect("addr"));
    cfg.retrans_bind = retrans_bind;
    cfg.drop_every = Some(7);
    cfg.linger = Duration::from_millis(300);
    // Paced so that loopback socket buffers never overflow on a loaded CI machine.
    cfg.pacing = feed_handler::udp::Pacing::MessagesPerSecond(400_000);
    let mut replayer = Replayer::new(cfg).expect("replayer");
    receiver.set_retrans_server(replayer.retrans_addr().expect("addr"));

    // A misbehaving sender on the data port: counted, logged, and the feed is unharmed.
    let junk = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let to = receiver.local_addr().expect("addr");
    let mut truncated = [b'S'; 20];
    truncated[18..20].copy_from_slice(&5u16.to_be_bytes()); // claims 5 messages, has none
    for p in [&b"short"[..], &truncated[..], &[0u8; 3][..]] {
        junk.send_to(p, to).expect("send junk");
    }

    let sent = messages.clone();
    let sender = std::thread::spawn(move || {
        if streamed {
            let mut file = Vec::new();
            for m in &sent {
                push_record(&mut file, m);
            }
            replayer
                .run_stream(StreamReader::new(std::io::Cursor::new(file)))
                .expect("replay")
        } else {
            replayer.run(&sent).expect("replay")
        }
    });

    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut live_book = Book::new();
    let complete = receiver
        .run_until_complete(Instant::now() + Duration::from_secs(60), &mut |seq, m| {
            assert_eq!(seq, got.len() as u64 + 1, "in order, no holes");
            got.push(m.to_vec());
            live_book.apply(&decode_exact(m).expect("valid ITCH"), &mut |_: &Event| {});
        })
        .expect("receive");
    let stats = sender.join().expect("sender thread");
    assert!(
        complete,
        "session completed; counters {:?}",
        receiver.tracker().counters()
    );
    assert!(
        stats.dropped > 0 && stats.requests > 0,
        "loss was injected and re-requested: {stats:?}"
    );
    assert_eq!(got, messages);
    assert_eq!(stats.messages, messages.len() as u64);
    assert_eq!(stats.unserved, 0, "{stats:?}");
    let c = receiver.tracker().counters();
    assert!(c.gaps > 0 && c.recovered > 0 && c.lost == 0, "{c:?}");
    assert_eq!(c.malformed, 3, "every junk packet counted: {c:?}");

    let mut file_book = Book::new();
    for m in &messages {
        file_book.apply(&decode_exact(m).expect("valid"), &mut |_: &Event| {});
    }
    assert_eq!(live_book, file_book);
    assert_eq!(live_book.snapshot(), file_book.snapshot());
}

/// Forged datagrams reach the feed socket before the exchange's first packet: from a sender
/// not on the list (another session, a sequence far ahead, an end of session), and from a
/// listed one (another session, a sequence far ahead). All are dropped and counted; the
/// session is followed from sequence 1 to its end, and nothing is lost.
#[test]
fn forged_datagrams_are_dropped_and_the_feed_completes() {
    use feed_handler::moldudp64::{
        empty_packet, session, PacketBuilder, SourceAddr, END_OF_SESSION,
    };
    let mut messages: Vec<Vec<u8>> = Vec::new();
    generate(
        &GenConfig {
            seed: 5,
            messages: 5_000,
            symbols: 10,
        },
        |m| messages.push(m.to_vec()),
    );
    let retrans_bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let mut receiver = UdpReceiver::new(&ReceiverConfig {
        group: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        interface: Ipv4Addr::LOCALHOST,
        // Set below, once the senders have bound their ports.
        sources: Vec::new(),
        retrans_server: Some(retrans_bind),
        gap: GapConfig {
            session: Some(session("ROCEBUS001")),
            retransmit_timeout: Duration::from_millis(20),
            max_retries: 50,
            ..GapConfig::default()
        },
        recv_buffer: 0,
    })
    .expect("receiver");
    let to = receiver.local_addr().expect("addr");
    let mut cfg = ReplayConfig::new(to);
    cfg.retrans_bind = retrans_bind;
    cfg.drop_every = Some(11);
    cfg.linger = Duration::from_millis(300);
    cfg.pacing = feed_handler::udp::Pacing::MessagesPerSecond(400_000);
    let mut replayer = Replayer::new(cfg).expect("replayer");
    receiver.set_retrans_server(replayer.retrans_addr().expect("addr"));
    let outsider = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let insider = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    receiver.set_sources(vec![
        // Bound to all interfaces: on loopback it sends from 127.0.0.1.
        SourceAddr::Exact(SocketAddr::from((
            Ipv4Addr::LOCALHOST,
            replayer.data_addr().expect("addr").port(),
        ))),
        SourceAddr::Exact(insider.local_addr().expect("addr")),
    ]);

    let forged = |name: &str, seq: u64| {
        let mut b = PacketBuilder::new(1400);
        b.start(session(name), seq);
        b.push(&messages[0]).expect("fits");
        b.bytes().to_vec()
    };
    for p in [
        forged("FORGED", 1),
        forged("ROCEBUS001", 1 << 40),
        empty_packet(session("ROCEBUS001"), 1 << 40, END_OF_SESSION).to_vec(),
    ] {
        outsider.send_to(&p, to).expect("send");
    }
    for p in [forged("FORGED", 1), forged("ROCEBUS001", 1 << 40)] {
        insider.send_to(&p, to).expect("send");
    }

    let sent = messages.clone();
    let sender = std::thread::spawn(move || replayer.run(&sent).expect("replay"));
    let mut got: Vec<Vec<u8>> = Vec::new();
    let complete = receiver
        .run_until_complete(Instant::now() + Duration::from_secs(60), &mut |seq, m| {
            assert_eq!(seq, got.len() as u64 + 1, "in order, no holes");
            got.push(m.to_vec());
        })
        .expect("receive");
    let stats = sender.join().expect("sender thread");
    let c = *receiver.tracker().counters();
    assert!(complete, "session completed; counters {c:?}");
    assert!(
        stats.requests > 0,
        "loss was injected and recovered: {stats:?}"
    );
    assert_eq!(got, messages);
    assert_eq!(receiver.ingress().foreign_source(), 3, "{c:?}");
    assert_eq!((c.wrong_session, c.far_ahead), (1, 1), "{c:?}");
    assert_eq!((c.lost, c.unrecoverable, c.malformed), (0, 0, 0), "{c:?}");
    assert_eq!(receiver.tracker().session(), Some(session("ROCEBUS001")));
}

/// `ts_recv` is the kernel's receive stamp of the datagram (SO_TIMESTAMPNS), not the time the
/// loop got round to reading it: a packet left waiting 200 ms in the socket is stamped with
/// its arrival, and the normalized messages it produces carry that stamp.
#[test]
fn ts_recv_is_the_kernel_receive_stamp() {
    use feed_handler::moldudp64::{session, PacketBuilder};
    use feed_handler::normalized::{decode, Normalized};
    use feed_handler::publish::MdSink;
    use feed_handler::service::Pipeline;
    use feed_handler::udp::unix_now_ns;

    struct Stamps(Vec<u64>);
    impl MdSink for Stamps {
        type Error = ();
        fn publish(&mut self, _channel: u16, message: &[u8]) -> Result<(), ()> {
            let h = match decode(message).expect("normalized") {
                Normalized::Bbo(m) => m.header,
                Normalized::Level(m) => m.header,
                Normalized::Trade(m) => m.header,
                Normalized::Status(m) => m.header,
                Normalized::FeedLoss(m) => m.header,
            };
            self.0.push(h.ts_recv.get());
            Ok(())
        }
    }

    let mut messages: Vec<Vec<u8>> = Vec::new();
    generate(
        &GenConfig {
            seed: 3,
            messages: 400,
            symbols: 4,
        },
        |m| messages.push(m.to_vec()),
    );
    let mut receiver = UdpReceiver::new(&ReceiverConfig {
        group: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        interface: Ipv4Addr::LOCALHOST,
        sources: Vec::new(),
        retrans_server: None,
        gap: GapConfig {
            session: Some(session("ROCEBUS001")),
            ..GapConfig::default()
        },
        recv_buffer: 0,
    })
    .expect("receiver");
    let to = receiver.local_addr().expect("addr");
    let sender = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let mut seq = 1;
    let before = unix_now_ns();
    for chunk in messages.chunks(20) {
        let mut b = PacketBuilder::new(1400);
        b.start(session("ROCEBUS001"), seq);
        for m in chunk {
            b.push(m).expect("fits");
        }
        seq += chunk.len() as u64;
        sender.send_to(b.bytes(), to).expect("send");
    }
    let sent = unix_now_ns();
    std::thread::sleep(Duration::from_millis(200));
    let read_from = unix_now_ns();
    let mut pipeline = Pipeline::new(Stamps(Vec::new()), 1, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let done = messages.len() as u64 + 1;
    while receiver.tracker().next_sequence() != Some(done) && Instant::now() < deadline {
        receiver
            .poll_timed(&mut || 0, &mut pipeline)
            .expect("receive");
    }
    let stamps = &pipeline.sink().0;
    assert!(!stamps.is_empty());
    for &t in stamps {
        assert!(
            (before..=sent).contains(&t),
            "ts_recv {t} is the arrival ({before}..={sent}), not the read (>= {read_from})"
        );
    }
}

/// Issue 41, over real sockets: while the exchange's replay runs (with loss, so real gaps
/// and re-requests are under way), a forger sending from the exchange's own IP address
/// (`feed.sources` lists the IP, any port: what the sources filter lets through) injects a
/// MoldUDP64 heartbeat claiming the next sequence + 999,000, inside the sequence window,
/// and again every 1,000 messages. The feed handler's receiver treats each as an
/// unconfirmed claim: it is disproved by the real feed's next packet, no re-request is made
/// for it and no loss declared; every real message arrives, in order, and the book built
/// from them is the file's. On fedf468's code (no claims: `claim_threshold` at the window)
/// the first forged heartbeat opened a gap of 999,000 messages, re-requested from the
/// exchange and then declared lost, and the real messages after it were dropped.
#[test]
fn a_forged_far_ahead_heartbeat_from_the_exchanges_address_loses_no_real_message() {
    use feed_handler::moldudp64::{empty_packet, session, SourceAddr, HEARTBEAT};
    let mut messages: Vec<Vec<u8>> = Vec::new();
    generate(
        &GenConfig {
            seed: 41,
            messages: 20_000,
            symbols: 20,
        },
        |m| messages.push(m.to_vec()),
    );
    let retrans_bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let mut receiver = UdpReceiver::new(&ReceiverConfig {
        group: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        interface: Ipv4Addr::LOCALHOST,
        sources: vec![SourceAddr::Ip(Ipv4Addr::LOCALHOST.into())],
        retrans_server: Some(retrans_bind),
        gap: GapConfig {
            session: Some(session("ROCEBUS001")),
            retransmit_timeout: Duration::from_millis(20),
            max_retries: 50,
            ..GapConfig::default()
        },
        // A burst of more than `claim_threshold` messages lost in the socket would itself
        // be a jump the stream has to corroborate: keep the kernel from dropping any.
        recv_buffer: 8 << 20,
    })
    .expect("receiver");
    let to = receiver.local_addr().expect("addr");
    let mut cfg = ReplayConfig::new(to);
    cfg.retrans_bind = retrans_bind;
    cfg.drop_every = Some(13);
    cfg.linger = Duration::from_millis(300);
    cfg.pacing = feed_handler::udp::Pacing::MessagesPerSecond(50_000);
    let mut replayer = Replayer::new(cfg).expect("replayer");
    receiver.set_retrans_server(replayer.retrans_addr().expect("addr"));
    // The forger: the exchange's IP address, another port.
    let forger = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");

    let sent = messages.clone();
    let sender = std::thread::spawn(move || replayer.run(&sent).expect("replay"));
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut forged = 0u64;
    let mut live_book = Book::new();
    let complete = receiver
        .run_until_complete(Instant::now() + Duration::from_secs(60), &mut |seq, m| {
            assert_eq!(seq, got.len() as u64 + 1, "in order, no holes");
            got.push(m.to_vec());
            live_book.apply(&decode_exact(m).expect("valid ITCH"), &mut |_: &Event| {});
            if got.len() % 1000 == 0 && got.len() < messages.len() {
                let claim = seq + 1 + 999_000;
                forger
                    .send_to(&empty_packet(session("ROCEBUS001"), claim, HEARTBEAT), to)
                    .expect("forge");
                forged += 1;
            }
        })
        .expect("receive");
    let stats = sender.join().expect("sender thread");
    let c = *receiver.tracker().counters();
    eprintln!("forged {forged} heartbeats; receiver {c:?}; exchange {stats:?}");
    assert!(complete, "session completed; counters {c:?}");
    assert!(forged >= 19, "the forger ran: {forged}");
    assert_eq!(got.len(), messages.len(), "{c:?}");
    assert!(got == messages, "every real message, in order");
    assert_eq!((c.lost, c.unrecoverable), (0, 0), "{c:?}");
    assert_eq!(c.claims_accepted, 0, "{c:?}");
    assert!(c.claimed >= forged / 2, "the forgeries were claims: {c:?}");
    // Only the real losses were re-requested: no request reached past the feed's end.
    assert!(stats.dropped > 0 && stats.requests > 0, "{stats:?}");
    assert_eq!(stats.unserved, 0, "{stats:?}");
    let mut file_book = Book::new();
    for m in &messages {
        file_book.apply(&decode_exact(m).expect("valid"), &mut |_: &Event| {});
    }
    assert_eq!(live_book.snapshot(), file_book.snapshot());
}
