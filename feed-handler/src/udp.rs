//! MoldUDP64 over plain UDP on the host network stack: a replayer (plays the exchange:
//! sends a capture, serves re-requests) and a receiver (joins the group, feeds the
//! [`Ingress`], sends re-requests).
//!
//! Owns sockets and pacing only; which senders are heard, sequencing and recovery
//! decisions are the [`Ingress`]'s. These
//! are tools and test drivers: the receiver polls two non-blocking sockets and naps briefly
//! when both are idle, which is fine for replay and tests; the production service busy-polls
//! in the lead's `run`.

use crate::badinput::RateLimitedLog;
use crate::binaryfile::StreamReader;
use crate::moldudp64::{
    build_retransmission, empty_packet, session, Deliver, GapConfig, GapTracker, Ingress,
    IngressConfig, Loss, Origin, PacketBuilder, Request, SourceAddr, Verdict, END_OF_SESSION,
    HEARTBEAT,
};
use nix::sys::socket::sockopt;
use rocebus::clock::Mono;
use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// How fast the replayer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// As fast as the socket takes it.
    Unpaced,
    /// At most this many messages per second.
    MessagesPerSecond(u64),
    /// Following the ITCH timestamps of the messages.
    Realtime,
}

/// Configuration of a [`Replayer`].
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    /// Where packets go (a multicast group or, in tests, a unicast address).
    pub group: SocketAddr,
    /// Where the retransmission server listens.
    pub retrans_bind: SocketAddr,
    /// MoldUDP64 session name.
    pub session: String,
    /// Send pacing.
    pub pacing: Pacing,
    /// Largest packet, bytes.
    pub max_packet: usize,
    /// How long to keep serving re-requests after the last one (the end-of-session packet
    /// is repeated meanwhile so receivers see tail loss).
    pub linger: Duration,
    /// Multicast TTL.
    pub multicast_ttl: u32,
    /// Loop multicast back to this host.
    pub multicast_loop: bool,
    /// Loss injection for tests and demos: drop every Nth data packet on first send
    /// (retransmissions are never dropped).
    pub drop_every: Option<u32>,
    /// [`Replayer::run_stream`] only: bytes of the most recent messages kept to answer
    /// re-requests (older ones go unanswered, counted in [`ReplayStats::unserved`]).
    pub history_bytes: usize,
}

impl ReplayConfig {
    /// Defaults for sending to `group`: unpaced, 1400-byte packets, retransmission on an
    /// ephemeral port of all interfaces, 500 ms linger, TTL 1, loopback on.
    pub fn new(group: SocketAddr) -> Self {
        Self {
            group,
            retrans_bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            session: "ROCEBUS001".into(),
            pacing: Pacing::Unpaced,
            max_packet: 1400,
            linger: Duration::from_millis(500),
            multicast_ttl: 1,
            multicast_loop: true,
            drop_every: None,
            history_bytes: 256 << 20,
        }
    }
}

/// Totals of one replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Data packets sent (first sends, including dropped ones).
    pub packets: u64,
    /// Data packets dropped by `drop_every`.
    pub dropped: u64,
    /// Re-requests received.
    pub requests: u64,
    /// Retransmission packets sent.
    pub retransmissions: u64,
    /// Requests that were malformed or for another session.
    pub bad_requests: u64,
    /// Messages sent (first sends, counting dropped ones).
    pub messages: u64,
    /// Requests for messages no longer in the history of [`Replayer::run_stream`].
    pub unserved: u64,
}

/// Where a replay's messages come from and its re-requests are answered from.
trait Source {
    /// The next message to send, without taking it; `None` at the end.
    fn peek(&mut self) -> io::Result<Option<&[u8]>>;
    /// The peeked message was sent (or skipped): the next one.
    fn advance(&mut self);
    /// The messages re-requests can be answered from, and the sequence of the first.
    fn history(&mut self) -> (u64, &[impl AsRef<[u8]>]);
}

