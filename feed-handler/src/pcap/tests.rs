use super::synth::{self, Frame, PcapFile, PcapNgFile};
use super::*;
use crate::binaryfile::{push_record, Reader};
use crate::capture::{self, Format, Kind};
use crate::generate::{generate_binaryfile, GenConfig};
use crate::moldudp64::session;
use std::io::Write as _;
use std::net::Ipv4Addr;

const A: Ipv4Addr = Ipv4Addr::new(233, 54, 12, 111);
const B: Ipv4Addr = Ipv4Addr::new(233, 49, 196, 111);
const T0: u64 = 1_700_000_000_000_000_000;

fn day() -> Vec<Vec<u8>> {
    let (bf, _) = generate_binaryfile(&GenConfig {
        seed: 7,
        messages: 3000,
        symbols: 20,
    });
    Reader::new(&bf)
        .expect("binaryfile")
        .map(|m| m.expect("valid").as_bytes().to_vec())
        .collect()
}

fn binaryfile_of<'a>(msgs: impl IntoIterator<Item = &'a Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        push_record(&mut out, m);
    }
    out
}

fn load(bytes: &[u8]) -> crate::capture::Loaded {
    capture::load_bytes(bytes, &WireFilter::default()).expect("reads")
}

/// Frames of a two-feed day with every oddity the reader must survive, and what it must
/// give: the BinaryFILE of the messages that are on the wire at least once.
struct Scenario {
    /// (timestamp ns, frame, snap length)
    frames: Vec<(u64, Vec<u8>, Option<usize>)>,
    expected: Vec<u8>,
    /// The sequences missing on both feeds.
    gap: (u64, u64),
}

fn scenario() -> Scenario {
    let msgs = day();
    let packets = synth::moldudp64_packets(session("20240102A1"), 1, &msgs, 300);
    assert!(packets.len() > 40);
    let lost_both = 20; // on neither feed: a gap
    let lost_a = 10; // only B has it
    let cut_a = 12; // A's copy truncated by the snap length, B's whole
    let mut frames = Vec::new();
    let mut ts = T0;
    let mut push = |frames: &mut Vec<_>, f: Vec<u8>, snap| {
        ts += 1_500;
        frames.push((ts, f, snap));
    };
    push(&mut frames, synth::arp_frame(), None);
    // A heartbeat before the session's first data packet: the session is chosen by data.
    let hb = crate::moldudp64::empty_packet(session("20240102A1"), 1, 0);
    push(&mut frames, synth::udp_frame(&Frame::default(), &hb), None);
    let foreign = synth::moldudp64_packets(session("OTHER00001"), 1, &msgs[..5], 300);
    // A DNS-ish datagram: a short UDP payload padded to the Ethernet minimum.
    let dns = synth::udp_frame(
        &Frame {
            dst_port: 53,
            ..Frame::default()
        },
        b"\x12\x34\x01\x00\x00",
    );
    assert_eq!(dns.len(), 60, "padded");
    push(&mut frames, dns, None);
    for (i, (_, p)) in packets.iter().enumerate() {
        let a = Frame {
            dst: A,
            dst_port: 26477,
            vlans: if i % 3 == 0 { &[100] } else { &[] },
            // Some frames carry bytes after the IP packet (an FCS, a switch trailer).
            pad_to: if i % 5 == 0 { p.len() + 60 } else { 60 },
        };
        let b = Frame {
            dst: B,
            dst_port: 26478,
            vlans: if i % 4 == 0 { &[200, 300] } else { &[] },
            pad_to: 60,
        };
        if i == lost_both {
            continue;
        }
        let fa = synth::udp_frame(&a, p);
        let fb = synth::udp_frame(&b, p);
        if i == cut_a {
            push(&mut frames, fa, Some(80));
        } else if i != lost_a {
            push(&mut frames, fa, None);
        }
        push(&mut frames, fb, None);
        if i == 2 {
            // Someone else's session on the same group, once ours is going.
            push(&mut frames, synth::udp_frame(&a, &foreign[0].1), None);
        }
        if i == 30 {
            let hb = crate::moldudp64::empty_packet(session("20240102A1"), packets[31].0, 0);
            push(&mut frames, synth::udp_frame(&a, &hb), None);
            push(
                &mut frames,
                synth::udp_frame(&Frame::default(), &foreign[0].1),
                None,
            );
        }
    }
    let gap_from = packets[lost_both].0;
    let gap_to = packets[lost_both + 1].0 - 1;
    let expected = binaryfile_of(
        msgs.iter()
            .enumerate()
            .filter(|(i, _)| !(gap_from..=gap_to).contains(&(*i as u64 + 1)))
            .map(|(_, m)| m),
    );
    Scenario {
        frames,
        expected,
        gap: (gap_from, gap_to),
    }
}

