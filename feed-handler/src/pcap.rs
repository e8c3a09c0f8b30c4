//! Packet captures of the wire (pcap, pcapng) as a BinaryFILE stream.
//!
//! [`WireReader`] reads a pcap or pcapng capture of MoldUDP64 over UDP and is itself an
//! [`io::Read`] yielding length-prefixed BinaryFILE records: the ITCH messages of one
//! MoldUDP64 session in sequence order, so everything that reads BinaryFILE reads a wire
//! capture the same way. Per record:
//!
//! - **Container**: [`pcap_parser`] reads the blocks (pcap with microsecond or nanosecond
//!   timestamps in either byte order, little-endian "modified" pcap, pcapng with any number
//!   of sections in either byte order and interfaces of any link types; an interface's
//!   `if_tsresol` and `if_tsoffset` are read here), streaming, with memory bounded by the
//!   largest record.
//! - **Link and network layers**: Ethernet II with up to three VLAN tags (802.1Q, QinQ),
//!   Linux cooked capture v1 and v2, raw IP, BSD loopback; IPv4 and IPv6 (extension headers
//!   such as hop-by-hop skipped), fragments of either reassembled in any order (copies
//!   dropped); the UDP payload is cut to the UDP length, so Ethernet padding after a short
//!   frame never reaches the MoldUDP64 parser. [`etherparse`] does the slicing.
//! - **Filter**: [`WireFilter`] keeps only datagrams to the given destination ports and/or
//!   addresses (an A and a B feed are two groups or ports of one session).
//! - **Sequencing**: each datagram goes through the feed handler's own
//!   [`GapTracker`], locked onto the first MoldUDP64 session
//!   whose data packet carries ITCH messages and started at the lowest sequence of that
//!   session seen in its first [`GAP_WAIT`] of capture time (packets reordered at the start,
//!   by the feeds or by fragments, lose nothing): A/B duplicates are delivered once, packets of
//!   other sessions are counted and dropped, and a range missing from both feeds is given
//!   up once the capture has moved [`GAP_WAIT`] past it (or at the end of the file) and
//!   reported in [`WireReport::losses`].
//!
//! Anything else (non-UDP frames, filtered datagrams, payloads that are not MoldUDP64,
//! records cut short by the capture's snap length, a file that ends inside a record) is
//! counted in the [`WireReport`], never a panic.

use crate::badinput::RateLimitedLog;
use crate::binaryfile::push_record;
use crate::itch;
use crate::moldudp64::{
    Deliver, GapConfig, GapTracker, Kind, Loss, Packet, PacketError, StartPolicy,
};
use etherparse::defrag::IpDefragPool;
use etherparse::{EtherType, Ipv6ExtensionSlice, NetSlice, SlicedPacket, TransportSlice, UdpSlice};
use pcap_parser::pcapng::Block;
use pcap_parser::traits::{PcapNGPacketBlock, PcapReaderIterator};
use pcap_parser::{
    LegacyPcapReader, Linktype, OptionCode, PcapBlockOwned, PcapError, PcapNGReader,
};
use rocebus::clock::Mono;
use rustc_hash::{FxHashMap, FxHasher};
use std::fmt;
use std::hash::Hasher;
use std::io::{self, Read};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long (in capture time) a sequence gap may stay open before its messages are reported
/// missing: the other feed's copy of a packet arrives within microseconds, reordering across
/// merged captures within milliseconds.
pub const GAP_WAIT: Duration = Duration::from_millis(100);

/// Capture time added per record on top of the timestamps, so that a capture whose
/// timestamps stand still (all zero, or going backwards) still gives gaps up.
const MIN_TICK: Duration = Duration::from_micros(1);

/// Initial size of the container reader's buffer; it doubles for larger records.
const READ_BUFFER: usize = 128 << 10;
/// Largest record accepted (bytes); larger means a corrupt file (an IP datagram is at most
/// 64 KiB, pcap snap lengths at most 256 KiB).
const MAX_RECORD: usize = 4 << 20;
/// BinaryFILE bytes produced before [`WireReader`] hands them out.
const OUT_BATCH: usize = 256 << 10;
/// Capture time after which an incomplete IP fragment train is dropped.
const FRAGMENT_TIMEOUT_NS: u64 = 10_000_000_000;

