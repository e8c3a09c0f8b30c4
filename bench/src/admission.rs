//! `admission-cost`: what an orders listener spends on one connect request before it
//! answers, allocates or counts anything, on this CPU, with no RDMA involved. Times the
//! real decisions `OrdersListener` makes per request (`rocebus::orders::first_proof`, the
//! cookie jar, `rocebus::admission::admit`) for what a flood brings: a stranger's request
//! (one keyed BLAKE3 to refuse it), a stranger claiming a cookie (up to four), a proved
//! request under load (the proof, the admission, a cookie minted), and a proved request
//! echoing its cookie. Prints the requests per second one core refuses or answers from
//! these alone; the rdma_cm reject each one also costs (a kernel round trip and a CM
//! message) is not in these figures (the guest test
//! `rdma_orders_strangers_flooding_from_many_addresses_never_keep_an_engine_out` prints the
//! engine's admission time under a real flood).
//!
//! The orders cases include the replay guard's look-up (a proved request is checked
//! against the (time, nonce) pairs the listener answered, `rocebus::admission::ReplayGuard`,
//! here holding 4,096), and a `replayed` case: a captured request played again, refused
//! silently after its proof. The `recovery_*` cases time the market-data recovery port's
//! whole decision, `RecoveryServer::on_connect_request`, with 6 handshakes in progress
//! (its `cookie_when_pending` is 4): a stranger's hello, a proved hello answered a cookie,
//! and a proved hello echoing its cookie from an address at its pending cap (refused
//! after the cookie and the proof were checked, so nothing is kept between calls).

use rocebus::admission::{admit, Admit, CookieJar, PendingCaps, Replay, ReplayGuard};
use rocebus::auth::{nonce_time, Initiator, Key, Purpose};
use rocebus::mcast::config::RecoveryServerConfig;
use rocebus::mcast::server::{ClientHandshake, RecoveryServer, Refused, ServerConfig};
use rocebus::mcast::wire::Welcome;
use rocebus::orders::first_proof;
use rocebus::ring::frame::{ConnectHello, Hello, FLAG_COOKIE, HELLO_MAGIC};
use std::hint::black_box;
use std::net::IpAddr;
use std::time::Instant;
use zerocopy::IntoBytes;

/// Options of `admission-cost`.
#[derive(Debug, Clone, clap::Args)]
pub struct AdmissionCostArgs {
    /// Requests timed per case.
    #[arg(short = 'n', long, default_value_t = 200_000)]
    pub iterations: u32,
    /// Rounds (each times every case once; the best round is reported).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
}

fn request(token: &[u8], cookie: Option<&[u8]>) -> ConnectHello {
    let ini = Initiator::new(Key::derive(token, Purpose::Orders));
    let mut c = ConnectHello {
        hello: Hello {
            magic: HELLO_MAGIC.into(),
            ring_log2: 20.into(),
            flags: if cookie.is_some() { FLAG_COOKIE } else { 0 }.into(),
            ring_addr: 0x7f00_0000_0000.into(),
            ring_rkey: 0x1234.into(),
            max_payload: 16384.into(),
            conn_id: 0.into(),
        },
        nonce_tail: [0; 8],
        proof: [0; 16],
    };
    c.set_nonce(&ini.nonce());
    c.proof = ini.first_proof(c.hello.as_bytes(), cookie.unwrap_or(&[]));
    c
}

/// Nanoseconds per call of `f`, best of `rounds` runs of `n` calls.
fn per_call(n: u32, rounds: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    (0..rounds.max(1))
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(n.max(1))
        })
        .fold(f64::INFINITY, f64::min)
}

/// A recovery server (defaults: 32 connections, a cookie from 4 in progress) with 6
/// handshakes in progress, 2 of them from `ip` (its cap), and three hellos from `ip`: a
/// stranger's, a proved one without a cookie, and one echoing `ip`'s cookie.
fn recovery_port(ip: &IpAddr, now: u64) -> (RecoveryServer, [Vec<u8>; 3]) {
    let secret = rocebus::auth::generate_secret(256);
    let key = Key::derive(secret.as_bytes(), Purpose::Recovery);
    let limits = RecoveryServerConfig::default();
    let mut s = RecoveryServer::new(
        ServerConfig {
            limits,
            max_request_messages: 4096,
            snapshot_chunk: 1024,
            setup_timeout_ns: 5_000_000_000,
            outbox_capacity: 4096,
            lines: 2,
        },
        key.clone(),
        Welcome::identity(1, 7, false, 0x1234, [9; 16]),
    );
    for i in 0..6u8 {
        let peer = if i < 2 {
            format!("{ip}:{}", 1000 + u16::from(i))
        } else {
            format!("198.18.1.{i}:1000")
        };
        let fill = ClientHandshake::new(key.clone(), 1, false);
        let id = match s.on_connect_request(now, peer.clone(), fill.hello().as_bytes()) {
            Ok((id, _)) => id,
            // From the 5th on: under load, echo the cookie.
            Err(Refused::Cookie(c)) => {
                let again = ClientHandshake::with_cookie(key.clone(), 1, false, Some(&c));
                s.on_connect_request(now, peer, again.hello().as_bytes())
                    .expect("a slot with the cookie")
                    .0
            }
            Err(e) => panic!("{e:?}"),
        };
        s.on_established(now, id);
    }
    let stranger =
        ClientHandshake::new(Key::derive(b"not the secret", Purpose::Recovery), 1, false);
    let proved = ClientHandshake::new(key.clone(), 1, false);
    let cookie = match s.on_connect_request(now, format!("{ip}:9"), proved.hello().as_bytes()) {
        Err(Refused::Cookie(c)) => c,
        other => panic!("expected a cookie under load: {other:?}"),
    };
    let echoed = ClientHandshake::with_cookie(key, 1, false, Some(&cookie));
    let hellos = [&stranger, &proved, &echoed].map(|h| h.hello().as_bytes().to_vec());
    (s, hellos)
}