fn pcap_of(s: &Scenario, nanos: bool, big_endian: bool) -> Vec<u8> {
    let mut f = PcapFile::new(1, nanos, big_endian);
    for (ts, frame, snap) in &s.frames {
        f.record(*ts, frame, *snap);
    }
    f.into_bytes()
}

fn check_report(w: &WireReport, s: &Scenario) {
    assert_eq!(w.session, Some(session("20240102A1")));
    assert_eq!(w.first_sequence, Some(1));
    assert_eq!(w.losses, 1, "{w}");
    assert_eq!(w.first_missing, Some(s.gap.0));
    assert_eq!(w.last_missing, Some(s.gap.1));
    assert_eq!(w.missing_messages, s.gap.1 - s.gap.0 + 1);
    assert_eq!(w.non_udp, 1);
    assert_eq!(w.not_moldudp64, 1, "{w}");
    assert_eq!(w.truncated_records, 1);
    assert_eq!(w.foreign_session, 2, "{w}");
    assert_eq!(w.before_session, 1, "{w}");
    assert!(w.duplicate_packets > 30, "{w}");
    assert_eq!(w.heartbeats, 1);
    assert_eq!(w.stopped_early, None);
    assert!(w.has_problems());
}

#[test]
fn pcap_in_every_flavour_gives_the_binaryfile_of_what_is_on_the_wire() {
    let s = scenario();
    for (nanos, be) in [(false, false), (true, false), (false, true), (true, true)] {
        let got = load(&pcap_of(&s, nanos, be));
        assert_eq!(
            got.kind,
            Kind {
                format: Format::Wire(Container::Pcap),
                gzip: false
            }
        );
        let w = got.wire.as_ref().expect("wire report");
        check_report(w, &s);
        assert_eq!(w.messages, Reader::new(&s.expected).unwrap().count() as u64);
        assert!(
            got.data == s.expected,
            "nanos {nanos}, big-endian {be}: {w}"
        );
    }
}

#[test]
fn pcapng_and_gzip_give_the_same() {
    let s = scenario();
    let mut ng = PcapNgFile::new();
    ng.interface(1, true).interface(1, false);
    for (i, (ts, frame, snap)) in s.frames.iter().enumerate() {
        // Alternate interfaces: one counts ns, the other µs.
        if i % 2 == 0 {
            ng.packet(0, *ts, frame, *snap);
        } else {
            ng.packet(1, *ts / 1000, frame, *snap);
        }
    }
    let ng = ng.into_bytes();
    let got = load(&ng);
    assert_eq!(got.kind.format, Format::Wire(Container::PcapNg));
    check_report(got.wire.as_ref().unwrap(), &s);
    assert!(got.data == s.expected);

    for raw in [pcap_of(&s, true, false), ng] {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).unwrap();
        let got = load(&gz.finish().unwrap());
        assert!(got.kind.gzip);
        check_report(got.wire.as_ref().unwrap(), &s);
        assert!(got.data == s.expected);
    }
}

#[test]
fn gzipped_binaryfile_is_read_as_it_is() {
    let bf = binaryfile_of(&day());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&bf).unwrap();
    let got = load(&gz.finish().unwrap());
    assert_eq!(
        got.kind,
        Kind {
            format: Format::BinaryFile,
            gzip: true
        }
    );
    assert!(got.wire.is_none());
    assert!(got.data == bf);
}

#[test]
fn destination_filters_pick_one_feed() {
    let s = scenario();
    let pcap = pcap_of(&s, false, false);
    let only_a = capture::load_bytes(
        &pcap,
        &WireFilter {
            dst_ports: vec![26477],
            dst_addrs: vec![],
        },
    )
    .unwrap();
    let w = only_a.wire.unwrap();
    // Without B, A's missing packet and its truncated one are gaps too.
    assert_eq!(w.losses, 3, "{w}");
    assert_eq!(w.duplicate_packets, 0, "{w}");
    let only_b = capture::load_bytes(
        &pcap,
        &WireFilter {
            dst_ports: vec![],
            dst_addrs: vec![B.into()],
        },
    )
    .unwrap();
    let w = only_b.wire.unwrap();
    assert_eq!(w.losses, 1, "{w}");
    assert_eq!(w.not_moldudp64, 0, "the DNS datagram is filtered out first");
    assert!(only_b.data == s.expected);
}

