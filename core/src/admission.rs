//! Pre-authentication slots: how many handshakes that have proved nothing
//! yet a listener keeps at once, in total and per peer address. Every
//! listener that admits strangers (the orders listener, the recovery port,
//! RC fan-out through the orders listener) asks [`PendingCaps::check`]
//! before it spends anything on a connect request.
//!
//! The rule: the **per-address cap is checked first and is strictly less
//! than the total cap**, so one address can never hold every slot. A host
//! that floods connect requests and never completes a handshake holds at
//! most `per_address` slots; the other `total - per_address` stay free for
//! peers at other addresses, and a healthy peer gets one within one
//! handshake time.
//!
//! Many addresses can still fill the total, but only with requests that
//! prove knowledge of the secret (a stranger's request is refused silently
//! before it is counted anywhere: [`crate::auth`]'s initiator-first proof).
//! What is left is a captured request replayed from many addresses, or a
//! holder of the secret flooding: under load the listener demands a
//! [`CookieJar`] cookie, a stateless, address-bound, time-limited value the
//! initiator must fold into its next request's proof, before any slot is
//! taken (WireGuard's cookie reply, QUIC's Retry, TCP's SYN cookies).
//!
//! Pure values: the callers keep their pending handshakes and pass what
//! they hold and the time; nothing here touches a device or reads a clock.

/// Why a pending slot was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingRefusal {
    /// This address already holds `per_address` pending handshakes.
    AddressFull,
    /// `total` pending handshakes are in progress.
    Full,
}

/// The caps on handshakes in progress (connect requests answered whose
/// peer has not proved knowledge of the secret yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingCaps {
    /// From one address at once; less than `total`.
    pub per_address: usize,
    /// From everyone at once.
    pub total: usize,
}

impl PendingCaps {
    /// Checks the caps' relation: `1 <= per_address < total`.
    pub fn validate(&self) -> Result<(), String> {
        if self.per_address == 0 || self.per_address >= self.total {
            return Err(format!(
                "{} per address must be at least 1 and less than the total of {} (one address must never hold every slot)",
                self.per_address, self.total
            ));
        }
        Ok(())
    }

    /// Whether a new handshake from `addr` may take a slot, given the
    /// addresses of the handshakes in progress. The address is checked
    /// before the total, so a refusal for a full listener is never charged
    /// to a peer whose own address holds nothing, and an address at its cap
    /// is told so even when the listener is also full.
    pub fn check<A: PartialEq>(
        &self,
        addr: &A,
        pending: impl IntoIterator<Item = A>,
    ) -> Result<(), PendingRefusal> {
        let (mut total, mut mine) = (0usize, 0usize);
        for a in pending {
            total += 1;
            if a == *addr {
                mine += 1;
            }
        }
        if mine >= self.per_address {
            return Err(PendingRefusal::AddressFull);
        }
        if total >= self.total {
            return Err(PendingRefusal::Full);
        }
        Ok(())
    }
}

/// Bytes of an admission cookie.
pub const COOKIE_LEN: usize = 16;

/// An admission cookie: proof that its holder receives at an address.
pub type Cookie = [u8; COOKIE_LEN];

/// Mints and checks admission cookies without keeping any state per peer.
///
/// A cookie is `BLAKE3-keyed(R, "rocebus cookie", address, epoch)` truncated
/// to 128 bits, where `R` is a random key of this jar (made at start, never
/// derived from the shared secret and never sent: a cookie tells nobody
/// anything about the secret) and `epoch = now / period`. A cookie minted
/// in the current or the previous epoch is valid, so it lives between one
/// and two periods; one made for another address is never valid for this
/// one. Nothing is stored: a flood of requests costs one keyed hash each.
#[derive(Clone)]
pub struct CookieJar {
    key: [u8; 32],
    period_ns: u64,
}

