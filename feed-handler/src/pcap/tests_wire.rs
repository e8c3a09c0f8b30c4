//! Captures of wires we have no recording of, written byte by byte: IPv6 with extension
//! headers and fragments, big-endian pcapng with interfaces of several link types and
//! timestamp resolutions, captures cut short, and IPv4 fragments out of order.

use super::synth::{self, Frame, Ipv6Ext, PcapFile, PcapNgFile};
use super::*;
use crate::binaryfile::{push_record, Reader};
use crate::capture::{self, Format};
use crate::generate::{generate_binaryfile, GenConfig};
use crate::moldudp64::session;
use std::net::{Ipv4Addr, Ipv6Addr};

const T0: u64 = 1_700_000_000_000_000_000;
/// IPv6 groups of an A and a B feed (global and link-local scope).
const A6: Ipv6Addr = Ipv6Addr::new(0xff0e, 0, 0, 0, 0, 0, 2, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 3);
const A4: Ipv4Addr = Ipv4Addr::new(233, 54, 12, 111);

fn day(n: u64) -> Vec<Vec<u8>> {
    let (bf, _) = generate_binaryfile(&GenConfig {
        seed: 5,
        messages: n,
        symbols: 10,
    });
    Reader::new(&bf)
        .expect("binaryfile")
        .map(|m| m.expect("valid").as_bytes().to_vec())
        .collect()
}

/// The BinaryFILE of `msgs` less the (1-based) sequences in `missing`.
fn expected(msgs: &[Vec<u8>], missing: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let seq = i as u64 + 1;
        if !missing.iter().any(|&(a, b)| (a..=b).contains(&seq)) {
            push_record(&mut out, m);
        }
    }
    out
}

fn load_with(bytes: &[u8], filter: WireFilter) -> capture::Loaded {
    capture::load_bytes(bytes, &filter).expect("reads")
}

fn load(bytes: &[u8]) -> capture::Loaded {
    load_with(bytes, WireFilter::default())
}

/// Splits the payload of an IPv4 packet (20-byte header) into fragments of at most `size`
/// bytes (a multiple of 8), identification `id`, in offset order.
fn ipv4_fragments(ip: &[u8], id: u16, size: usize) -> Vec<Vec<u8>> {
    let payload = &ip[20..];
    let mut out = Vec::new();
    let mut off = 0;
    while off < payload.len() {
        let end = (off + size).min(payload.len());
        let more = end < payload.len();
        let mut h = ip[..20].to_vec();
        h[2..4].copy_from_slice(&((20 + end - off) as u16).to_be_bytes());
        h[4..6].copy_from_slice(&id.to_be_bytes());
        let flags = ((off / 8) as u16) | if more { 0x2000 } else { 0 };
        h[6..8].copy_from_slice(&flags.to_be_bytes());
        h[10..12].copy_from_slice(&[0, 0]);
        h.extend_from_slice(&payload[off..end]);
        out.push(h);
        off = end;
    }
    out
}

/// A day on an A and a B feed over IPv6 multicast, with hop-by-hop and destination options
/// headers on some packets and some A packets fragmented (fragments sent last first).
/// Packet 5 is missing from A, packet 20 from both.
struct Ipv6Day {
    /// pcap, Ethernet.
    pcap: Vec<u8>,
    msgs: Vec<Vec<u8>>,
    packets: Vec<(u64, Vec<u8>)>,
    /// The range missing from both feeds.
    gap: (u64, u64),
}

