//! Small synthetic wire captures, written byte by byte (not with the parsing crates, so the
//! reader is tested against independent bytes): MoldUDP64 packets, Ethernet/VLAN/IPv4/UDP and
//! IPv6 (with extension headers and fragments) frames, and pcap (classic and "modified") and
//! pcapng (either byte order, several interfaces and sections) files around them. For tests and demonstrations.

use crate::moldudp64::PacketBuilder;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Splits `messages` into MoldUDP64 packets of `session` of at most `max_len` bytes, the
/// first message numbered `first_sequence`. Returns each packet with its first sequence.
pub fn moldudp64_packets<M: AsRef<[u8]>>(
    session: [u8; 10],
    first_sequence: u64,
    messages: &[M],
    max_len: usize,
) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut b = PacketBuilder::new(max_len);
    let mut seq = first_sequence;
    b.start(session, seq);
    for m in messages {
        if b.push(m.as_ref()).is_err() {
            out.push((seq, b.bytes().to_vec()));
            seq += u64::from(b.count());
            b.start(session, seq);
            b.push(m.as_ref())
                .expect("one message fits an empty packet");
        }
    }
    if b.count() > 0 {
        out.push((seq, b.bytes().to_vec()));
    }
    out
}

/// How a UDP datagram is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Destination address (a multicast group).
    pub dst: Ipv4Addr,
    /// Destination port.
    pub dst_port: u16,
    /// VLAN IDs, outermost first (none: untagged; two: QinQ, outer tag 0x88a8).
    pub vlans: &'a [u16],
    /// Pad the Ethernet frame to at least this many bytes (60 on real wires) with `0xEE`.
    pub pad_to: usize,
}

impl Default for Frame<'_> {
    fn default() -> Self {
        Self {
            dst: Ipv4Addr::new(233, 54, 12, 111),
            dst_port: 26477,
            vlans: &[],
            pad_to: 60,
        }
    }
}

/// The 20-byte IPv4 header and 8-byte UDP header and `payload`, as a raw IP packet.
pub fn ipv4_udp(dst: Ipv4Addr, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut ip = vec![0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    ip[8] = 64; // TTL
    ip[9] = 17; // UDP
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&dst.octets());
    let mut sum = 0u32;
    for w in ip.chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    ip.extend_from_slice(&26400u16.to_be_bytes());
    ip.extend_from_slice(&dst_port.to_be_bytes());
    ip.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0]); // no checksum
    ip.extend_from_slice(payload);
    ip
}

/// An Ethernet II frame around `ip` (EtherType `ether_type` after the tags).
pub fn ethernet(vlans: &[u16], ether_type: u16, ip: &[u8], pad_to: usize) -> Vec<u8> {
    let mut f = vec![0x01, 0x00, 0x5e, 0x36, 0x0c, 0x6f, 0x02, 0, 0, 0, 0, 1];
    for (i, vid) in vlans.iter().enumerate() {
        let tpid: u16 = if i == 0 && vlans.len() > 1 {
            0x88a8
        } else {
            0x8100
        };
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    }
    f.extend_from_slice(&ether_type.to_be_bytes());
    f.extend_from_slice(ip);
    if f.len() < pad_to {
        f.resize(pad_to, 0xee);
    }
    f
}

/// An Ethernet frame carrying `payload` in UDP over IPv4, as `frame` says.
pub fn udp_frame(frame: &Frame<'_>, payload: &[u8]) -> Vec<u8> {
    ethernet(
        frame.vlans,
        0x0800,
        &ipv4_udp(frame.dst, frame.dst_port, payload),
        frame.pad_to,
    )
}

/// An ARP request frame: not IP at all.
pub fn arp_frame() -> Vec<u8> {
    let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 10, 0, 0, 1]);
    arp.extend_from_slice(&[0, 0, 0, 0, 0, 0, 10, 0, 0, 2]);
    ethernet(&[], 0x0806, &arp, 60)
}

/// A classic pcap file being written.
#[derive(Debug, Clone)]
pub struct PcapFile {
    bytes: Vec<u8>,
    nanos: bool,
    big_endian: bool,
    modified: bool,
}