/// The retransmission packet answering `req` from `source`'s history, if any of it can be
/// answered; a request for messages no longer held is counted in [`ReplayStats::unserved`].
fn answer_request<'b>(
    builder: &'b mut PacketBuilder,
    session: [u8; 10],
    source: &mut impl Source,
    req: &Request,
    stats: &mut ReplayStats,
) -> Option<&'b [u8]> {
    let (first, history) = source.history();
    if req.sequence_number < first {
        stats.unserved += 1;
        return None;
    }
    build_retransmission(builder, session, first, history, req)
}

/// A capture in memory: every message can be retransmitted.
struct Slice<'a, M> {
    messages: &'a [M],
    next: usize,
}

impl<M: AsRef<[u8]>> Source for Slice<'_, M> {
    fn peek(&mut self) -> io::Result<Option<&[u8]>> {
        Ok(self.messages.get(self.next).map(AsRef::as_ref))
    }

    fn advance(&mut self) {
        self.next += 1;
    }

    fn history(&mut self) -> (u64, &[impl AsRef<[u8]>]) {
        (1, self.messages)
    }
}

/// Messages read ahead from a stream, before they are sent.
const READ_AHEAD: usize = 1024;

/// A BinaryFILE stream: the most recent `limit` bytes of messages can be retransmitted.
struct Stream<R> {
    reader: StreamReader<R>,
    ahead: VecDeque<Vec<u8>>,
    /// Sent messages, the first of sequence `first`.
    history: VecDeque<Vec<u8>>,
    first: u64,
    bytes: usize,
    limit: usize,
}

impl<R: Read> Source for Stream<R> {
    fn peek(&mut self) -> io::Result<Option<&[u8]>> {
        while self.ahead.is_empty() {
            let ahead = &mut self.ahead;
            // Bad records are counted and logged by the reader, and not sent.
            let n = self.reader.read_records(READ_AHEAD, |r| {
                if let Ok(m) = r {
                    ahead.push_back(m.as_bytes().to_vec());
                }
            })?;
            if n == 0 {
                break;
            }
        }
        Ok(self.ahead.front().map(Vec::as_slice))
    }

    fn advance(&mut self) {
        let Some(m) = self.ahead.pop_front() else {
            return;
        };
        self.bytes += m.len();
        self.history.push_back(m);
        while self.bytes > self.limit {
            let Some(old) = self.history.pop_front() else {
                break;
            };
            self.bytes -= old.len();
            self.first += 1;
        }
    }

    fn history(&mut self) -> (u64, &[impl AsRef<[u8]>]) {
        (self.first, self.history.make_contiguous())
    }
}

/// Plays a capture as a MoldUDP64 exchange feed.
#[derive(Debug)]
pub struct Replayer {
    config: ReplayConfig,
    data: UdpSocket,
    retrans: UdpSocket,
    session: [u8; 10],
    stats: ReplayStats,
}