fn ipv6_day() -> Ipv6Day {
    let msgs = day(2000);
    let packets = synth::moldudp64_packets(session("V6SESSION1"), 1, &msgs, 400);
    assert!(packets.len() > 30);
    let mut f = PcapFile::new(1, true, false);
    let mut ts = T0;
    let mut rec = |f: &mut PcapFile, frame: &[u8]| {
        ts += 1_000;
        f.record(ts, frame, None);
    };
    // Another session over IPv4 on the same port: only a filter on the IPv6 groups or the
    // session lock keeps it out.
    let v4 = synth::moldudp64_packets(session("V4SESSION1"), 1, &msgs[..50], 400);
    for (i, (_, p)) in packets.iter().enumerate() {
        if i == 20 {
            continue;
        }
        let exts: &[Ipv6Ext] = match i % 3 {
            0 => &[Ipv6Ext::HopByHop],
            1 => &[Ipv6Ext::HopByHop, Ipv6Ext::DestinationOptions],
            _ => &[],
        };
        if i == 5 {
        } else if i % 4 == 3 {
            // Fragmented after a hop-by-hop header (which is not part of the fragmentable
            // part), three fragments, the last first.
            let udp = synth::udp6(A6, 26477, p);
            let cut = [0, 104, 208, udp.len()];
            let mut frags = Vec::new();
            for w in cut.windows(2) {
                let (from, to) = (w[0], w[1].min(udp.len()).max(w[0]));
                frags.push(synth::ipv6(
                    A6,
                    &[
                        Ipv6Ext::HopByHop,
                        Ipv6Ext::Fragment {
                            offset: from as u16,
                            more: to < udp.len(),
                            id: 0x1000 + i as u32,
                        },
                    ],
                    17,
                    &udp[from..to],
                ));
            }
            for ip in frags.iter().rev() {
                rec(&mut f, &synth::ethernet(&[], 0x86dd, ip, 60));
            }
        } else {
            rec(&mut f, &synth::udp6_frame(A6, 26477, exts, p));
        }
        rec(
            &mut f,
            &synth::udp6_frame(B6, 26478, &exts[..exts.len().min(1)], p),
        );
        if i < v4.len() && i > 0 {
            let frame = Frame {
                dst: A4,
                dst_port: 26477,
                ..Frame::default()
            };
            rec(&mut f, &synth::udp_frame(&frame, &v4[i].1));
        }
    }
    let gap = (packets[20].0, packets[21].0 - 1);
    Ipv6Day {
        pcap: f.into_bytes(),
        msgs,
        packets,
        gap,
    }
}

#[test]
fn ipv6_multicast_with_extension_headers_and_fragments() {
    let Ipv6Day {
        pcap,
        msgs,
        packets,
        gap,
    } = ipv6_day();
    let got = load(&pcap);
    let w = got.wire.as_ref().unwrap();
    assert_eq!(w.session, Some(session("V6SESSION1")), "{w}");
    assert_eq!(w.losses, 1, "{w}");
    assert_eq!(
        (w.first_missing, w.last_missing),
        (Some(gap.0), Some(gap.1))
    );
    assert!(w.reassembled > 5, "{w}");
    assert_eq!(
        w.bad_fragments + w.malformed_frames + w.truncated_records,
        0,
        "{w}"
    );
    assert!(got.data == expected(&msgs, &[gap]), "{w}");

    // Filters on IPv6 groups and ports.
    let only_a = load_with(
        &pcap,
        WireFilter {
            dst_ports: vec![],
            dst_addrs: vec![A6.into()],
        },
    );
    let w = only_a.wire.as_ref().unwrap();
    let gap5 = (packets[5].0, packets[6].0 - 1);
    assert_eq!(w.losses, 2, "A lacks packet 5 as well: {w}");
    assert_eq!(
        w.foreign_session, 0,
        "the IPv4 session is filtered out: {w}"
    );
    assert!(only_a.data == expected(&msgs, &[gap5, gap]), "{w}");
    let only_b = load_with(
        &pcap,
        WireFilter {
            dst_ports: vec![26478],
            dst_addrs: vec![B6.into(), A4.into()],
        },
    );
    let w = only_b.wire.as_ref().unwrap();
    assert_eq!(w.losses, 1, "{w}");
    // A's fragments are reassembled before the filter sees the datagram's port.
    // Only B's datagrams (all but packet 20) pass.
    assert_eq!(
        w.udp_datagrams - w.filtered_out,
        packets.len() as u64 - 1,
        "{w}"
    );
    assert!(only_b.data == expected(&msgs, &[gap]), "{w}");
    // An IPv6 address that is not in the capture, or the IPv4 group alone.
    let none = load_with(
        &pcap,
        WireFilter {
            dst_ports: vec![],
            dst_addrs: vec!["ff0e::2:2".parse().unwrap()],
        },
    );
    assert_eq!(none.wire.as_ref().unwrap().session, None);
    assert!(none.data.is_empty());
    let v4 = load_with(
        &pcap,
        WireFilter {
            dst_ports: vec![],
            dst_addrs: vec![A4.into()],
        },
    );
    assert_eq!(
        v4.wire.as_ref().unwrap().session,
        Some(session("V4SESSION1"))
    );
}