/// Runs the measurement: one line per case, then a `RESULT` line.
pub fn run(a: &AdmissionCostArgs) -> anyhow::Result<()> {
    let token = rocebus::auth::generate_secret(256);
    let key = Key::derive(token.as_bytes(), Purpose::Orders);
    let jar = CookieJar::new(5_000_000_000);
    let ip = IpAddr::from([198, 18, 0, 7]);
    let now = 42_000_000_000u64;
    let caps = PendingCaps {
        per_address: 2,
        total: 8,
    };
    // Under load: 6 handshakes in progress from other addresses.
    let pending: Vec<IpAddr> = (1..=6u8).map(|i| IpAddr::from([198, 18, 1, i])).collect();
    let stranger = request(b"not the token", None);
    let stranger_cookie = request(b"not the token", Some(&[9; 16]));
    let proved = request(token.as_bytes(), None);
    let cookie = jar.mint(&ip, now);
    let echoed = request(token.as_bytes(), Some(&cookie));
    assert_eq!(first_proof(&key, &jar, &stranger, &ip, now), None);
    assert_eq!(first_proof(&key, &jar, &stranger_cookie, &ip, now), None);
    assert_eq!(first_proof(&key, &jar, &proved, &ip, now), Some(false));
    assert_eq!(first_proof(&key, &jar, &echoed, &ip, now), Some(true));
    assert_eq!(admit(&caps, 4, false, &ip, &pending), Admit::SendCookie);
    assert_eq!(admit(&caps, 4, true, &ip, &pending), Admit::Slot);
    // The replay guard as a listener holds it after 4,096 answered requests.
    let wall = rocebus::clock::Wall::now().as_nanos();
    let mut guard = ReplayGuard::new(30_000_000_000, 4096);
    for i in 0..4096u64 {
        let mut ni = [0u8; 16];
        ni[..8].copy_from_slice(&i.to_le_bytes());
        guard.record(&ni, wall - i * 1000, wall);
    }
    let replay = request(token.as_bytes(), None);
    let ni = replay.nonce();
    let made = nonce_time(&ni);
    guard.record(&ni, made, wall);
    let fresh = proved.nonce();
    assert_eq!(guard.check(&ni, made, wall), Err(Replay::Seen));
    assert_eq!(guard.check(&fresh, nonce_time(&fresh), wall), Ok(()));
    let (mut rec, rec_hellos) = recovery_port(&ip, now);
    let [rec_stranger, rec_proved, rec_echoed] = &rec_hellos;
    let peer = format!("{ip}:4791");
    assert_eq!(
        rec.on_connect_request(now, peer.clone(), rec_stranger)
            .err(),
        Some(Refused::Unproved)
    );
    assert!(matches!(
        rec.on_connect_request(now, peer.clone(), rec_proved).err(),
        Some(Refused::Cookie(_))
    ));
    assert!(matches!(
        rec.on_connect_request(now, peer.clone(), rec_echoed).err(),
        Some(Refused::Reason(_))
    ));
    let (n, r) = (a.iterations, a.rounds);
    let cases: [(&str, f64); 8] = [
        (
            "stranger",
            per_call(n, r, || {
                black_box(first_proof(&key, &jar, black_box(&stranger), &ip, now));
            }),
        ),
        (
            "stranger_with_cookie_flag",
            per_call(n, r, || {
                black_box(first_proof(
                    &key,
                    &jar,
                    black_box(&stranger_cookie),
                    &ip,
                    now,
                ));
            }),
        ),
        (
            "replayed",
            per_call(n, r, || {
                let ok = first_proof(&key, &jar, black_box(&replay), &ip, now);
                black_box(ok.map(|_| guard.check(&ni, made, wall)));
            }),
        ),
        (
            "proved_under_load_cookie_minted",
            per_call(n, r, || {
                let ok = first_proof(&key, &jar, black_box(&proved), &ip, now);
                let _ = black_box(guard.check(&fresh, nonce_time(&fresh), wall));
                if admit(&caps, 4, ok == Some(true), &ip, black_box(&pending)) == Admit::SendCookie
                {
                    black_box(jar.mint(&ip, now));
                }
            }),
        ),
        (
            "proved_cookie_echoed",
            per_call(n, r, || {
                let ok = first_proof(&key, &jar, black_box(&echoed), &ip, now);
                let _ = black_box(guard.check(&fresh, nonce_time(&fresh), wall));
                black_box(admit(&caps, 4, ok == Some(true), &ip, black_box(&pending)));
            }),
        ),
        (
            "recovery_stranger",
            per_call(n, r, || {
                black_box(rec.on_connect_request(now, peer.clone(), black_box(rec_stranger))).ok();
            }),
        ),
        (
            "recovery_proved_under_load_cookie_minted",
            per_call(n, r, || {
                black_box(rec.on_connect_request(now, peer.clone(), black_box(rec_proved))).ok();
            }),
        ),
        (
            "recovery_cookie_echoed",
            per_call(n, r, || {
                black_box(rec.on_connect_request(now, peer.clone(), black_box(rec_echoed))).ok();
            }),
        ),
    ];
    println!(
        "{:>32} {:>10} {:>14}  (best of {r} rounds of {n} requests, one core, no RDMA)",
        "request", "ns", "requests/s"
    );
    let mut result = String::from("RESULT");
    for (name, ns) in cases {
        println!("{name:>32} {ns:>10.1} {:>14.0}", 1e9 / ns);
        result.push_str(&format!(" {name}_ns={ns:.1}"));
    }
    println!("{result}");
    Ok(())
}