impl Replayer {
    /// Binds the sending and retransmission sockets.
    pub fn new(config: ReplayConfig) -> io::Result<Self> {
        let data = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))?;
        if config.group.ip().is_multicast() {
            data.set_multicast_ttl_v4(config.multicast_ttl)?;
            data.set_multicast_loop_v4(config.multicast_loop)?;
        }
        let retrans = UdpSocket::bind(config.retrans_bind)?;
        retrans.set_nonblocking(true)?;
        let session = session(&config.session);
        Ok(Self {
            config,
            data,
            retrans,
            session,
            stats: ReplayStats::default(),
        })
    }

    /// Address of the retransmission server.
    pub fn retrans_addr(&self) -> io::Result<SocketAddr> {
        self.retrans.local_addr()
    }

    /// Address the feed socket is bound to (all interfaces): its port is what a receiver's
    /// source list names, with the address of the interface it sends from.
    pub fn data_addr(&self) -> io::Result<SocketAddr> {
        self.data.local_addr()
    }

    /// Sends `messages` (sequence numbers from 1), the end of session, then serves
    /// re-requests until `linger` passes without one.
    pub fn run<M: AsRef<[u8]>>(&mut self, messages: &[M]) -> io::Result<ReplayStats> {
        self.play(&mut Slice { messages, next: 0 })
    }

    /// [`Replayer::run`] for the records of a BinaryFILE stream (e.g. a capture through
    /// [`crate::capture::open`]), read as they are sent: memory is a chunk of the stream and
    /// the last [`ReplayConfig::history_bytes`] of messages, kept for re-requests. Bad
    /// records are skipped (the reader counts them).
    pub fn run_stream<R: Read>(&mut self, reader: StreamReader<R>) -> io::Result<ReplayStats> {
        let limit = self.config.history_bytes;
        self.play(&mut Stream {
            reader,
            ahead: VecDeque::new(),
            history: VecDeque::new(),
            first: 1,
            bytes: 0,
            limit,
        })
    }

    fn play(&mut self, source: &mut impl Source) -> io::Result<ReplayStats> {
        let mut builder = PacketBuilder::new(self.config.max_packet);
        let mut answer = PacketBuilder::new(self.config.max_packet);
        let mut buf = [0u8; 64];
        let start = Instant::now();
        let realtime = self.config.pacing == Pacing::Realtime;
        let mut first_ts = None;
        // Sequence number of the next message.
        let mut next = 1u64;
        while source.peek()?.is_some() {
            builder.start(self.session, next);
            let mut last_ts = 0;
            while let Some(m) = source.peek()? {
                if builder.push(m).is_err() {
                    break;
                }
                if realtime {
                    last_ts = itch_ts(m);
                    first_ts.get_or_insert(last_ts);
                }
                source.advance();
                next += 1;
            }
            if builder.count() == 0 {
                // A message larger than a packet: skip it rather than loop forever.
                source.advance();
                next += 1;
                continue;
            }
            self.stats.messages += u64::from(builder.count());
            self.pace(start, next - 1, last_ts, first_ts.unwrap_or(0));
            self.stats.packets += 1;
            let drop = self
                .config
                .drop_every
                .is_some_and(|n| n > 0 && self.stats.packets % u64::from(n) == 0);
            if drop {
                self.stats.dropped += 1;
            } else {
                self.data.send_to(builder.bytes(), self.config.group)?;
            }
            self.serve(&mut answer, source, &mut buf)?;
        }
        let end = empty_packet(self.session, next, END_OF_SESSION);
        let mut last_activity = Instant::now();
        let mut last_eos = None::<Instant>;
        while last_activity.elapsed() < self.config.linger {
            if last_eos.is_none_or(|t| t.elapsed() >= Duration::from_millis(20)) {
                self.data.send_to(&end, self.config.group)?;
                last_eos = Some(Instant::now());
            }
            if self.serve(&mut answer, source, &mut buf)? {
                last_activity = Instant::now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(self.stats)
    }

    /// Answers pending re-requests; returns whether there were any.
    fn serve(
        &mut self,
        answer: &mut PacketBuilder,
        source: &mut impl Source,
        buf: &mut [u8; 64],
    ) -> io::Result<bool> {
        let mut any = false;
        loop {
            let (n, from) = match self.retrans.recv_from(buf) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(any),
                Err(e) => return Err(e),
            };
            any = true;
            let req = match Request::parse(&buf[..n]) {
                Ok(r) if r.session == self.session => r,
                _ => {
                    self.stats.bad_requests += 1;
                    continue;
                }
            };
            self.stats.requests += 1;
            if let Some(p) = answer_request(answer, self.session, source, &req, &mut self.stats) {
                self.retrans.send_to(p, from)?;
                self.stats.retransmissions += 1;
            }
        }
    }

    fn pace(&self, start: Instant, sent: u64, last_ts: u64, first_ts: u64) {
        let due = match self.config.pacing {
            Pacing::Unpaced => return,
            Pacing::MessagesPerSecond(0) => return,
            Pacing::MessagesPerSecond(r) => {
                Duration::from_nanos(sent.saturating_mul(1_000_000_000) / r)
            }
            Pacing::Realtime => Duration::from_nanos(last_ts.saturating_sub(first_ts)),
        };
        if let Some(wait) = (start + due).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
}

fn itch_ts(m: &[u8]) -> u64 {
    crate::itch::decode(m).map_or(0, |(m, _)| m.header().timestamp.nanos())
}

/// Configuration of a [`UdpReceiver`].
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// Address to receive on: a multicast group (joined on `interface`) or a unicast address.
    pub group: SocketAddr,
    /// Interface address for the multicast join.
    pub interface: Ipv4Addr,
    /// Senders heard on the feed socket (empty: everyone).
    pub sources: Vec<SourceAddr>,
    /// The exchange's retransmission server (`None`: gaps are given up after one timeout).
    pub retrans_server: Option<SocketAddr>,
    /// Sequencing and recovery.
    pub gap: GapConfig,
    /// Receive buffer asked for the data socket, bytes (0: the OS default). The kernel caps
    /// it at `net.core.rmem_max`: raise that too, or bursts the loop cannot take at once
    /// overflow the socket and must be re-requested.
    pub recv_buffer: usize,
}