impl std::fmt::Debug for CookieJar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CookieJar")
            .field("period_ns", &self.period_ns)
            .finish_non_exhaustive()
    }
}

impl CookieJar {
    /// A jar with a fresh random key; cookies live `period_ns` to twice that.
    pub fn new(period_ns: u64) -> Self {
        let mut key = [0u8; 32];
        // As for nonces: no cookie key from a generator that is not there.
        getrandom::getrandom(&mut key).expect("the OS random generator is unavailable");
        Self::with_key(key, period_ns)
    }

    /// A jar with a given key (tests, benchmarks).
    pub fn with_key(key: [u8; 32], period_ns: u64) -> Self {
        CookieJar {
            key,
            period_ns: period_ns.max(1),
        }
    }

    fn cookie(&self, addr: &std::net::IpAddr, epoch: u64) -> Cookie {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(b"rocebus cookie");
        match addr {
            std::net::IpAddr::V4(a) => h.update(&a.to_ipv6_mapped().octets()),
            std::net::IpAddr::V6(a) => h.update(&a.octets()),
        };
        h.update(&epoch.to_le_bytes());
        let mut c = [0u8; COOKIE_LEN];
        c.copy_from_slice(&h.finalize().as_bytes()[..COOKIE_LEN]);
        c
    }

    /// The cookie to hand a request from `addr` at `now_ns`.
    pub fn mint(&self, addr: &std::net::IpAddr, now_ns: u64) -> Cookie {
        self.cookie(addr, now_ns / self.period_ns)
    }

    /// The cookies valid for `addr` at `now_ns`: this epoch's, then the
    /// previous one's. A caller that folds the cookie into a proof checks
    /// the proof against each.
    pub fn valid(&self, addr: &std::net::IpAddr, now_ns: u64) -> [Cookie; 2] {
        let e = now_ns / self.period_ns;
        [self.cookie(addr, e), self.cookie(addr, e.saturating_sub(1))]
    }

    /// How a connect request's first proof checks out, the one check every
    /// listener makes before anything else: `check(cookie)` says whether
    /// the proof covers `cookie` (empty: none). A request that claims a
    /// cookie (`claims_cookie`, its hello's flag) is checked against each
    /// cookie valid for `addr` at `now_ns`, one that does not against none.
    /// `None`: no valid proof (a stranger, or a cookie of another address or
    /// too old); `Some(true)`: proved over a valid cookie of `addr`;
    /// `Some(false)`: proved, no cookie. One keyed hash, or with a claimed
    /// cookie up to two (plus the two cookies'); nothing kept.
    pub fn proved(
        &self,
        addr: &std::net::IpAddr,
        now_ns: u64,
        claims_cookie: bool,
        check: impl Fn(&[u8]) -> bool,
    ) -> Option<bool> {
        if !claims_cookie {
            return check(&[]).then_some(false);
        }
        self.valid(addr, now_ns)
            .iter()
            .any(|c| check(c))
            .then_some(true)
    }

    /// Whether `cookie` is valid for `addr` at `now_ns` (constant time).
    pub fn check(&self, addr: &std::net::IpAddr, cookie: &[u8], now_ns: u64) -> bool {
        use subtle::ConstantTimeEq;
        let [a, b] = self.valid(addr, now_ns);
        cookie.len() == COOKIE_LEN && bool::from(a.ct_eq(cookie) | b.ct_eq(cookie))
    }
}

/// Magic of a [`CookieReply`] ("RBC1").
pub const COOKIE_MAGIC: u32 = u32::from_le_bytes(*b"RBC1");

