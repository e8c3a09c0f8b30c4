//! Who may feed the handler: the I/O-free decisions about every datagram that reaches the
//! MoldUDP64 sockets, before and around sequencing.
//!
//! [`Ingress`] owns the source filter and the [`GapTracker`]; the UDP shell
//! ([`crate::udp::UdpReceiver`]) hands it each datagram with its sender and the socket it
//! came in on, and sends the requests it asks for. It never touches a socket.
//!
//! - **Feed socket**: with [`IngressConfig::sources`] set, only those senders (an IP, any
//!   port; or an exact `ip:port`) are heard; anything else is counted
//!   ([`Ingress::foreign_source`]) and dropped before it is parsed. An empty list hears
//!   everyone (the service warns at start).
//! - **Request socket** (answers to re-requests): only the retransmission server's IP is
//!   heard, whatever the list says.
//! - Session lock, sequence window and gap recovery are the tracker's (see
//!   [`super::gap`]); a gap it gives up is handed on as a [`Loss`].

use super::{Deliver, GapConfig, GapTracker, Outcome, PacketError, Request};
use rocebus::clock::Mono;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// An allowed sender: every port of an address, or one exact `ip:port`. In TOML, a string:
/// `"10.1.2.3"` or `"10.1.2.3:26477"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum SourceAddr {
    /// Any port of this address.
    Ip(IpAddr),
    /// Exactly this address and port.
    Exact(SocketAddr),
}

impl SourceAddr {
    /// Whether `from` is this sender.
    pub fn matches(&self, from: SocketAddr) -> bool {
        match *self {
            SourceAddr::Ip(ip) => from.ip() == ip,
            SourceAddr::Exact(a) => from == a,
        }
    }
}

/// A string that is neither an IP address nor an `ip:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IP address or ip:port")]
pub struct BadSource(String);

impl FromStr for SourceAddr {
    type Err = BadSource;

    fn from_str(s: &str) -> Result<Self, BadSource> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(SourceAddr::Ip(ip));
        }
        s.parse::<SocketAddr>()
            .map(SourceAddr::Exact)
            .map_err(|_| BadSource(s.to_owned()))
    }
}

impl TryFrom<String> for SourceAddr {
    type Error = BadSource;

    fn try_from(s: String) -> Result<Self, BadSource> {
        s.parse()
    }
}

impl fmt::Display for SourceAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceAddr::Ip(ip) => ip.fmt(f),
            SourceAddr::Exact(a) => a.fmt(f),
        }
    }
}

/// Which socket a datagram came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The feed (multicast group) socket.
    Feed,
    /// The socket re-requests are sent from, where their answers arrive.
    Retransmission,
}

/// Configuration of an [`Ingress`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngressConfig {
    /// Senders heard on the feed socket; empty hears everyone.
    pub sources: Vec<SourceAddr>,
    /// The exchange's retransmission server; `None` gives gaps up after one timeout.
    pub retrans_server: Option<SocketAddr>,
    /// Sequencing and recovery (`retransmission` is set from `retrans_server`).
    pub gap: GapConfig,
}

/// What became of one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// From a sender not allowed on that socket: dropped unparsed.
    ForeignSource,
    /// Handed to the tracker, with its outcome.
    Packet(Outcome),
    /// Handed to the tracker, which found it malformed (counted there).
    Malformed(PacketError),
}

impl Verdict {
    /// True for datagrams dropped as bad or hostile (worth a rate-limited log line):
    /// foreign sender, malformed, other session, beyond the sequence window.
    pub fn is_rejected(&self) -> bool {
        matches!(
            self,
            Verdict::ForeignSource
                | Verdict::Malformed(_)
                | Verdict::Packet(Outcome::WrongSession | Outcome::FarAhead)
        )
    }
}

/// The ingress decisions of one MoldUDP64 feed. See the module docs.
#[derive(Debug)]
pub struct Ingress {
    sources: Vec<SourceAddr>,
    retrans_server: Option<SocketAddr>,
    tracker: GapTracker,
    foreign_source: u64,
}

impl Ingress {
    /// An ingress that has heard nothing yet.
    pub fn new(config: IngressConfig) -> Self {
        let gap = GapConfig {
            retransmission: config.retrans_server.is_some(),
            ..config.gap
        };
        Self {
            sources: config.sources,
            retrans_server: config.retrans_server,
            tracker: GapTracker::new(gap),
            foreign_source: 0,
        }
    }

    /// Whether every sender is heard on the feed socket (no source list).
    pub fn hears_anyone(&self) -> bool {
        self.sources.is_empty()
    }