/// Which UDP datagrams of a capture are read. Empty lists match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireFilter {
    /// Destination ports to keep (any if empty).
    pub dst_ports: Vec<u16>,
    /// Destination addresses (e.g. the feed's multicast groups) to keep (any if empty).
    pub dst_addrs: Vec<IpAddr>,
}

impl WireFilter {
    /// Whether a datagram to `addr:port` is kept.
    pub fn matches(&self, addr: IpAddr, port: u16) -> bool {
        (self.dst_ports.is_empty() || self.dst_ports.contains(&port))
            && (self.dst_addrs.is_empty() || self.dst_addrs.contains(&addr))
    }
}

/// The container of a packet capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    /// Classic pcap (libpcap / tcpdump), either byte order, µs or ns timestamps.
    Pcap,
    /// pcapng.
    PcapNg,
}

/// What reading a wire capture found. Counts are of capture records (frames) unless said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireReport {
    /// Packet records read.
    pub records: u64,
    /// Records whose link type is not read (only Ethernet, Linux cooked v1/v2, raw IP and
    /// BSD loopback are).
    pub unsupported_link: u64,
    /// Frames that are not UDP (ARP, TCP, ICMP, ...).
    pub non_udp: u64,
    /// Frames whose headers do not parse (and are not explained by truncation).
    pub malformed_frames: u64,
    /// Records cut short by the capture's snap length before the end of the UDP payload.
    pub truncated_records: u64,
    /// IP fragments seen.
    pub ip_fragments: u64,
    /// UDP datagrams reassembled from fragments.
    pub reassembled: u64,
    /// Fragments that could not be reassembled (overlapping, inconsistent).
    pub bad_fragments: u64,
    /// Copies of fragments seen already (the same bytes at the same place of the same
    /// datagram), dropped.
    pub duplicate_fragments: u64,
    /// UDP datagrams (whole or reassembled).
    pub udp_datagrams: u64,
    /// Of those, not to the `--dst-port` / `--dst-addr` asked for.
    pub filtered_out: u64,
    /// Of the remaining, payloads that are not MoldUDP64 packets.
    pub not_moldudp64: u64,
    /// MoldUDP64 packets seen before the session was chosen that carried no ITCH (heartbeats).
    pub before_session: u64,
    /// MoldUDP64 packets of another session than the one read.
    pub foreign_session: u64,
    /// The session read (first MoldUDP64 data packet carrying ITCH messages).
    pub session: Option<[u8; 10]>,
    /// Sequence number of the first message read: the lowest of the session's first
    /// [`GAP_WAIT`] of capture time.
    pub first_sequence: Option<u64>,
    /// One past the last sequence number delivered.
    pub next_sequence: Option<u64>,
    /// MoldUDP64 packets of the session accepted (data, heartbeats, end of session).
    pub packets: u64,
    /// Of those, data packets that carried only messages delivered already (the other
    /// feed's copy, or a retransmission).
    pub duplicate_packets: u64,
    /// Heartbeats of the session.
    pub heartbeats: u64,
    /// Whether the end-of-session packet was seen.
    pub end_of_session: bool,
    /// ITCH messages delivered, once each.
    pub messages: u64,
    /// Packets dropped as starting implausibly far beyond the sequence (see
    /// [`GapTracker`]).
    pub far_ahead: u64,
    /// Sequence ranges missing from the capture (on every feed).
    pub losses: u64,
    /// Messages in those ranges.
    pub missing_messages: u64,
    /// First missing sequence number.
    pub first_missing: Option<u64>,
    /// Last missing sequence number.
    pub last_missing: Option<u64>,
    /// The file ended inside a record, or a record was corrupt: reading stopped there.
    pub stopped_early: Option<String>,
}

impl WireReport {
    /// Whether anything was skipped, lost or cut: worth telling the user.
    pub fn has_problems(&self) -> bool {
        self.unsupported_link
            + self.malformed_frames
            + self.truncated_records
            + self.bad_fragments
            + self.not_moldudp64
            + self.foreign_session
            + self.far_ahead
            + self.losses
            > 0
            || self.stopped_early.is_some()
            || self.ip_fragments > 0
    }
}

fn session_str(s: &[u8; 10]) -> String {
    String::from_utf8_lossy(s).trim_end().to_owned()
}