#[test]
fn ipv6_over_other_link_types() {
    let msgs = day(500);
    let packets = synth::moldudp64_packets(session("V6"), 1, &msgs, 1200);
    let ips: Vec<Vec<u8>> = packets
        .iter()
        .enumerate()
        .map(|(i, (_, p))| {
            let exts: &[Ipv6Ext] = if i % 2 == 0 {
                &[Ipv6Ext::HopByHop]
            } else {
                &[]
            };
            synth::ipv6(A6, exts, 17, &synth::udp6(A6, 26477, p))
        })
        .collect();
    let all = expected(&msgs, &[]);
    // Raw IP (101), LINKTYPE_IPV6 (229), Linux cooked (113), BSD loopback with the three
    // AF_INET6 values BSDs use (24, 28, 30).
    let mut raw = PcapFile::new(101, false, false);
    let mut raw6 = PcapFile::new(229, false, true);
    let mut sll = PcapFile::new(113, false, false);
    let mut null = PcapFile::new(0, false, false);
    for (i, ip) in ips.iter().enumerate() {
        let t = T0 + i as u64 * 1000;
        raw.record(t, ip, None);
        raw6.record(t, ip, None);
        let mut v1 = vec![0, 2, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x86, 0xdd];
        v1.extend_from_slice(ip);
        sll.record(t, &v1, None);
        let mut lo = ([24u32, 28, 30][i % 3]).to_le_bytes().to_vec();
        lo.extend_from_slice(ip);
        null.record(t, &lo, None);
    }
    for f in [raw, raw6, sll, null] {
        let got = load(&f.into_bytes());
        assert!(got.data == all, "{}", got.wire.unwrap());
    }
}

/// Ticks of an interface counting `per_sec` units a second, `offset` seconds added, for a
/// time of `ns` since the epoch.
fn ticks(ns: u64, per_sec: u64, offset: i64) -> u64 {
    let ns = i128::from(ns) - i128::from(offset) * 1_000_000_000;
    (ns * i128::from(per_sec) / 1_000_000_000) as u64
}

#[test]
fn pcapng_big_endian_with_interfaces_of_several_link_types_and_resolutions() {
    // An A feed and a B feed lagging 50 ms behind it, on interfaces of different link types
    // and timestamp units. Packet 10 is missing from A only: B's copy, 50 ms later, is in
    // time (GAP_WAIT is 100 ms). Packet 30 is missing from A and B's copy comes 300 ms
    // late: a loss. Reading the timestamps wrong (2^-n resolutions, an if_tsoffset in a
    // big-endian section) moves the clock and changes which is which.
    let msgs = day(4000);
    let packets = synth::moldudp64_packets(session("NGSESSION1"), 1, &msgs, 300);
    assert!(packets.len() > 60);
    const OFFSET: i64 = 1_699_999_000;
    /// (interface, link type, if_tsresol, if_tsoffset, units per second)
    type Iface = (u32, u16, Option<u8>, Option<i64>, u64);
    let ifaces: [Iface; 4] = [
        (0, 1, Some(9), None, 1_000_000_000),             // Ethernet, ns
        (1, 101, Some(0x80 | 30), Some(OFFSET), 1 << 30), // raw IP, 2^-30 s, offset
        (2, 276, None, None, 1_000_000),                  // Linux cooked v2, µs
        (3, 0, Some(0x80 | 20), Some(OFFSET), 1 << 20),   // BSD loopback, 2^-20 s
    ];
    let wrap = |link: u16, ip: &[u8]| -> Vec<u8> {
        match link {
            1 => synth::ethernet(&[], 0x0800, ip, 60),
            276 => {
                let mut v = vec![
                    0x08, 0x00, 0, 0, 0, 0, 0, 2, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0,
                ];
                v.extend_from_slice(ip);
                v
            }
            0 => {
                let mut v = 2u32.to_be_bytes().to_vec(); // AF_INET, in the writer's order
                v.extend_from_slice(ip);
                v
            }
            _ => ip.to_vec(),
        }
    };
    let mut records: Vec<(u64, usize, Vec<u8>)> = Vec::new();
    for (i, (_, p)) in packets.iter().enumerate() {
        let t = T0 + i as u64 * 1_000_000;
        let a = synth::ipv4_udp(A4, 26477, p);
        let b = synth::ipv4_udp(Ipv4Addr::new(233, 49, 196, 111), 26478, p);
        if i != 10 && i != 30 {
            records.push((t, i % 2 * 2, a));
        }
        let lag = if i == 30 { 300_000_000 } else { 50_000_000 };
        records.push((t + lag, 1 + i % 2 * 2, b));
    }
    records.sort_by_key(|r| r.0);
    let mut ng = PcapNgFile::new_big_endian();
    for &(_, link, resol, off, _) in &ifaces {
        ng.interface_with(link, resol, off);
    }
    let mid = records.len() / 2;
    for (t, iface, ip) in &records[..mid] {
        let (n, link, _, off, per_sec) = ifaces[*iface];
        ng.packet(
            n,
            ticks(*t, per_sec, off.unwrap_or(0)),
            &wrap(link, ip),
            None,
        );
    }
    // A second section, little-endian this time, with its interfaces in another order.
    ng.section(false);
    for &(_, link, resol, off, _) in ifaces.iter().rev() {
        ng.interface_with(link, resol, off);
    }
    for (t, iface, ip) in &records[mid..] {
        let (n, link, _, off, per_sec) = ifaces[*iface];
        ng.packet(
            3 - n,
            ticks(*t, per_sec, off.unwrap_or(0)),
            &wrap(link, ip),
            None,
        );
    }
    let got = load(&ng.into_bytes());
    assert_eq!(got.kind.format, Format::Wire(Container::PcapNg));
    let w = got.wire.as_ref().unwrap();
    assert_eq!(w.unsupported_link + w.malformed_frames, 0, "{w}");
    let gap30 = (packets[30].0, packets[31].0 - 1);
    assert_eq!(w.losses, 1, "{w}");
    assert_eq!(
        (w.first_missing, w.last_missing),
        (Some(gap30.0), Some(gap30.1)),
        "{w}"
    );
    assert!(got.data == expected(&msgs, &[gap30]), "{w}");
}