impl PcapFile {
    /// A file of `link_type` (1: Ethernet), nanosecond or microsecond timestamps, in either
    /// byte order.
    pub fn new(link_type: u32, nanos: bool, big_endian: bool) -> Self {
        Self::with_magic(
            if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 },
            link_type,
            big_endian,
        )
    }

    /// A file in Alexey Kuznetsov's "modified" pcap format (microseconds; 24-byte record
    /// headers with interface index, protocol and packet type), as old Linux tcpdumps wrote.
    pub fn modified(link_type: u32, big_endian: bool) -> Self {
        Self::with_magic(0xa1b2_cd34, link_type, big_endian)
    }

    fn with_magic(magic: u32, link_type: u32, big_endian: bool) -> Self {
        let mut f = Self {
            bytes: Vec::new(),
            nanos: magic == 0xa1b2_3c4d,
            big_endian,
            modified: magic == 0xa1b2_cd34,
        };
        f.u32(magic);
        f.u16(2);
        f.u16(4);
        f.u32(0);
        f.u32(0);
        f.u32(65535);
        f.u32(link_type);
        f
    }

    fn u32(&mut self, v: u32) {
        let b = if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.bytes.extend_from_slice(&b);
    }

    fn u16(&mut self, v: u16) {
        let b = if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.bytes.extend_from_slice(&b);
    }

    /// A record of `frame` at `ts_ns` (ns since the epoch), keeping at most `snap` bytes.
    pub fn record(&mut self, ts_ns: u64, frame: &[u8], snap: Option<usize>) -> &mut Self {
        let cap = snap.unwrap_or(frame.len()).min(frame.len());
        self.u32((ts_ns / 1_000_000_000) as u32);
        let frac = ts_ns % 1_000_000_000;
        self.u32(if self.nanos { frac } else { frac / 1000 } as u32);
        self.u32(cap as u32);
        self.u32(frame.len() as u32);
        if self.modified {
            self.u32(2); // interface index
            self.u16(0x0800); // protocol
            self.bytes.extend_from_slice(&[2, 0]); // packet type (multicast), padding
        }
        self.bytes.extend_from_slice(&frame[..cap]);
        self
    }

    /// The file's bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// A pcapng file being written: sections in either byte order, interfaces with timestamp
/// options, enhanced packet blocks.
#[derive(Debug, Clone, Default)]
pub struct PcapNgFile {
    bytes: Vec<u8>,
    big_endian: bool,
}

impl PcapNgFile {
    /// A little-endian section header block and no interface yet.
    pub fn new() -> Self {
        let mut f = Self::default();
        f.section(false);
        f
    }

    /// A big-endian section (the byte-order magic 0x1A2B3C4D written big-endian), as
    /// captures taken on big-endian hosts are.
    pub fn new_big_endian() -> Self {
        let mut f = Self::default();
        f.section(true);
        f
    }

    /// Starts a new section in the given byte order; its interfaces are numbered from 0.
    pub fn section(&mut self, big_endian: bool) -> &mut Self {
        self.big_endian = big_endian;
        let mut body = Vec::new();
        body.extend_from_slice(&self.u32(0x1a2b_3c4d));
        body.extend_from_slice(&self.u16(1));
        body.extend_from_slice(&self.u16(0));
        body.extend_from_slice(&self.u64(u64::MAX)); // section length: unknown
        self.block(0x0a0d_0d0a, &body);
        self
    }