impl fmt::Display for WireReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} records, {} UDP datagrams",
            self.records, self.udp_datagrams
        )?;
        match (self.session, self.first_sequence, self.next_sequence) {
            (Some(s), Some(first), Some(next)) => write!(
                f,
                "; MoldUDP64 session {:?}: {} packets ({} duplicate, {} heartbeats{}), \
                 {} messages, sequences {first}..{}",
                session_str(&s),
                self.packets,
                self.duplicate_packets,
                self.heartbeats,
                if self.end_of_session {
                    ", end of session seen"
                } else {
                    ""
                },
                self.messages,
                next.saturating_sub(1)
            )?,
            _ => write!(f, "; no MoldUDP64 session with ITCH messages found")?,
        }
        if self.losses > 0 {
            write!(
                f,
                "; GAPS: {} ranges, {} messages missing (first {}, last {})",
                self.losses,
                self.missing_messages,
                self.first_missing.unwrap_or(0),
                self.last_missing.unwrap_or(0)
            )?;
        }
        for (n, what) in [
            (self.foreign_session, "packets of other sessions dropped"),
            (self.not_moldudp64, "UDP payloads not MoldUDP64"),
            (self.filtered_out, "UDP datagrams filtered out"),
            (self.non_udp, "non-UDP frames"),
            (
                self.truncated_records,
                "records truncated by the snap length",
            ),
            (self.malformed_frames, "malformed frames"),
            (self.unsupported_link, "records of unsupported link types"),
            (self.ip_fragments, "IP fragments"),
            (self.reassembled, "datagrams reassembled"),
            (self.bad_fragments, "bad IP fragments"),
            (self.duplicate_fragments, "duplicate IP fragments dropped"),
            (self.far_ahead, "packets far ahead of the sequence dropped"),
            (
                self.before_session,
                "MoldUDP64 packets before the session's first data",
            ),
        ] {
            if n > 0 {
                write!(f, ", {n} {what}")?;
            }
        }
        if let Some(why) = &self.stopped_early {
            write!(f, "; reading stopped early: {why}")?;
        }
        Ok(())
    }
}

/// A reader whose `read` fills the buffer unless the end is reached: `pcap_parser`'s readers
/// take their first `read` to hold the whole file header, which a decompressor need not give.
struct FillRead<R>(R);

impl<R: Read> Read for FillRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match self.0.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Hand out what was read; the error comes back on the next call.
                Err(_) if n > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
}

/// One pcapng interface: its link type and how its timestamps count.
#[derive(Debug, Clone, Copy)]
struct Interface {
    link: Linktype,
    /// Timestamp units per second.
    resolution: u64,
    /// Seconds added to every timestamp.
    offset: i64,
}

/// Units per second of a pcapng `if_tsresol` value: 10^n, or 2^n when the high bit is set;
/// `None` for one too fine to count in 64 bits.
fn ts_units(tsresol: u8) -> Option<u64> {
    let n = u32::from(tsresol & 0x7f);
    if tsresol & 0x80 == 0 {
        10u64.checked_pow(n)
    } else {
        1u64.checked_shl(n)
    }
}

impl Interface {
    /// The interface an IDB describes, in a section of the given byte order. Its timestamp
    /// options are read here: pcap_parser 0.17 takes a 2^-n `if_tsresol` for none (so for
    /// microseconds) and reads `if_tsoffset` little-endian in every section.
    fn new(idb: &pcap_parser::InterfaceDescriptionBlock<'_>, big_endian: bool) -> Self {
        let mut resolution = 1_000_000;
        let mut offset = 0;
        for opt in &idb.options {
            let value = opt.value.get(..usize::from(opt.len)).unwrap_or_default();
            match (opt.code, value) {
                (OptionCode::IfTsresol, [r]) => {
                    resolution = ts_units(*r).unwrap_or_else(|| {
                        tracing::warn!(
                            if_tsresol = r,
                            "pcapng interface timestamp resolution too fine, taken as µs"
                        );
                        1_000_000
                    })
                }
                (OptionCode::IfTsoffset, &[a, b, c, d, e, f, g, h]) => {
                    let bytes = [a, b, c, d, e, f, g, h];
                    offset = if big_endian {
                        i64::from_be_bytes(bytes)
                    } else {
                        i64::from_le_bytes(bytes)
                    };
                }
                _ => {}
            }
        }
        Self {
            link: idb.linktype,
            resolution,
            offset,
        }
    }
}