/// Where [`UdpReceiver::poll_timed`] hands what the feed released, in order.
pub trait FeedSink {
    /// Called before what one datagram (or one timeout) releases, with its receive time in
    /// UNIX nanoseconds: the kernel's stamp (`SO_TIMESTAMPNS`), or the time `recvmsg`
    /// returned when the kernel gave none; for a timeout, the time it was handled. The
    /// default ignores it.
    fn ts_recv(&mut self, ts_recv: u64) {
        let _ = ts_recv;
    }
    /// A message, with the time its packet was received.
    fn message(&mut self, received: u64, sequence: u64, message: &[u8]);
    /// Messages given up as lost (before any message after them), with the time of the
    /// timeout that gave them up.
    fn loss(&mut self, received: u64, loss: Loss);
}

/// Closures take messages only; losses are still counted by the tracker.
impl<F: FnMut(u64, u64, &[u8])> FeedSink for F {
    fn message(&mut self, received: u64, sequence: u64, message: &[u8]) {
        self(received, sequence, message)
    }
    fn loss(&mut self, _received: u64, _loss: Loss) {}
}

/// Adapts a [`FeedSink`] to the tracker's [`Deliver`] for one timeout.
struct Timed<'a, S> {
    received: u64,
    sink: &'a mut S,
}

impl<S: FeedSink> Deliver for Timed<'_, S> {
    fn message(&mut self, sequence: u64, message: &[u8]) {
        self.sink.message(self.received, sequence, message);
    }
    fn loss(&mut self, loss: Loss) {
        self.sink.loss(self.received, loss);
    }
}

/// Receives a MoldUDP64 feed and recovers its gaps.
#[derive(Debug)]
pub struct UdpReceiver {
    data: UdpSocket,
    requests: UdpSocket,
    ingress: Ingress,
    buf: Vec<u8>,
    /// Room for the control messages of one `recvmsg` (the `SO_TIMESTAMPNS` stamp).
    cmsg: Vec<u8>,
    log: RateLimitedLog,
}