#[test]
fn other_link_types_and_fragments() {
    let msgs = day();
    let packets = synth::moldudp64_packets(session("S1"), 1, &msgs[..200], 1400);
    let expected = binaryfile_of(&msgs[..200]);
    let ips: Vec<Vec<u8>> = packets
        .iter()
        .map(|(_, p)| synth::ipv4_udp(A, 26477, p))
        .collect();
    // Raw IP (LINKTYPE_RAW).
    let mut f = PcapFile::new(101, false, false);
    for (i, ip) in ips.iter().enumerate() {
        f.record(T0 + i as u64, ip, None);
    }
    assert!(load(&f.into_bytes()).data == expected);
    // Linux cooked v1 and v2.
    let mut sll = PcapFile::new(113, false, false);
    let mut sll2 = PcapFile::new(276, false, false);
    for (i, ip) in ips.iter().enumerate() {
        let mut v1 = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x08, 0x00];
        v1.extend_from_slice(ip);
        sll.record(T0 + i as u64, &v1, None);
        let mut v2 = vec![
            0x08, 0x00, 0, 0, 0, 0, 0, 2, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0,
        ];
        v2.extend_from_slice(ip);
        sll2.record(T0 + i as u64, &v2, None);
    }
    assert!(load(&sll.into_bytes()).data == expected);
    assert!(load(&sll2.into_bytes()).data == expected);
    // Each IP packet split in two fragments (the second one first), QinQ-tagged.
    let mut fr = PcapFile::new(1, false, false);
    for (i, ip) in ips.iter().enumerate() {
        let payload = &ip[20..];
        let cut = (payload.len() / 2) & !7;
        let frag = |off: usize, data: &[u8], more: bool| {
            let mut h = ip[..20].to_vec();
            h[2..4].copy_from_slice(&((20 + data.len()) as u16).to_be_bytes());
            let flags = ((off / 8) as u16) | if more { 0x2000 } else { 0 };
            h[6..8].copy_from_slice(&flags.to_be_bytes());
            h[4..6].copy_from_slice(&(i as u16).to_be_bytes());
            h.extend_from_slice(data);
            synth::ethernet(&[5, 6], 0x0800, &h, 60)
        };
        fr.record(T0 + 2 * i as u64, &frag(cut, &payload[cut..], false), None);
        fr.record(T0 + 2 * i as u64 + 1, &frag(0, &payload[..cut], true), None);
    }
    let got = load(&fr.into_bytes());
    let w = got.wire.unwrap();
    assert_eq!(w.reassembled, packets.len() as u64, "{w}");
    assert_eq!(w.ip_fragments, 2 * packets.len() as u64);
    assert!(got.data == expected, "{w}");
    // An unknown link type is counted, not guessed at.
    let mut odd = PcapFile::new(147, false, false);
    odd.record(T0, &ips[0], None);
    let w = load(&odd.into_bytes()).wire.unwrap();
    assert_eq!(w.unsupported_link, 1);
    assert_eq!(w.session, None);
}

#[test]
fn cut_files_and_garbage_never_panic() {
    let s = scenario();
    let pcap = pcap_of(&s, false, false);
    // Cut inside the last record: everything before it is read, the cut is reported.
    let cut = &pcap[..pcap.len() - 7];
    let got = load(cut);
    let w = got.wire.unwrap();
    assert!(w.stopped_early.is_some(), "{w}");
    assert!(w.messages > 0);
    // Every prefix of a short capture, and flipped bytes: errors or reports, no panic.
    let mut small = PcapFile::new(1, false, false);
    for (ts, f, snap) in s.frames.iter().take(8) {
        small.record(*ts, f, *snap);
    }
    let small = small.into_bytes();
    for n in (0..small.len()).step_by(5) {
        let _ = capture::load_bytes(&small[..n], &WireFilter::default());
    }
    let mut ng = PcapNgFile::new();
    ng.interface(1, true);
    for (ts, f, snap) in s.frames.iter().take(8) {
        ng.packet(0, *ts, f, *snap);
    }
    // A timestamp at the end of time, then an ordinary one.
    ng.packet(0, u64::MAX, &s.frames[9].1, None);
    ng.packet(0, 1, &s.frames[10].1, None);
    let ng = ng.into_bytes();
    for file in [&small, &ng] {
        for i in (0..file.len()).step_by(11) {
            for flip in [0x5a, 0xff, 0x01] {
                let mut bad = file.clone();
                bad[i] ^= flip;
                let _ = capture::load_bytes(&bad, &WireFilter::default());
            }
        }
    }
    for n in (0..ng.len()).step_by(7) {
        let _ = capture::load_bytes(&ng[..n], &WireFilter::default());
    }
}