/// An IP datagram being fragmented: source, destination, identification.
type DatagramId = (IpAddr, IpAddr, u32);
/// One fragment of it: offset, more fragments, and a hash of its bytes.
type FragmentPlace = (u16, bool, u64);

/// Which datagram a fragment belongs to and which fragment it is.
fn fragment_of(packet: &SlicedPacket<'_>) -> Option<(DatagramId, FragmentPlace)> {
    let hash = |bytes: &[u8]| {
        let mut h = FxHasher::default();
        h.write(bytes);
        h.finish()
    };
    match &packet.net {
        Some(NetSlice::Ipv4(ip)) => {
            let h = ip.header();
            Some((
                (
                    IpAddr::V4(h.source_addr()),
                    IpAddr::V4(h.destination_addr()),
                    u32::from(h.identification()),
                ),
                (
                    h.fragments_offset().value(),
                    h.more_fragments(),
                    hash(ip.payload().payload),
                ),
            ))
        }
        Some(NetSlice::Ipv6(ip)) => {
            let frag = ip.extensions().clone().into_iter().find_map(|e| match e {
                Ipv6ExtensionSlice::Fragment(f) => Some(f),
                _ => None,
            })?;
            Some((
                (
                    IpAddr::V6(ip.header().source_addr()),
                    IpAddr::V6(ip.header().destination_addr()),
                    frag.identification(),
                ),
                (
                    frag.fragment_offset().value(),
                    frag.more_fragments(),
                    hash(ip.payload().payload),
                ),
            ))
        }
        _ => None,
    }
}

/// The per-datagram state: filter, defragmentation, sequencing and the output.
struct Extractor {
    filter: WireFilter,
    report: WireReport,
    tracker: Option<GapTracker>,
    /// Before the tracker: the session's first packets, held while the start is chosen.
    warmup: Option<Warmup>,
    /// Fragments being reassembled, by capture time and the generation of their datagram.
    defrag: IpDefragPool<u64, u32>,
    /// Fragments of the last [`FRAGMENT_TIMEOUT_NS`], to drop copies.
    fragments_seen: FxHashMap<(DatagramId, FragmentPlace), u64>,
    /// Datagrams whose reassembly failed: (generation, when), the generation starting a
    /// fresh buffer for their later fragments.
    fragment_generation: FxHashMap<DatagramId, (u32, u64)>,
    /// Capture time of the first record, ns.
    first_ts: Option<u64>,
    /// Virtual time of the last record, ns since `first_ts`.
    clock: u64,
    out: Vec<u8>,
    log: RateLimitedLog,
}

/// The first [`GAP_WAIT`] of a session's packets, held until its first sequence is known.
struct Warmup {
    session: [u8; 10],
    /// Lowest sequence of a data packet of the session with messages.
    first: u64,
    /// Virtual time at which the tracker starts.
    until: u64,
    /// (virtual time, MoldUDP64 packet) of every datagram that passed the filter.
    held: Vec<(u64, Vec<u8>)>,
    /// Bytes in `held`.
    bytes: usize,
}

/// Most bytes held during the warm-up; past that the tracker starts early.
const WARMUP_BYTES: usize = 64 << 20;

/// Collects what the tracker releases into the BinaryFILE output.
struct Sink<'a> {
    out: &'a mut Vec<u8>,
    report: &'a mut WireReport,
    log: &'a mut RateLimitedLog,
}

impl Deliver for Sink<'_> {
    fn message(&mut self, _sequence: u64, message: &[u8]) {
        push_record(self.out, message);
    }

    fn loss(&mut self, loss: Loss) {
        let r = &mut *self.report;
        r.losses += 1;
        r.missing_messages += loss.to - loss.from;
        r.first_missing.get_or_insert(loss.from);
        r.last_missing = Some(loss.to - 1);
        if let Some(suppressed) = self.log.allow(Instant::now()) {
            tracing::warn!(
                from = loss.from,
                to = loss.to - 1,
                suppressed,
                "MoldUDP64 sequences missing from the capture (on every feed)"
            );
        }
    }
}

/// Whether a MoldUDP64 packet looks like the real thing: a printable session name, and (for
/// a data packet) every message of a known ITCH type with its size.
fn carries_itch(p: &Packet<'_>) -> bool {
    p.kind() == Kind::Data
        && p.session()
            .iter()
            .all(|&c| c.is_ascii_graphic() || c == b' ')
        && p.messages()
            .all(|m| m.first().and_then(|&t| itch::message_size(t)) == Some(m.len()))
}