impl UdpReceiver {
    /// Binds (joining the group if it is multicast) and opens the re-request socket.
    pub fn new(config: &ReceiverConfig) -> io::Result<Self> {
        let data = match config.group {
            SocketAddr::V4(g) if g.ip().is_multicast() => {
                let s = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, g.port())))?;
                s.join_multicast_v4(g.ip(), &config.interface)?;
                s
            }
            g => UdpSocket::bind(g)?,
        };
        if config.recv_buffer > 0 {
            socket2::SockRef::from(&data).set_recv_buffer_size(config.recv_buffer)?;
        }
        data.set_nonblocking(true)?;
        let requests = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))?;
        requests.set_nonblocking(true)?;
        // Kernel receive stamps for `ts_recv`; a kernel that refuses them leaves the time
        // `recvmsg` returned instead.
        for s in [&data, &requests] {
            if let Err(e) = nix::sys::socket::setsockopt(s, sockopt::ReceiveTimestampns, &true) {
                tracing::warn!(%e, "SO_TIMESTAMPNS refused: ts_recv will be the read time");
            }
        }
        Ok(Self {
            data,
            requests,
            ingress: Ingress::new(IngressConfig {
                sources: config.sources.clone(),
                retrans_server: config.retrans_server,
                gap: config.gap,
            }),
            buf: vec![0u8; 65536],
            cmsg: nix::cmsg_space!(nix::sys::time::TimeSpec),
            log: RateLimitedLog::new(10),
        })
    }

    /// The bound data address (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.data.local_addr()
    }

    /// Changes where re-requests go (e.g. once a test's replayer has bound its port).
    pub fn set_retrans_server(&mut self, addr: SocketAddr) {
        self.ingress.set_retrans_server(addr);
    }

    /// Changes who is heard on the feed socket (e.g. once a test's replayer has bound).
    pub fn set_sources(&mut self, sources: Vec<SourceAddr>) {
        self.ingress.set_sources(sources);
    }

    /// The tracker (counters, completion).
    pub fn tracker(&self) -> &GapTracker {
        self.ingress.tracker()
    }

    /// The ingress decisions (source filter counters, tracker).
    pub fn ingress(&self) -> &Ingress {
        &self.ingress
    }

    /// Receives what is pending on both sockets, handles timeouts and sends re-requests.
    /// Returns whether any packet arrived. Losses are only counted (see [`Self::poll_timed`]).
    pub fn poll(&mut self, deliver: &mut impl FnMut(u64, &[u8])) -> io::Result<bool> {
        self.poll_timed(&mut || 0, &mut |_, seq, m: &[u8]| deliver(seq, m))
    }

    /// [`Self::poll`], reading `clock` once per received packet (right after `recv`
    /// returned) and handing that time to `sink.message(received, sequence_number, message)`
    /// with each message the packet released. Messages released from the gap buffer carry
    /// the time of the packet that closed the gap; a gap given up reaches `sink.loss` first.
    pub fn poll_timed(
        &mut self,
        clock: &mut impl FnMut() -> u64,
        sink: &mut impl FeedSink,
    ) -> io::Result<bool> {
        // The pass's one reading of the monotonic clock, for the ingress's timers.
        let now = Mono::now();
        let mut any = false;
        for origin in [Origin::Feed, Origin::Retransmission] {
            loop {
                let sock = match origin {
                    Origin::Feed => &self.data,
                    Origin::Retransmission => &self.requests,
                };
                let (n, from, stamp) = match recv_stamped(sock, &mut self.buf, &mut self.cmsg) {
                    Ok(r) => r,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                };
                let received = clock();
                sink.ts_recv(stamp.unwrap_or_else(unix_now_ns));
                any = true;
                // Rejected datagrams are counted by the ingress and logged here at a
                // bounded rate, naming the sender.
                let verdict =
                    self.ingress
                        .on_datagram(now, origin, from, &self.buf[..n], &mut |seq, m| {
                            sink.message(received, seq, m)
                        });
                if verdict.is_rejected() {
                    if let Some(suppressed) = self.log.allow(Instant::now()) {
                        log_rejected(verdict, origin, from, n, suppressed);
                    }
                }
            }
        }
        let received = if self.ingress.poll_timeout().is_some_and(|t| t <= now) {
            sink.ts_recv(unix_now_ns());
            clock()
        } else {
            0
        };
        self.ingress
            .handle_timeout(now, &mut Timed { received, sink });
        while let Some(req) = self.ingress.poll_request(now) {
            if let Some(server) = self.ingress.retrans_server() {
                self.requests.send_to(&req.encode(), server)?;
            }
        }
        Ok(any)
    }

    /// Polls until the session is complete or `deadline`; returns whether it completed.
    pub fn run_until_complete(
        &mut self,
        deadline: Instant,
        deliver: &mut impl FnMut(u64, &[u8]),
    ) -> io::Result<bool> {
        while !self.tracker().is_complete() {
            if Instant::now() >= deadline {
                return Ok(false);
            }
            if !self.poll(deliver)? {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        Ok(true)
    }
}

/// `CLOCK_REALTIME` now, UNIX nanoseconds (the clock of kernel receive stamps).
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Receives one datagram (non-blocking) with the kernel's `SO_TIMESTAMPNS` receive stamp,
/// UNIX nanoseconds, when the kernel attached one.
fn recv_stamped(
    sock: &UdpSocket,
    buf: &mut [u8],
    cmsg: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<u64>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrIn};
    use std::os::fd::AsRawFd;
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrIn>(
        sock.as_raw_fd(),
        &mut iov,
        Some(cmsg),
        MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    let mut stamp = None;
    for c in msg.cmsgs().into_iter().flatten() {
        if let ControlMessageOwned::ScmTimestampns(ts) = c {
            stamp = u64::try_from(ts.tv_sec())
                .ok()
                .zip(u64::try_from(ts.tv_nsec()).ok())
                .map(|(s, ns)| s * 1_000_000_000 + ns);
        }
    }
    let from = msg
        .address
        .map_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), |a| {
            SocketAddr::from((a.ip(), a.port()))
        });
    Ok((msg.bytes, from, stamp))
}