#[test]
fn cut_captures_are_read_up_to_the_cut_and_reported() {
    let msgs = day(600);
    let packets = synth::moldudp64_packets(session("CUT"), 1, &msgs, 400);
    let frames: Vec<Vec<u8>> = packets
        .iter()
        .map(|(_, p)| synth::udp6_frame(A6, 26477, &[Ipv6Ext::HopByHop], p))
        .collect();
    let last = packets.last().unwrap().0;
    let but_last = expected(&msgs, &[(last, msgs.len() as u64)]);
    let mut pcap = PcapFile::new(1, false, true);
    let mut ng = PcapNgFile::new_big_endian();
    ng.interface(1, false);
    for (i, f) in frames.iter().enumerate() {
        pcap.record(T0 + i as u64 * 1000, f, None);
        ng.packet(0, T0 / 1000 + i as u64, f, None);
    }
    let (pcap, ng) = (pcap.into_bytes(), ng.into_bytes());
    let last_len = frames.last().unwrap().len();
    for (name, file, header) in [("pcap", &pcap, 16), ("pcapng", &ng, 28)] {
        // Cut inside the last packet's data, inside its record header, one byte short.
        for cut in [last_len / 2, last_len + header - 4, 1] {
            let got = load(&file[..file.len() - cut - if name == "pcapng" { 4 } else { 0 }]);
            let w = got.wire.as_ref().unwrap();
            assert_eq!(w.records, frames.len() as u64 - 1, "{name} cut {cut}: {w}");
            let why = w.stopped_early.as_deref().unwrap_or_default();
            assert!(why.contains("ends inside"), "{name} cut {cut}: {w}");
            assert!(w.to_string().contains("reading stopped early"), "{w}");
            assert!(got.data == but_last, "{name} cut {cut}: {w}");
        }
    }

    // Snap lengths: cut in the UDP payload or in the extension headers (counted), or only
    // in the Ethernet padding after a whole datagram (read).
    let mut f = PcapNgFile::new();
    f.interface(1, false);
    let short = synth::udp6_frame(
        A6,
        26477,
        &[],
        &crate::moldudp64::empty_packet(session("CUT"), 1, 0),
    );
    let mut padded = short.clone();
    padded.extend_from_slice(&[0xee; 20]);
    for (i, f_) in frames.iter().enumerate() {
        let snap = match i {
            3 => Some(f_.len() - 10),
            4 => Some(14 + 40 + 4),
            _ => None,
        };
        f.packet(0, i as u64, f_, snap);
    }
    f.packet(0, 99, &padded, Some(short.len()));
    let got = load(&f.into_bytes());
    let w = got.wire.as_ref().unwrap();
    assert_eq!(w.truncated_records, 2, "{w}");
    assert_eq!(w.heartbeats, 1, "{w}");
    assert_eq!(w.malformed_frames, 0, "{w}");
    assert!(
        w.to_string()
            .contains("2 records truncated by the snap length"),
        "{w}"
    );
    let lost = |i: usize| (packets[i].0, packets[i + 1].0 - 1);
    assert!(got.data == expected(&msgs, &[lost(3), lost(4)]), "{w}");
}