impl Extractor {
    fn new(filter: WireFilter) -> Self {
        Self {
            filter,
            report: WireReport::default(),
            tracker: None,
            warmup: None,
            defrag: IpDefragPool::new(),
            fragments_seen: FxHashMap::default(),
            fragment_generation: FxHashMap::default(),
            first_ts: None,
            clock: 0,
            out: Vec::with_capacity(OUT_BATCH + (64 << 10)),
            log: RateLimitedLog::new(10),
        }
    }

    /// Advances the virtual clock to a record stamped `ts` (ns since the epoch, if known).
    fn tick(&mut self, ts: Option<u64>) {
        let step = MIN_TICK.as_nanos() as u64;
        let at = match (ts, self.first_ts) {
            (Some(ts), Some(first)) => ts.saturating_sub(first),
            (Some(ts), None) => {
                self.first_ts = Some(ts);
                0
            }
            (None, _) => 0,
        };
        self.clock = at.max(self.clock.saturating_add(step));
    }

    /// One captured frame of link type `link`; `truncated` when the record holds less than
    /// the frame had on the wire.
    fn frame(&mut self, link: Linktype, data: &[u8], truncated: bool) {
        self.report.records += 1;
        if self.report.records % 4096 == 0 {
            let horizon = self.clock.saturating_sub(FRAGMENT_TIMEOUT_NS);
            self.defrag.retain(|&t| t >= horizon);
            self.fragments_seen.retain(|_, t| *t >= horizon);
            self.fragment_generation.retain(|_, g| g.1 >= horizon);
        }
        let sliced = match link {
            Linktype::ETHERNET => SlicedPacket::from_ethernet(data),
            Linktype::LINUX_SLL => SlicedPacket::from_linux_sll(data),
            Linktype::RAW | Linktype::IPV4 | Linktype::IPV6 => SlicedPacket::from_ip(data),
            Linktype(12) | Linktype(14) => SlicedPacket::from_ip(data), // DLT_RAW on BSDs
            Linktype::NULL | Linktype::LOOP => match data.get(4..) {
                Some(ip) => SlicedPacket::from_ip(ip),
                None => return self.bad_frame(truncated),
            },
            Linktype::LINUX_SLL2 => {
                // 20-byte header; its first field is the EtherType of the payload.
                match (data.get(..2), data.get(20..)) {
                    (Some(p), Some(rest)) => SlicedPacket::from_ether_type(
                        EtherType(u16::from_be_bytes([p[0], p[1]])),
                        rest,
                    ),
                    _ => return self.bad_frame(truncated),
                }
            }
            _ => {
                self.report.unsupported_link += 1;
                if let Some(suppressed) = self.log.allow(Instant::now()) {
                    tracing::warn!(
                        link_type = link.0,
                        suppressed,
                        "capture record of an unsupported link type skipped"
                    );
                }
                return;
            }
        };
        let packet = match sliced {
            Ok(p) => p,
            Err(etherparse::err::packet::SliceError::Len(_)) if truncated => {
                self.report.truncated_records += 1;
                return;
            }
            Err(_) => return self.bad_frame(false),
        };
        let (dst, fragmented) = match &packet.net {
            Some(NetSlice::Ipv4(ip)) => (
                IpAddr::V4(ip.header().destination_addr()),
                ip.is_payload_fragmented(),
            ),
            Some(NetSlice::Ipv6(ip)) => (
                IpAddr::V6(ip.header().destination_addr()),
                ip.is_payload_fragmented(),
            ),
            _ => {
                self.report.non_udp += 1;
                return;
            }
        };
        if fragmented {
            self.report.ip_fragments += 1;
            let Some((datagram, fragment)) = fragment_of(&packet) else {
                return self.bad_frame(false);
            };
            // A copy of a fragment seen already (both legs of a bond captured, a SPAN
            // duplicate): after its datagram was complete it would start a new one that the
            // next datagram with the same identification (it wraps) would be merged into.
            if self
                .fragments_seen
                .insert((datagram, fragment), self.clock)
                .is_some()
            {
                self.report.duplicate_fragments += 1;
                return;
            }
            let generation = self.fragment_generation.get(&datagram).map_or(0, |g| g.0);
            match self
                .defrag
                .process_sliced_packet(&packet, self.clock, generation)
            {
                Ok(Some(whole)) => {
                    if whole.ip_number == etherparse::IpNumber::UDP {
                        if let Ok(udp) = UdpSlice::from_slice(&whole.payload) {
                            self.report.reassembled += 1;
                            self.datagram(dst, udp.destination_port(), udp.payload());
                        } else {
                            self.report.bad_fragments += 1;
                        }
                    } else {
                        self.report.non_udp += 1;
                    }
                    self.defrag.return_buf(whole);
                }
                Ok(None) => {}
                Err(_) => {
                    // The datagram's buffer is inconsistent: its later fragments start a new
                    // one (the old one is dropped with the incomplete ones).
                    self.report.bad_fragments += 1;
                    let g = self.fragment_generation.entry(datagram).or_insert((0, 0));
                    *g = (g.0.wrapping_add(1), self.clock);
                }
            }
            return;
        }
        match &packet.transport {
            Some(TransportSlice::Udp(udp)) => {
                self.datagram(dst, udp.destination_port(), udp.payload())
            }
            _ => self.report.non_udp += 1,
        }
    }