    /// Where re-requests go.
    pub fn retrans_server(&self) -> Option<SocketAddr> {
        self.retrans_server
    }

    /// Changes who is heard on the feed socket (e.g. once a test's sender has bound).
    pub fn set_sources(&mut self, sources: Vec<SourceAddr>) {
        self.sources = sources;
    }

    /// Changes where re-requests go and whose answers are heard.
    pub fn set_retrans_server(&mut self, addr: SocketAddr) {
        self.retrans_server = Some(addr);
        self.tracker.set_retransmission(true);
    }

    /// The tracker (counters, session, completion).
    pub fn tracker(&self) -> &GapTracker {
        &self.tracker
    }

    /// Datagrams dropped because their sender is not allowed on the socket they came in on.
    pub fn foreign_source(&self) -> u64 {
        self.foreign_source
    }

    fn allowed(&self, origin: Origin, from: SocketAddr) -> bool {
        match origin {
            Origin::Feed => self.sources.is_empty() || self.sources.iter().any(|s| s.matches(from)),
            // Servers answer from the address asked, not always from the same port.
            Origin::Retransmission => self.retrans_server.is_some_and(|r| r.ip() == from.ip()),
        }
    }

    /// One datagram from `from` on `origin`'s socket; new messages go to `deliver` in order.
    pub fn on_datagram(
        &mut self,
        now: Mono,
        origin: Origin,
        from: SocketAddr,
        bytes: &[u8],
        deliver: &mut impl FnMut(u64, &[u8]),
    ) -> Verdict {
        if !self.allowed(origin, from) {
            self.foreign_source += 1;
            return Verdict::ForeignSource;
        }
        match self.tracker.on_packet(now, bytes, deliver) {
            Ok(o) => Verdict::Packet(o),
            Err(e) => Verdict::Malformed(e),
        }
    }