#[test]
fn a_gap_is_given_up_while_reading_not_only_at_the_end() {
    // A gap followed by more than GAP_WAIT of capture time: the loss is reported, and the
    // messages after it released, before the end of the file.
    let msgs = day();
    let packets = synth::moldudp64_packets(session("S1"), 1, &msgs, 200);
    let mut x = Extractor::new(WireFilter::default());
    let feed = |x: &mut Extractor, i: usize| {
        // 1 ms apart: the gap is given up 100 ms of capture time later.
        x.tick(Some(T0 + i as u64 * 1_000_000));
        x.frame(
            Linktype::ETHERNET,
            &synth::udp_frame(&Frame::default(), &packets[i].1),
            false,
        );
    };
    for i in (0..packets.len()).filter(|&i| i != 3) {
        feed(&mut x, i);
        if i == 50 {
            break;
        }
    }
    assert_eq!(
        x.report.losses, 0,
        "not yet: 47 ms of capture time since the gap"
    );
    for i in 51..200 {
        feed(&mut x, i);
    }
    assert_eq!(x.report.losses, 1);
    assert_eq!(x.report.first_missing, Some(packets[3].0));
    assert_eq!(x.report.last_missing, Some(packets[4].0 - 1));
    let expected = binaryfile_of(
        msgs[..packets[200].0 as usize - 1]
            .iter()
            .enumerate()
            .filter(|(i, _)| !(packets[3].0..packets[4].0).contains(&(*i as u64 + 1)))
            .map(|(_, m)| m),
    );
    assert!(x.out == expected, "released before finish()");
}

#[test]
fn records_larger_than_the_read_buffer_are_read() {
    // A 60 KB MoldUDP64 packet (in one raw IP datagram) after a 300 KB non-IP record:
    // both exceed the reader's initial buffer.
    let msgs = day();
    let packets = synth::moldudp64_packets(session("BIG"), 1, &msgs, 60_000);
    let mut f = PcapFile::new(101, false, false);
    f.record(T0, &vec![0u8; 300_000], None);
    let mut n = 0;
    for (i, (_, p)) in packets.iter().enumerate() {
        f.record(T0 + 1 + i as u64, &synth::ipv4_udp(A, 26477, p), None);
        n += 1;
    }
    assert!(n >= 2);
    let got = load(&f.into_bytes());
    let w = got.wire.unwrap();
    assert_eq!(w.malformed_frames, 1, "{w}");
    assert!(got.data == binaryfile_of(&msgs), "{w}");
}

#[test]
fn modified_pcap_is_read_and_its_big_endian_form_refused_by_name() {
    let s = scenario();
    let mut f = PcapFile::modified(1, false);
    for (ts, frame, snap) in &s.frames {
        f.record(*ts, frame, *snap);
    }
    let got = load(&f.into_bytes());
    assert_eq!(got.kind.format, Format::Wire(Container::Pcap));
    check_report(got.wire.as_ref().unwrap(), &s);
    assert!(got.data == s.expected);

    // pcap_parser reads no big-endian modified pcap: refused, saying what it is, never taken
    // for BinaryFILE records.
    let mut f = PcapFile::modified(1, true);
    f.record(T0, &s.frames[3].1, None);
    let f = f.into_bytes();
    let e = capture::load_bytes(&f, &WireFilter::default()).expect_err("refused");
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(
        e.to_string()
            .starts_with("this is a big-endian modified pcap file: "),
        "{e}"
    );
    // Other formats in the table are refused the same way, also inside gzip.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(b"BZh91AY&SY").unwrap();
    let e = capture::load_bytes(&gz.finish().unwrap(), &WireFilter::default()).unwrap_err();
    assert!(e.to_string().contains("bzip2-compressed"), "{e}");
}