    fn bad_frame(&mut self, truncated: bool) {
        if truncated {
            self.report.truncated_records += 1;
        } else {
            self.report.malformed_frames += 1;
        }
    }

    /// One UDP datagram's payload (already cut to the UDP length).
    fn datagram(&mut self, dst: IpAddr, port: u16, payload: &[u8]) {
        self.report.udp_datagrams += 1;
        if !self.filter.matches(dst, port) {
            self.report.filtered_out += 1;
            return;
        }
        let packet = match Packet::parse(payload) {
            Ok(p) => p,
            Err(e) => return self.not_mold(dst, port, e),
        };
        if self.tracker.is_some() {
            return self.track(self.clock, payload);
        }
        if let Some(w) = &mut self.warmup {
            // Packets reordered at the start of the capture (the other feed ahead, fragments
            // reassembled out of order): the session starts at the lowest sequence seen in
            // its first GAP_WAIT, not at whichever packet came first.
            if packet.session() == w.session && carries_itch(&packet) {
                w.first = w.first.min(packet.sequence_number());
            }
            w.bytes += payload.len();
            w.held.push((self.clock, payload.to_vec()));
            if self.clock >= w.until || w.bytes > WARMUP_BYTES {
                self.start_tracking();
            }
            return;
        }
        if carries_itch(&packet) {
            self.report.session = Some(packet.session());
            self.warmup = Some(Warmup {
                session: packet.session(),
                first: packet.sequence_number(),
                until: self.clock.saturating_add(GAP_WAIT.as_nanos() as u64),
                bytes: payload.len(),
                held: vec![(self.clock, payload.to_vec())],
            });
        } else {
            self.report.before_session += 1;
        }
    }

    /// Ends the warm-up: the tracker starts at the lowest sequence seen and is handed the
    /// packets held meanwhile, at their capture times.
    fn start_tracking(&mut self) {
        let Some(w) = self.warmup.take() else {
            return;
        };
        self.report.first_sequence = Some(w.first);
        self.tracker = Some(GapTracker::new(GapConfig {
            start: StartPolicy::Sequence(w.first),
            session: Some(w.session),
            retransmission: false,
            retransmit_timeout: GAP_WAIT,
            max_buffered_bytes: 256 << 20,
            // A capture is evidence, not a live feed to defend: a jump in it is taken at
            // once, so what follows it is not counted lost.
            claim_packets: 1,
            claim_timeout: std::time::Duration::ZERO,
            ..GapConfig::default()
        }));
        for (at, payload) in w.held {
            self.track(at, &payload);
        }
    }

    /// One MoldUDP64 packet (already parsed once) to the tracker, at virtual time `at`.
    fn track(&mut self, at: u64, payload: &[u8]) {
        let Some(tracker) = &mut self.tracker else {
            return;
        };
        if let Ok(packet) = Packet::parse(payload) {
            if packet.kind() == Kind::EndOfSession && Some(packet.session()) == self.report.session
            {
                self.report.end_of_session = true;
            }
        }
        let now = Mono::from_nanos(at);
        let out = &mut self.out;
        // Malformed packets were refused by `Packet::parse` before.
        let _ = tracker.on_packet(now, payload, &mut |_, m| push_record(out, m));
        tracker.poll_request(now);
        if tracker.poll_timeout().is_some_and(|t| t <= now) {
            let mut sink = Sink {
                out: &mut self.out,
                report: &mut self.report,
                log: &mut self.log,
            };
            tracker.handle_timeout(now, &mut sink);
        }
    }