#[test]
fn ipv4_fragments_out_of_order_interleaved_and_duplicated() {
    let msgs = day(3000);
    let packets = synth::moldudp64_packets(session("FRAG"), 1, &msgs, 1400);
    assert!(packets.len() > 20);
    // Each datagram of both feeds in fragments of 200 bytes; per pair of datagrams the
    // fragments are interleaved and reversed, and one is sent twice.
    let mut records: Vec<Vec<u8>> = Vec::new();
    for pair in packets.chunks(2).enumerate() {
        let (k, pair) = pair;
        for (feed, dst) in [(0u16, A4), (1, Ipv4Addr::new(233, 49, 196, 111))] {
            let mut frags: Vec<Vec<u8>> = Vec::new();
            let lists: Vec<Vec<Vec<u8>>> = pair
                .iter()
                .enumerate()
                .map(|(j, (_, p))| {
                    let id = (k * 4 + j * 2) as u16 + feed;
                    ipv4_fragments(&synth::ipv4_udp(dst, 26477, p), id, 200)
                })
                .collect();
            let longest = lists.iter().map(Vec::len).max().unwrap();
            for n in 0..longest {
                for l in &lists {
                    if let Some(f) = l.get(n) {
                        frags.push(f.clone());
                    }
                }
            }
            frags.reverse();
            frags.insert(2, frags[0].clone());
            records.extend(
                frags
                    .into_iter()
                    .map(|ip| synth::ethernet(&[9], 0x0800, &ip, 60)),
            );
        }
    }
    let mut f = PcapFile::new(1, false, false);
    for (i, r) in records.iter().enumerate() {
        f.record(T0 + i as u64 * 10_000, r, None);
    }
    let got = load(&f.into_bytes());
    let w = got.wire.as_ref().unwrap();
    assert_eq!(w.reassembled, 2 * packets.len() as u64, "{w}");
    // The first datagram completed is the second packet: the session still starts at 1.
    assert_eq!(w.first_sequence, Some(1), "{w}");
    assert_eq!(w.losses + w.bad_fragments + w.malformed_frames, 0, "{w}");
    assert_eq!(w.duplicate_packets, packets.len() as u64, "{w}");
    assert!(got.data == expected(&msgs, &[]), "{w}");
}

#[test]
fn a_stray_fragment_does_not_spoil_a_later_datagram_with_its_id() {
    // Datagrams whose IP identification repeats (it wraps every 65,536 datagrams), and a
    // stray copy of a fragment after its datagram was complete (a capture of both legs of a
    // bond, a SPAN duplicate): the next datagram with that id is still reassembled.
    let msgs = day(3000);
    let packets = synth::moldudp64_packets(session("STRAY"), 1, &msgs, 1400);
    assert!(packets.len() > 6);
    let mut f = PcapFile::new(1, false, false);
    let mut t = T0;
    for (i, (_, p)) in packets.iter().enumerate() {
        // Sizes differ from packet to packet: a stale fragment's end never fits.
        let frags = ipv4_fragments(&synth::ipv4_udp(A4, 26477, p), 7, 200 + 8 * (i % 5));
        for fr in &frags {
            t += 1_000_000;
            f.record(t, &synth::ethernet(&[], 0x0800, fr, 60), None);
        }
        // The first and the last fragment again, after the datagram was complete.
        for fr in [&frags[0], &frags[frags.len() - 1]] {
            t += 1_000_000;
            f.record(t, &synth::ethernet(&[], 0x0800, fr, 60), None);
        }
        if i == 2 {
            // A last fragment of some other datagram with that id, ending past the next one:
            // the next one cannot be reassembled, but the one after it must be.
            let mut other = synth::ipv4_udp(A4, 26477, &[0x55; 3000]);
            other[4..6].copy_from_slice(&7u16.to_be_bytes());
            let last = ipv4_fragments(&other, 7, 1496).pop().unwrap();
            t += 1_000_000;
            f.record(t, &synth::ethernet(&[], 0x0800, &last, 60), None);
        }
    }
    let got = load(&f.into_bytes());
    let w = got.wire.as_ref().unwrap();
    assert_eq!(w.duplicate_fragments, 2 * packets.len() as u64, "{w}");
    assert_eq!(w.bad_fragments, 1, "{w}");
    assert_eq!(w.losses, 1, "{w}");
    let lost = (packets[3].0, packets[4].0 - 1);
    assert_eq!(
        (w.first_missing, w.last_missing),
        (Some(lost.0), Some(lost.1)),
        "{w}"
    );
    assert!(got.data == expected(&msgs, &[lost]), "{w}");
    assert!(
        w.to_string().contains("duplicate IP fragments dropped"),
        "{w}"
    );
}