fn log_rejected(verdict: Verdict, origin: Origin, from: SocketAddr, len: usize, suppressed: u64) {
    use crate::moldudp64::Outcome;
    match verdict {
        Verdict::ForeignSource => tracing::warn!(
            %from, ?origin, len, suppressed, "dropping MoldUDP64 datagram from a sender not allowed (feed.sources)"
        ),
        Verdict::Malformed(error) => tracing::warn!(
            %from, len, %error, suppressed, "dropping malformed MoldUDP64 packet"
        ),
        Verdict::Packet(Outcome::FarAhead) => tracing::warn!(
            %from, len, suppressed, "dropping MoldUDP64 packet beyond the sequence window"
        ),
        _ => tracing::warn!(
            %from, len, suppressed, "dropping MoldUDP64 packet of another session"
        ),
    }
}

/// The heartbeat a replayer would send while idle (exposed for tools).
pub fn heartbeat(session_name: &str, next_sequence: u64) -> [u8; 20] {
    empty_packet(session(session_name), next_sequence, HEARTBEAT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binaryfile::push_record;
    use crate::moldudp64::Packet;

    /// A streamed replay keeps the last `limit` bytes of what it sent: requests within are
    /// answered as from the whole capture, older ones are counted and go unanswered.
    #[test]
    fn stream_history_is_bounded_and_answers_what_it_holds() {
        let mut messages: Vec<Vec<u8>> = Vec::new();
        crate::generate::generate(
            &crate::generate::GenConfig {
                seed: 2,
                messages: 100,
                symbols: 3,
            },
            |m| messages.push(m.to_vec()),
        );
        assert_eq!(messages.len(), 100);
        let mut file = Vec::new();
        for m in &messages {
            push_record(&mut file, m);
        }
        let mut s = Stream {
            reader: StreamReader::with_chunk(&file[..], 64),
            ahead: VecDeque::new(),
            history: VecDeque::new(),
            first: 1,
            bytes: 0,
            limit: 1000,
        };
        let mut sent = 0;
        while let Some(m) = s.peek().unwrap() {
            assert_eq!(m, &messages[sent][..]);
            s.advance();
            sent += 1;
        }
        assert_eq!(sent, messages.len());
        assert!(s.bytes <= 1000 && s.bytes + messages[s.first as usize - 2].len() > 1000);
        let session = session("ROCEBUS001");
        let mut stats = ReplayStats::default();
        let mut b = PacketBuilder::new(1400);
        let req = |sequence_number, count| Request {
            session,
            sequence_number,
            count,
        };
        // The last five messages: as from the whole list.
        let want = build_retransmission(
            &mut PacketBuilder::new(1400),
            session,
            1,
            &messages,
            &req(96, 5),
        )
        .unwrap()
        .to_vec();
        assert_eq!(
            answer_request(&mut b, session, &mut s, &req(96, 5), &mut stats).unwrap(),
            &want[..]
        );
        let p = Packet::parse(&want).unwrap();
        assert_eq!((p.sequence_number(), p.message_count()), (96, 5));
        // Evicted: not answered, counted.
        assert!(answer_request(&mut b, session, &mut s, &req(1, 5), &mut stats).is_none());
        assert_eq!(stats.unserved, 1);
        // Beyond what was sent: nothing.
        assert!(answer_request(&mut b, session, &mut s, &req(101, 1), &mut stats).is_none());
        assert_eq!(stats.unserved, 1);
    }
}