    fn u16(&self, v: u16) -> [u8; 2] {
        if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    fn u32(&self, v: u32) -> [u8; 4] {
        if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    fn u64(&self, v: u64) -> [u8; 8] {
        if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    fn block(&mut self, kind: u32, body: &[u8]) {
        let padded = body.len().div_ceil(4) * 4;
        let len = (12 + padded) as u32;
        let (kind, len) = (self.u32(kind), self.u32(len));
        self.bytes.extend_from_slice(&kind);
        self.bytes.extend_from_slice(&len);
        self.bytes.extend_from_slice(body);
        self.bytes.resize(self.bytes.len() + padded - body.len(), 0);
        self.bytes.extend_from_slice(&len);
    }

    /// An interface of `link_type`; with `nanos` its timestamps count nanoseconds (an
    /// `if_tsresol` option of 9), else microseconds (the default).
    pub fn interface(&mut self, link_type: u16, nanos: bool) -> &mut Self {
        self.interface_with(link_type, nanos.then_some(9), None)
    }

    /// An interface of `link_type` with an `if_tsresol` option (the raw byte: `n` for
    /// 10^-n s, `0x80 | n` for 2^-n s) and an `if_tsoffset` option (seconds added to every
    /// timestamp), each if given.
    pub fn interface_with(
        &mut self,
        link_type: u16,
        tsresol: Option<u8>,
        tsoffset: Option<i64>,
    ) -> &mut Self {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u16(link_type));
        body.extend_from_slice(&self.u16(0));
        body.extend_from_slice(&self.u32(0)); // snaplen: unlimited
                                              // An if_name first, as Wireshark writes.
        body.extend_from_slice(&self.u16(2));
        body.extend_from_slice(&self.u16(4));
        body.extend_from_slice(b"eth0");
        if let Some(r) = tsresol {
            body.extend_from_slice(&self.u16(9));
            body.extend_from_slice(&self.u16(1));
            body.extend_from_slice(&[r, 0, 0, 0]);
        }
        if let Some(o) = tsoffset {
            body.extend_from_slice(&self.u16(14));
            body.extend_from_slice(&self.u16(8));
            body.extend_from_slice(&self.u64(o as u64));
        }
        body.extend_from_slice(&[0, 0, 0, 0]); // opt_endofopt
        self.block(1, &body);
        self
    }

    /// An enhanced packet block of interface `interface`, at `ts` in the interface's units.
    pub fn packet(
        &mut self,
        interface: u32,
        ts: u64,
        frame: &[u8],
        snap: Option<usize>,
    ) -> &mut Self {
        let cap = snap.unwrap_or(frame.len()).min(frame.len());
        let mut body = Vec::new();
        body.extend_from_slice(&self.u32(interface));
        body.extend_from_slice(&self.u32((ts >> 32) as u32));
        body.extend_from_slice(&self.u32(ts as u32));
        body.extend_from_slice(&self.u32(cap as u32));
        body.extend_from_slice(&self.u32(frame.len() as u32));
        body.extend_from_slice(&frame[..cap]);
        self.block(6, &body);
        self
    }

    /// The file's bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// An IPv6 extension header that [`ipv6`] puts before the upper-layer data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Ext {
    /// Hop-by-hop options (a router alert), as multicast senders and MLD put first.
    HopByHop,
    /// Destination options (padding only).
    DestinationOptions,
    /// A fragment header: offset in bytes (a multiple of 8), more fragments, identification.
    Fragment {
        /// Offset of this fragment's data in the fragmentable part, bytes.
        offset: u16,
        /// More fragments follow.
        more: bool,
        /// Identification shared by the fragments of one packet.
        id: u32,
    },
}

impl Ipv6Ext {
    fn number(self) -> u8 {
        match self {
            Ipv6Ext::HopByHop => 0,
            Ipv6Ext::DestinationOptions => 60,
            Ipv6Ext::Fragment { .. } => 44,
        }
    }
}

/// Source address of the IPv6 packets written here.
pub const IPV6_SRC: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);

/// An IPv6 packet to `dst`: the 40-byte header, `exts` in order, then `data` of protocol
/// `next` (17: UDP).
pub fn ipv6(dst: Ipv6Addr, exts: &[Ipv6Ext], next: u8, data: &[u8]) -> Vec<u8> {
    let mut chain = Vec::new();
    for (i, ext) in exts.iter().enumerate() {
        let after = exts.get(i + 1).map_or(next, |e| e.number());
        match *ext {
            // Router alert (type 5, 2 bytes), then PadN to 8 bytes.
            Ipv6Ext::HopByHop => chain.extend_from_slice(&[after, 0, 5, 2, 0, 0, 1, 0]),
            Ipv6Ext::DestinationOptions => chain.extend_from_slice(&[after, 0, 1, 4, 0, 0, 0, 0]),
            Ipv6Ext::Fragment { offset, more, id } => {
                chain.extend_from_slice(&[after, 0]);
                chain.extend_from_slice(&((offset & !7) | u16::from(more)).to_be_bytes());
                chain.extend_from_slice(&id.to_be_bytes());
            }
        }
    }
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&((chain.len() + data.len()) as u16).to_be_bytes());
    ip.push(exts.first().map_or(next, |e| e.number()));
    ip.push(8); // hop limit
    ip.extend_from_slice(&IPV6_SRC.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&chain);
    ip.extend_from_slice(data);
    ip
}

/// A UDP datagram (header and `payload`) from port 26400 to `dst_port` of `dst`, with the
/// checksum IPv6 requires (over the pseudo-header from [`IPV6_SRC`]).
pub fn udp6(dst: Ipv6Addr, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let len = 8 + payload.len();
    let mut udp = Vec::with_capacity(len);
    udp.extend_from_slice(&26400u16.to_be_bytes());
    udp.extend_from_slice(&dst_port.to_be_bytes());
    udp.extend_from_slice(&(len as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let mut sum: u64 = 0;
    let mut add = |bytes: &[u8]| {
        for w in bytes.chunks(2) {
            sum += u64::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    };
    add(&IPV6_SRC.octets());
    add(&dst.octets());
    add(&(len as u32).to_be_bytes());
    add(&[0, 0, 0, 17]);
    add(&udp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let sum = match !(sum as u16) {
        0 => 0xffff,
        c => c,
    };
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    udp
}

/// An Ethernet frame carrying `payload` in UDP over IPv6 to `dst:dst_port`, after `exts`.
pub fn udp6_frame(dst: Ipv6Addr, dst_port: u16, exts: &[Ipv6Ext], payload: &[u8]) -> Vec<u8> {
    ethernet(
        &[],
        0x86dd,
        &ipv6(dst, exts, 17, &udp6(dst, dst_port, payload)),
        60,
    )
}