/// The private data of a reject that asks for a cookie, on every listener
/// that hands them out (the orders listener, the market-data recovery
/// port): a listener under load answers a proved request it has no
/// slot-free pass for with this, and keeps nothing. The initiator connects
/// again with its hello's cookie flag set and its first proof over
/// `cookie` (the cookie itself does not travel again: the listener
/// recomputes it from the request's address and the time). 20 bytes. The
/// cookie is keyed by a random key of the listener, not by the shared
/// secret ([`CookieJar`]).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::KnownLayout,
    zerocopy::Immutable,
)]
#[repr(C)]
pub struct CookieReply {
    /// [`COOKIE_MAGIC`].
    pub magic: zerocopy::little_endian::U32,
    /// The cookie, bound to the initiator's address and the time.
    pub cookie: Cookie,
}
const _: () = assert!(std::mem::size_of::<CookieReply>() == 20);

impl CookieReply {
    /// The reply carrying `cookie`.
    pub fn new(cookie: Cookie) -> Self {
        CookieReply {
            magic: COOKIE_MAGIC.into(),
            cookie,
        }
    }

    /// The cookie in a reject's private data, if it is a cookie reply.
    pub fn parse(data: &[u8]) -> Option<Cookie> {
        use zerocopy::FromBytes;
        let (r, _) = CookieReply::read_from_prefix(data).ok()?;
        (r.magic.get() == COOKIE_MAGIC).then_some(r.cookie)
    }
}

/// What a listener does with a connect request whose initiator proved
/// knowledge of the secret, in the order the checks are made: cookie (only
/// under load), then the address's cap, then the total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Take a slot and answer.
    Slot,
    /// Under load and no valid cookie: answer with a cookie, keep nothing.
    SendCookie,
    /// Refused by a cap.
    Refuse(PendingRefusal),
}

/// The admission decision for a proved request from `addr`: under load
/// (`pending.len() >= cookie_when_pending`) a request must carry a valid
/// cookie (`cookie_ok`) before any cap is looked at or slot taken; then the
/// address's cap; then the total ([`PendingCaps::check`]).
pub fn admit<A: PartialEq + Clone>(
    caps: &PendingCaps,
    cookie_when_pending: usize,
    cookie_ok: bool,
    addr: &A,
    pending: &[A],
) -> Admit {
    if pending.len() >= cookie_when_pending && !cookie_ok {
        return Admit::SendCookie;
    }
    match caps.check(addr, pending.iter().cloned()) {
        Ok(()) => Admit::Slot,
        Err(r) => Admit::Refuse(r),
    }
}

/// Why [`ReplayGuard::check`] refused a proved request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Made more than `max_age` ago, or at or before a time the guard has
    /// forgotten requests of (it cannot tell it from a replay).
    TooOld,
    /// Made more than `max_age` in the future (the initiator's clock, or a
    /// forged time: it is covered by the proof, so only a holder of the
    /// secret can have made it).
    FromTheFuture,
    /// Its nonce and time were answered before: a captured request played
    /// again.
    Seen,
}

/// Requests a [`ReplayGuard`] remembers at most; beyond, it forgets the
/// oldest and refuses everything made at or before it.
pub const REPLAY_GUARD_CAPACITY: usize = 4096;

/// Makes a captured connect request worthless: a listener answers each
/// first proof at most once.
///
/// A first proof ([`crate::auth::check_first_proof`]) has nothing fresh
/// from the listener in it, so a captured one checks out for anyone who
/// plays it again; before this, a replay from an address without a cookie
/// requirement took a pending slot (a queue pair, a ring) until
/// `connect_timeout_ms` and got the responder's proof. Two parts make the
/// refusal sound:
/// - **Time-bound proofs.** The initiator's nonce ends with the wall-clock
///   time it was made ([`crate::auth::nonce_time`]), covered by the proof:
///   a request made more than `max_age` before (or after) the listener's
///   clock is refused, so a capture expires and the guard only has to
///   remember a window.
/// - **A bounded memory of the window.** Every answered request's (time,
///   nonce) is kept until it is `max_age` old; one seen again is refused.
///   When more than [`REPLAY_GUARD_CAPACITY`] are inside the window (only
///   holders of the secret can make them), the oldest is forgotten and
///   every request made at or before its time is refused from then on
///   (`floor`): forgetting never lets a replay in, at worst it refuses a
///   late genuine request, which connects again with a fresh nonce.
///
/// A bounded cache alone (no time in the proof) is not sound: a capture
/// older than what the cache holds would be answered again. A time bound
/// alone leaves the window open. Both together need the hosts' clocks to
/// agree within `max_age` (NTP or PTP do, by orders of magnitude).
///
/// Checked after the first proof (a stranger cannot make an entry or probe
/// one) and before the cookie (a replay costs nothing, not even a cookie);
/// a request is recorded only when it is answered. Pure value: the caller
/// passes the wall-clock time.
#[derive(Debug, Clone)]
pub struct ReplayGuard {
    seen: std::collections::BTreeSet<(u64, crate::auth::Nonce)>,
    max_age_ns: u64,
    capacity: usize,
    /// Requests made at or before this were (possibly) forgotten.
    floor: u64,
}

