//! Small synthetic wire captures, written byte by byte (not with the parsing crates, so the
//! reader is tested against independent bytes): MoldUDP64 packets, Ethernet/VLAN/IPv4/UDP
//! frames, and pcap and pcapng files around them. For tests and demonstrations.

use crate::moldudp64::PacketBuilder;
use std::net::Ipv4Addr;

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

/// A pcapng file being written (little-endian, one section).
#[derive(Debug, Clone, Default)]
pub struct PcapNgFile {
    bytes: Vec<u8>,
}

impl PcapNgFile {
    /// A section header block and no interface yet.
    pub fn new() -> Self {
        let mut f = Self::default();
        let mut body = Vec::new();
        body.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
        body.extend_from_slice(&1u16.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(&(-1i64).to_le_bytes());
        f.block(0x0a0d_0d0a, &body);
        f
    }

    fn block(&mut self, kind: u32, body: &[u8]) {
        let padded = body.len().div_ceil(4) * 4;
        let len = (12 + padded) as u32;
        self.bytes.extend_from_slice(&kind.to_le_bytes());
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(body);
        self.bytes.resize(self.bytes.len() + padded - body.len(), 0);
        self.bytes.extend_from_slice(&len.to_le_bytes());
    }

    /// An interface of `link_type`; with `nanos` its timestamps count nanoseconds (an
    /// `if_tsresol` option of 9), else microseconds (the default).
    pub fn interface(&mut self, link_type: u16, nanos: bool) -> &mut Self {
        let mut body = Vec::new();
        body.extend_from_slice(&link_type.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes()); // snaplen: unlimited
        if nanos {
            body.extend_from_slice(&9u16.to_le_bytes()); // if_tsresol
            body.extend_from_slice(&1u16.to_le_bytes());
            body.extend_from_slice(&[9, 0, 0, 0]);
            body.extend_from_slice(&[0, 0, 0, 0]); // opt_endofopt
        }
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
        body.extend_from_slice(&interface.to_le_bytes());
        body.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        body.extend_from_slice(&(ts as u32).to_le_bytes());
        body.extend_from_slice(&(cap as u32).to_le_bytes());
        body.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        body.extend_from_slice(&frame[..cap]);
        self.block(6, &body);
        self
    }

    /// The file's bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}