    /// When [`Self::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Mono> {
        self.tracker.poll_timeout()
    }

    /// Retries, or gives a gap up: the [`super::Loss`] goes to `out` before the messages
    /// after it.
    pub fn handle_timeout(&mut self, now: Mono, out: &mut impl Deliver) {
        self.tracker.handle_timeout(now, out);
    }

    /// A re-request to send to [`Self::retrans_server`] now (never without a server).
    pub fn poll_request(&mut self, now: Mono) -> Option<Request> {
        self.tracker.poll_request(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moldudp64::{session, Loss, PacketBuilder};
    use std::time::Duration;

    /// Where the tests' clock starts (any reading: the tracker only compares readings).
    const T0: Mono = Mono::from_nanos(1 << 40);

    fn packet(name: &str, seq: u64, count: u16) -> Vec<u8> {
        let mut b = PacketBuilder::new(1400);
        b.start(session(name), seq);
        for s in seq..seq + u64::from(count) {
            b.push(&s.to_be_bytes()).expect("fits");
        }
        b.bytes().to_vec()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    const EXCHANGE: &str = "10.0.0.1:26477";
    const SERVER: &str = "10.0.0.9:26478";

    fn ingress(sources: &[&str], retrans_server: Option<&str>) -> Ingress {
        Ingress::new(IngressConfig {
            sources: sources.iter().map(|s| s.parse().expect("source")).collect(),
            retrans_server: retrans_server.map(addr),
            gap: GapConfig {
                retransmit_timeout: Duration::from_millis(10),
                max_retries: 1,
                ..GapConfig::default()
            },
        })
    }

    #[test]
    fn source_addresses_parse_as_ip_or_ip_port() {
        assert_eq!(
            "10.0.0.1".parse::<SourceAddr>(),
            Ok(SourceAddr::Ip("10.0.0.1".parse().unwrap()))
        );
        let exact: SourceAddr = "10.0.0.1:5".parse().unwrap();
        assert!(exact.matches(addr("10.0.0.1:5")) && !exact.matches(addr("10.0.0.1:6")));
        assert!("10.0.0.1"
            .parse::<SourceAddr>()
            .unwrap()
            .matches(addr("10.0.0.1:6")));
        assert_eq!(exact.to_string(), "10.0.0.1:5");
        assert_eq!(
            "exchange".parse::<SourceAddr>().unwrap_err().to_string(),
            "\"exchange\" is not an IP address or ip:port"
        );
    }

    #[test]
    fn spoofed_source_is_dropped_before_it_can_lock_the_session() {
        let t = T0;
        let mut i = ingress(&["10.0.0.1"], Some(SERVER));
        let mut got = Vec::new();
        // The forger speaks first, with a session of its own and a sequence far ahead.
        let v = i.on_datagram(
            t,
            Origin::Feed,
            addr("10.6.6.6:26477"),
            &packet("FORGED", 1 << 40, 1),
            &mut |s, _| got.push(s),
        );
        assert_eq!(v, Verdict::ForeignSource);
        assert!(v.is_rejected());
        assert_eq!(i.tracker().session(), None, "nothing locked");
        // The exchange, from another port of its address, is followed from sequence 1.
        let v = i.on_datagram(
            t,
            Origin::Feed,
            addr(EXCHANGE),
            &packet("REAL", 1, 2),
            &mut |s, _| got.push(s),
        );
        assert_eq!(v, Verdict::Packet(Outcome::Delivered));
        assert_eq!(got, [1, 2]);
        assert_eq!(i.tracker().session(), Some(session("REAL")));
        assert_eq!(i.foreign_source(), 1);
        assert_eq!(i.tracker().counters().malformed, 0, "dropped unparsed");
    }

    #[test]
    fn retransmissions_are_heard_only_from_the_server() {
        let t = T0;
        let mut i = ingress(&[EXCHANGE], Some(SERVER));
        let mut got = Vec::new();
        for (seq, count) in [(1, 1), (4, 1)] {
            i.on_datagram(
                t,
                Origin::Feed,
                addr(EXCHANGE),
                &packet("REAL", seq, count),
                &mut |s, _| got.push(s),
            );
        }
        let r = i.poll_request(t).expect("request");
        assert_eq!((r.sequence_number, r.count), (2, 2));
        // A forged answer on the request socket, even from the feed's own sender.
        for from in ["10.6.6.6:26478", EXCHANGE] {
            let v = i.on_datagram(
                t,
                Origin::Retransmission,
                addr(from),
                &packet("REAL", 2, 2),
                &mut |s, _| got.push(s),
            );
            assert_eq!(v, Verdict::ForeignSource, "{from}");
        }
        assert_eq!(got, [1]);
        // The server's answer, from another port of its address.
        let v = i.on_datagram(
            t,
            Origin::Retransmission,
            addr("10.0.0.9:40000"),
            &packet("REAL", 2, 2),
            &mut |s, _| got.push(s),
        );
        assert_eq!(v, Verdict::Packet(Outcome::Delivered));
        assert_eq!(got, [1, 2, 3, 4]);
    }

    #[test]
    fn without_a_source_list_anyone_is_heard() {
        let t = T0;
        let mut i = ingress(&[], None);
        assert!(i.hears_anyone());
        let v = i.on_datagram(
            t,
            Origin::Feed,
            addr("10.6.6.6:1"),
            &packet("ANY", 1, 1),
            &mut |_, _| {},
        );
        assert_eq!(v, Verdict::Packet(Outcome::Delivered));
        // No server: answers are heard from nobody, and nothing is requested.
        let v = i.on_datagram(
            t,
            Origin::Retransmission,
            addr("10.6.6.6:1"),
            &packet("ANY", 2, 1),
            &mut |_, _| {},
        );
        assert_eq!(v, Verdict::ForeignSource);
    }

    /// Records messages and losses in order.
    #[derive(Default)]
    struct Out(Vec<Result<u64, Loss>>);
    impl Deliver for Out {
        fn message(&mut self, sequence: u64, _: &[u8]) {
            self.0.push(Ok(sequence));
        }
        fn loss(&mut self, loss: Loss) {
            self.0.push(Err(loss));
        }
    }

    #[test]
    fn unanswered_gap_becomes_a_loss_before_later_messages() {
        let t0 = T0;
        let mut i = ingress(&[EXCHANGE], Some(SERVER));
        let mut out = Out::default();
        for (seq, count) in [(1, 1), (3, 2)] {
            i.on_datagram(
                t0,
                Origin::Feed,
                addr(EXCHANGE),
                &packet("REAL", seq, count),
                &mut |s, m| out.message(s, m),
            );
        }
        let mut t = t0;
        while let Some(due) = {
            let _ = i.poll_request(t);
            i.poll_timeout()
        } {
            t = due;
            i.handle_timeout(t, &mut out);
        }
        assert_eq!(
            out.0,
            [Ok(1), Err(Loss { from: 2, to: 3 }), Ok(3), Ok(4)],
            "retried once, then given up"
        );
        let c = *i.tracker().counters();
        assert_eq!((c.requests, c.lost, c.unrecoverable), (2, 1, 1));
    }
}