impl ReplayGuard {
    /// A guard refusing requests more than `max_age_ns` off the listener's
    /// clock, remembering at most `capacity` (at least 1).
    pub fn new(max_age_ns: u64, capacity: usize) -> Self {
        ReplayGuard {
            seen: std::collections::BTreeSet::new(),
            max_age_ns,
            capacity: capacity.max(1),
            floor: 0,
        }
    }

    /// Whether a proved request with `nonce`, made at `made` (wall-clock
    /// nanoseconds, from the nonce), may be answered at `now` (wall clock).
    pub fn check(&self, nonce: &crate::auth::Nonce, made: u64, now: u64) -> Result<(), Replay> {
        if made > now.saturating_add(self.max_age_ns) {
            return Err(Replay::FromTheFuture);
        }
        if made < now.saturating_sub(self.max_age_ns) || (self.floor != 0 && made <= self.floor) {
            return Err(Replay::TooOld);
        }
        if self.seen.contains(&(made, *nonce)) {
            return Err(Replay::Seen);
        }
        Ok(())
    }

    /// Remembers a request that was answered (after [`check`](Self::check)
    /// passed), and forgets those out of the window at `now`.
    pub fn record(&mut self, nonce: &crate::auth::Nonce, made: u64, now: u64) {
        let oldest = now.saturating_sub(self.max_age_ns);
        while self.seen.first().is_some_and(|&(t, _)| t < oldest) {
            self.seen.pop_first();
        }
        self.seen.insert((made, *nonce));
        while self.seen.len() > self.capacity {
            if let Some((t, _)) = self.seen.pop_first() {
                self.floor = self.floor.max(t);
            }
        }
    }