    fn not_mold(&mut self, dst: IpAddr, port: u16, e: PacketError) {
        self.report.not_moldudp64 += 1;
        if let Some(suppressed) = self.log.allow(Instant::now()) {
            tracing::warn!(%dst, port, error = %e, suppressed, "UDP payload is not MoldUDP64, skipped");
        }
    }

    /// The end of the capture: whatever is still missing is missing.
    fn finish(&mut self) {
        self.start_tracking();
        let Some(tracker) = &mut self.tracker else {
            return;
        };
        // Each remaining gap is given up in turn, the clock moved past its wait.
        let mut now = Mono::from_nanos(self.clock);
        loop {
            tracker.poll_request(now);
            let Some(due) = tracker.poll_timeout() else {
                break;
            };
            now = now.max(due);
            let before = tracker.next_sequence();
            let mut sink = Sink {
                out: &mut self.out,
                report: &mut self.report,
                log: &mut self.log,
            };
            tracker.handle_timeout(now, &mut sink);
            if tracker.next_sequence() == before {
                break;
            }
        }
        let c = tracker.counters();
        let r = &mut self.report;
        r.packets = c.packets;
        r.duplicate_packets = c.duplicates;
        r.heartbeats = c.heartbeats;
        r.messages = c.messages;
        r.foreign_session = c.wrong_session;
        r.far_ahead = c.far_ahead;
        r.next_sequence = tracker.next_sequence();
    }
}

enum Container_<R: Read> {
    Pcap(LegacyPcapReader<FillRead<R>>),
    PcapNg(PcapNGReader<FillRead<R>>),
}

/// A pcap or pcapng capture of MoldUDP64 read as a BinaryFILE stream (see the module docs).
pub struct WireReader<R: Read> {
    container: Container_<R>,
    /// Link type of a pcap file; the interfaces of the current pcapng section.
    link: Linktype,
    nanos: bool,
    /// Byte order of the current pcapng section.
    big_endian: bool,
    interfaces: Vec<Interface>,
    x: Extractor,
    out_pos: usize,
    done: bool,
    /// Bytes of the capture consumed.
    consumed: u64,
    /// Size of the container reader's buffer.
    capacity: usize,
}

impl<R: Read> fmt::Debug for WireReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WireReader")
            .field("report", &self.x.report)
            .finish_non_exhaustive()
    }
}