    /// Requests remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    const CAPS: PendingCaps = PendingCaps {
        per_address: 2,
        total: 8,
    };

    #[test]
    fn the_per_address_cap_must_be_below_the_total() {
        assert_eq!(CAPS.validate(), Ok(()));
        for (per_address, total) in [(0, 8), (8, 8), (9, 8), (1, 1)] {
            let c = PendingCaps { per_address, total };
            assert!(c.validate().is_err(), "{c:?}");
        }
    }

    #[test]
    fn an_address_at_its_cap_is_refused_before_the_total() {
        let a = IpAddr::from([198, 18, 0, 9]);
        let b = IpAddr::from([198, 18, 0, 1]);
        assert_eq!(CAPS.check(&a, [a, b]), Ok(()));
        assert_eq!(CAPS.check(&a, [a, a]), Err(PendingRefusal::AddressFull));
        // Full, and `a` holds its share: the address is what it is told.
        let full = [a, a, b, b, b, b, b, b];
        assert_eq!(CAPS.check(&a, full), Err(PendingRefusal::AddressFull));
        let c = IpAddr::from([198, 18, 0, 3]);
        assert_eq!(CAPS.check(&c, full), Err(PendingRefusal::Full));
    }

    /// A model of a listener (slots held for one handshake time, in ticks)
    /// under one address flooding a request every tick and never
    /// completing: a healthy peer at another address asking once, at any
    /// tick, is admitted at once. With the old order (total first, and a
    /// per-address cap of 16 above the total of 8) it never was.
    #[test]
    fn one_flooding_address_never_keeps_another_out() {
        let attacker = IpAddr::from([198, 18, 0, 101]);
        let healthy = IpAddr::from([198, 18, 0, 1]);
        let handshake_ticks = 25u64;
        let old = |addr: &IpAddr, held: &[(IpAddr, u64)]| {
            let mine = held.iter().filter(|(a, _)| a == addr).count();
            if held.len() >= 8 {
                Err(PendingRefusal::Full)
            } else if mine >= 16 {
                Err(PendingRefusal::AddressFull)
            } else {
                Ok(())
            }
        };
        for use_old in [false, true] {
            let mut held: Vec<(IpAddr, u64)> = Vec::new();
            let (mut healthy_in, mut attacker_in, mut asked) = (0, 0, 0);
            for now in 0..1000u64 {
                held.retain(|&(_, deadline)| now < deadline);
                // 100 requests from the attacker per tick.
                for _ in 0..100 {
                    let ok = if use_old {
                        old(&attacker, &held)
                    } else {
                        CAPS.check(&attacker, held.iter().map(|h| h.0))
                    };
                    if ok.is_ok() {
                        held.push((attacker, now + handshake_ticks));
                        attacker_in += 1;
                    }
                }
                if now % 7 == 3 {
                    asked += 1;
                    let ok = if use_old {
                        old(&healthy, &held)
                    } else {
                        CAPS.check(&healthy, held.iter().map(|h| h.0))
                    };
                    if ok.is_ok() {
                        healthy_in += 1;
                    }
                }
            }
            assert!(attacker_in > 0);
            if use_old {
                assert_eq!(healthy_in, 0, "the old order kept the healthy peer out");
            } else {
                assert_eq!(
                    healthy_in, asked,
                    "every attempt of the healthy peer got a slot"
                );
                assert!(held.iter().filter(|h| h.0 == attacker).count() <= 2);
            }
        }
    }

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn a_cookie_is_valid_for_its_address_for_one_to_two_periods() {
        let jar = CookieJar::with_key([7; 32], 5 * SEC);
        let a = IpAddr::from([198, 18, 0, 1]);
        let b = IpAddr::from([198, 18, 0, 2]);
        // Minted early in an epoch: valid to the end of the next one.
        let t = 10 * SEC + 1;
        let c = jar.mint(&a, t);
        assert!(jar.check(&a, &c, t));
        assert!(jar.check(&a, &c, 15 * SEC - 1));
        assert!(jar.check(&a, &c, 20 * SEC - 1));
        assert!(!jar.check(&a, &c, 20 * SEC), "expired after two periods");
        // Minted at the end of an epoch: still valid one period on.
        let late = jar.mint(&a, 15 * SEC - 1);
        assert!(jar.check(&a, &late, 20 * SEC - 1));
        // Bound to the address, the key and its length.
        assert!(!jar.check(&b, &c, t), "another address");
        let v6 = IpAddr::from([0xfe80u16, 0, 0, 0, 0, 0, 0, 1]);
        assert!(!jar.check(&v6, &c, t));
        assert!(!CookieJar::with_key([8; 32], 5 * SEC).check(&a, &c, t));
        assert!(!jar.check(&a, &c[..15], t));
        let mut bad = c;
        bad[3] ^= 1;
        assert!(!jar.check(&a, &bad, t));
        // Not valid before it was minted (a clock read earlier).
        assert!(!jar.check(&a, &jar.mint(&a, 30 * SEC), t));
        assert_eq!(jar.valid(&a, t)[0], c);
        assert!(format!("{jar:?}").contains("period_ns"));
        assert!(!format!("{jar:?}").contains("key"));
    }

    #[test]
    fn two_jars_never_agree_and_ipv4_is_not_its_mapped_v6_twin_by_accident() {
        let a = IpAddr::from([198, 18, 0, 1]);
        let (j1, j2) = (CookieJar::new(SEC), CookieJar::new(SEC));
        assert_ne!(j1.mint(&a, 0), j2.mint(&a, 0), "fresh random keys");
        // IPv4 is hashed as its v4-mapped v6 form: the same host either way.
        let mapped = IpAddr::V6(std::net::Ipv4Addr::new(198, 18, 0, 1).to_ipv6_mapped());
        assert_eq!(j1.mint(&a, 0), j1.mint(&mapped, 0));
    }

    fn nonce(i: u8) -> crate::auth::Nonce {
        [i; crate::auth::NONCE_LEN]
    }

    /// A proved request is answered once: played again (same nonce and
    /// time) it is refused, from any address, while its time is inside the
    /// window; after, it is too old. Times too far either side are refused.
    #[test]
    fn a_request_is_answered_once_inside_its_window_and_never_after() {
        let mut g = ReplayGuard::new(30 * SEC, 16);
        let now = 1_000 * SEC;
        let (n, made) = (nonce(1), now - SEC);
        assert_eq!(g.check(&n, made, now), Ok(()));
        g.record(&n, made, now);
        assert_eq!(g.check(&n, made, now), Err(Replay::Seen));
        assert_eq!(g.check(&n, made, now + 29 * SEC), Err(Replay::Seen));
        // Out of the window: too old, forgotten or not.
        assert_eq!(g.check(&n, made, now + 30 * SEC), Err(Replay::TooOld));
        g.record(&nonce(2), now + 31 * SEC, now + 31 * SEC);
        assert_eq!(g.len(), 1, "out-of-window entries are dropped");
        assert_eq!(g.check(&n, made, now + 31 * SEC), Err(Replay::TooOld));
        // Another nonce, or the same nonce at another time: a new request.
        assert_eq!(g.check(&nonce(3), made, now), Ok(()));
        assert_eq!(g.check(&n, made + 1, now), Ok(()));
        // Clocks: 30 s either side.
        assert_eq!(g.check(&nonce(4), now - 30 * SEC, now), Ok(()));
        assert_eq!(
            g.check(&nonce(4), now - 30 * SEC - 1, now),
            Err(Replay::TooOld)
        );
        assert_eq!(g.check(&nonce(4), now + 30 * SEC, now), Ok(()));
        assert_eq!(
            g.check(&nonce(4), now + 30 * SEC + 1, now),
            Err(Replay::FromTheFuture)
        );
        assert_eq!(g.check(&nonce(4), 0, now), Err(Replay::TooOld));
    }

    /// Past its capacity the guard forgets the oldest request, and from
    /// then on refuses everything made at or before it: no forgotten
    /// request can be answered again. Without the floor the first one
    /// would be.
    #[test]
    fn forgetting_never_lets_a_replay_in() {
        let mut g = ReplayGuard::new(30 * SEC, 4);
        let now = 1_000 * SEC;
        for i in 0..6u8 {
            let made = now - 10 * SEC + u64::from(i) * SEC;
            assert_eq!(g.check(&nonce(i), made, now), Ok(()));
            g.record(&nonce(i), made, now);
        }
        assert_eq!(g.len(), 4);
        for i in 0..6u8 {
            let made = now - 10 * SEC + u64::from(i) * SEC;
            let r = g.check(&nonce(i), made, now);
            if i < 2 {
                assert_eq!(r, Err(Replay::TooOld), "forgotten {i}");
            } else {
                assert_eq!(r, Err(Replay::Seen), "remembered {i}");
            }
        }
        // A fresh request after the floor is answered.
        assert_eq!(g.check(&nonce(9), now, now), Ok(()));
        // The capacity is bounded, whatever arrives.
        for i in 0..100u64 {
            g.record(&nonce(7), now + i, now);
        }
        assert_eq!(g.len(), 4);
        assert!(!g.is_empty());
    }

    #[test]
    fn cookie_reply_fixed_bytes() {
        // A reject asking for a cookie: "RBC1", then the cookie.
        static COOKIE_BYTES: [u8; 20] = [
            b'R', b'B', b'C', b'1', 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9,
            0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf,
        ];
        use zerocopy::IntoBytes;
        let r = CookieReply::new(std::array::from_fn(|i| 0xc0 + i as u8));
        assert_eq!(r.as_bytes(), &COOKIE_BYTES);
        assert_eq!(CookieReply::parse(&COOKIE_BYTES), Some(r.cookie));
        assert_eq!(CookieReply::parse(&COOKIE_BYTES[..19]), None);
        assert_eq!(CookieReply::parse(b""), None, "a silent reject");
        assert_eq!(CookieReply::parse(b"rocebus: too many connections"), None);
    }

    #[test]
    fn a_claimed_cookie_is_checked_against_the_valid_ones_only() {
        let jar = CookieJar::with_key([5; 32], SEC);
        let a = IpAddr::from([198, 18, 0, 1]);
        let c = jar.mint(&a, 10 * SEC);
        let over = |want: Cookie| move |got: &[u8]| got == want;
        assert_eq!(jar.proved(&a, 10 * SEC, true, over(c)), Some(true));
        assert_eq!(jar.proved(&a, 11 * SEC, true, over(c)), Some(true));
        assert_eq!(jar.proved(&a, 12 * SEC, true, over(c)), None, "too old");
        let b = IpAddr::from([198, 18, 0, 2]);
        assert_eq!(jar.proved(&b, 10 * SEC, true, over(c)), None, "elsewhere");
        assert_eq!(
            jar.proved(&a, 10 * SEC, false, |g| g.is_empty()),
            Some(false)
        );
        assert_eq!(jar.proved(&a, 10 * SEC, true, |g| g.is_empty()), None);
        assert_eq!(jar.proved(&a, 10 * SEC, false, |_| false), None);
    }

    /// The order of the checks: under load the cookie comes before any cap
    /// (a stranger replaying a captured request is answered a cookie and
    /// takes nothing), then the address, then the total.
    #[test]
    fn under_load_a_cookie_comes_before_any_cap_then_address_then_total() {
        let a = IpAddr::from([198, 18, 0, 9]);
        let b = IpAddr::from([198, 18, 0, 1]);
        let c = IpAddr::from([198, 18, 0, 3]);
        // Not under load: no cookie needed.
        assert_eq!(admit(&CAPS, 4, false, &a, &[b]), Admit::Slot);
        assert_eq!(
            admit(&CAPS, 4, false, &a, &[a, a]),
            Admit::Refuse(PendingRefusal::AddressFull)
        );
        // Under load (4 pending): a cookie first, even for an address at its cap.
        let load = [a, a, b, b];
        assert_eq!(admit(&CAPS, 4, false, &a, &load), Admit::SendCookie);
        assert_eq!(admit(&CAPS, 4, false, &c, &load), Admit::SendCookie);
        assert_eq!(
            admit(&CAPS, 4, true, &a, &load),
            Admit::Refuse(PendingRefusal::AddressFull)
        );
        assert_eq!(admit(&CAPS, 4, true, &c, &load), Admit::Slot);
        let full = [a, a, b, b, b, b, b, b];
        assert_eq!(
            admit(&CAPS, 4, true, &c, &full),
            Admit::Refuse(PendingRefusal::Full)
        );
        // 0: a cookie always.
        assert_eq!(admit(&CAPS, 0, false, &c, &[]), Admit::SendCookie);
        assert_eq!(admit(&CAPS, 0, true, &c, &[]), Admit::Slot);
    }
}