fn container_error(e: PcapError<&[u8]>) -> io::Error {
    let msg = match e {
        PcapError::Eof | PcapError::UnexpectedEof | PcapError::Incomplete(_) => {
            "the file ends inside its header".to_owned()
        }
        PcapError::HeaderNotRecognized => "unrecognized header".to_owned(),
        PcapError::ReadError => "read error".to_owned(),
        e => format!("bad header: {e:?}"),
    };
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl<R: Read> WireReader<R> {
    /// Reads a capture of the given container from `input`, keeping the datagrams `filter`
    /// matches. Fails if the file header is not one of `container`.
    pub fn new(input: R, container: Container, filter: WireFilter) -> io::Result<Self> {
        let input = FillRead(input);
        let container = match container {
            Container::Pcap => Container_::Pcap(
                LegacyPcapReader::new(READ_BUFFER, input).map_err(container_error)?,
            ),
            Container::PcapNg => {
                Container_::PcapNg(PcapNGReader::new(READ_BUFFER, input).map_err(container_error)?)
            }
        };
        Ok(Self {
            container,
            link: Linktype::ETHERNET,
            nanos: false,
            big_endian: false,
            interfaces: Vec::new(),
            x: Extractor::new(filter),
            out_pos: 0,
            done: false,
            consumed: 0,
            capacity: READ_BUFFER,
        })
    }

    /// What was found so far; complete once `read` returned 0.
    pub fn report(&self) -> &WireReport {
        &self.x.report
    }

    /// Consumes the reader, giving its report.
    pub fn into_report(self) -> WireReport {
        self.x.report
    }

    /// Reads blocks until some output is ready or the capture ends.
    fn fill(&mut self) -> io::Result<()> {
        while !self.done && self.x.out.len() < OUT_BATCH {
            self.step()?;
        }
        Ok(())
    }

    /// One block, or a refill of the container's buffer.
    fn step(&mut self) -> io::Result<()> {
        let reader: &mut dyn PcapReaderIterator = match &mut self.container {
            Container_::Pcap(r) => r,
            Container_::PcapNg(r) => r,
        };
        let stop = match reader.next() {
            Ok((size, block)) => {
                match block {
                    PcapBlockOwned::LegacyHeader(h) => {
                        self.link = h.network;
                        self.nanos = h.is_nanosecond_precision();
                    }
                    PcapBlockOwned::Legacy(b) => {
                        let ts = u64::from(b.ts_sec) * 1_000_000_000
                            + u64::from(b.ts_usec) * if self.nanos { 1 } else { 1000 };
                        self.x.tick(Some(ts));
                        let truncated = b.caplen < b.origlen;
                        self.x.frame(self.link, b.data, truncated);
                    }
                    PcapBlockOwned::NG(Block::SectionHeader(shb)) => {
                        self.interfaces.clear();
                        self.big_endian = shb.big_endian();
                    }
                    PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
                        self.interfaces.push(Interface::new(&idb, self.big_endian))
                    }
                    PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => {
                        match self.interfaces.get(epb.if_id as usize).copied() {
                            Some(i) => {
                                let ticks = (u64::from(epb.ts_high) << 32) | u64::from(epb.ts_low);
                                let ns = u128::from(ticks) * 1_000_000_000
                                    / u128::from(i.resolution.max(1));
                                let ns = (ns as i128 + i128::from(i.offset) * 1_000_000_000)
                                    .clamp(0, i128::from(u64::MAX))
                                    as u64;
                                self.x.tick(Some(ns));
                                self.x
                                    .frame(i.link, epb.packet_data(), epb.caplen < epb.origlen);
                            }
                            None => {
                                self.x.report.records += 1;
                                self.x.report.malformed_frames += 1;
                            }
                        }
                    }
                    PcapBlockOwned::NG(Block::SimplePacket(spb)) => {
                        match self.interfaces.first().copied() {
                            Some(i) => {
                                self.x.tick(None);
                                let data = spb.packet_data();
                                self.x
                                    .frame(i.link, data, data.len() < spb.origlen as usize);
                            }
                            None => {
                                self.x.report.records += 1;
                                self.x.report.malformed_frames += 1;
                            }
                        }
                    }
                    PcapBlockOwned::NG(_) => {}
                }
                reader.consume(size);
                self.consumed += size as u64;
                None
            }
            Err(PcapError::Eof) => Some(None),
            Err(PcapError::Incomplete(_)) => {
                reader
                    .refill()
                    .map_err(|_| io::Error::other("cannot read the capture"))?;
                None
            }
            Err(PcapError::BufferTooSmall) => {
                let size = self.capacity * 2;
                if size > MAX_RECORD || !reader.grow(size) {
                    Some(Some(format!(
                        "record at byte {} is larger than {MAX_RECORD} bytes",
                        self.consumed
                    )))
                } else {
                    self.capacity = size;
                    reader
                        .refill()
                        .map_err(|_| io::Error::other("cannot read the capture"))?;
                    None
                }
            }
            Err(PcapError::UnexpectedEof) => Some(Some(format!(
                "the file ends inside the record at byte {}",
                self.consumed
            ))),
            Err(PcapError::ReadError) => {
                return Err(io::Error::other("cannot read the capture"));
            }
            Err(e) => Some(Some(format!(
                "corrupt record at byte {}: {e:?}",
                self.consumed
            ))),
        };
        if let Some(why) = stop {
            if let Some(why) = why {
                tracing::warn!("{why}: the rest of the capture is not read");
                self.x.report.stopped_early = Some(why);
            }
            self.x.finish();
            self.done = true;
        }
        Ok(())
    }
}

impl<R: Read> Read for WireReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.out_pos == self.x.out.len() {
            self.x.out.clear();
            self.out_pos = 0;
            self.fill()?;
        }
        let n = buf.len().min(self.x.out.len() - self.out_pos);
        buf[..n].copy_from_slice(&self.x.out[self.out_pos..self.out_pos + n]);
        self.out_pos += n;
        Ok(n)
    }
}

/// The session name of `report`, trimmed, for messages.
pub fn session_name(report: &WireReport) -> Option<String> {
    report.session.as_ref().map(session_str)
}

pub mod synth;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_wire;
