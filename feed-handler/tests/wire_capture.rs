//! Captures of the wire through the command line: a generated day sent as MoldUDP64 on an A
//! and a B feed, written as pcap (µs and ns, both byte orders), pcapng and gzipped pcap, with
//! VLAN tags, trailing bytes, a foreign session, ARP, a non-MoldUDP64 datagram, a record cut
//! by the snap length and a packet missing from both feeds. `book`, `bbo`, `decode`,
//! `throughput` and `export` must print exactly what they print for a BinaryFILE of the
//! messages that are on the wire, and say on stderr which sequences are missing.
//!
//! With Wireshark's `text2pcap` and `tshark` installed, the same day framed by text2pcap and
//! rewritten by tshark (pcapng, nanosecond pcap) reads the same; without them those checks
//! are skipped with a printed reason.

use feed_handler::binaryfile::{push_record, Reader};
use feed_handler::generate::{generate_binaryfile, GenConfig};
use feed_handler::moldudp64::{empty_packet, session};
use feed_handler::pcap::synth::{self, Frame, Ipv6Ext, PcapFile, PcapNgFile};
use std::io::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SESSION: &str = "20240102AB";
const T0: u64 = 1_704_205_800_000_000_000;

fn feed_handler(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_feed-handler"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run feed-handler")
}

fn ok(args: &[&str]) -> Output {
    let out = feed_handler(args);
    assert!(
        out.status.success(),
        "feed-handler {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn day() -> Vec<Vec<u8>> {
    let (bf, _) = generate_binaryfile(&GenConfig {
        seed: 11,
        messages: 20_000,
        symbols: 30,
    });
    Reader::new(&bf)
        .unwrap()
        .map(|m| m.unwrap().as_bytes().to_vec())
        .collect()
}

fn binaryfile<'a>(msgs: impl IntoIterator<Item = &'a Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        push_record(&mut out, m);
    }
    out
}

struct Files {
    _dir: tempfile::TempDir,
    /// BinaryFILE of what is on the wire (the day less the packet missing from both feeds).
    reference: PathBuf,
    /// The same day's packet captures.
    captures: Vec<PathBuf>,
    /// First and last sequence missing on both feeds.
    gap: (u64, u64),
    packets: Vec<(u64, Vec<u8>)>,
    all: Vec<Vec<u8>>,
    dir: PathBuf,
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let msgs = day();
    let packets = synth::moldudp64_packets(session(SESSION), 1, &msgs, 1000);
    assert!(packets.len() > 100);
    let (gap_packet, only_b, cut_a) = (70, 40, 41);
    // (ts, frame, snap)
    let mut frames: Vec<(u64, Vec<u8>, Option<usize>)> = Vec::new();
    let mut ts = T0;
    let mut push = |f: Vec<u8>, snap: Option<usize>| {
        ts += 2_345;
        frames.push((ts, f, snap));
    };
    push(synth::arp_frame(), None);
    push(
        synth::udp_frame(
            &Frame {
                dst_port: 123,
                ..Frame::default()
            },
            b"ntp?",
        ),
        None,
    );
    let foreign = synth::moldudp64_packets(session("OTHERSESS1"), 900, &msgs[..40], 1000);
    for (i, (seq, p)) in packets.iter().enumerate() {
        let a = Frame {
            dst: Ipv4Addr::new(233, 54, 12, 111),
            dst_port: 26477,
            vlans: if i % 2 == 0 { &[101] } else { &[] },
            pad_to: if i % 7 == 0 { p.len() + 70 } else { 60 },
        };
        let b = Frame {
            dst: Ipv4Addr::new(233, 49, 196, 111),
            dst_port: 26478,
            vlans: if i % 3 == 0 { &[7, 102] } else { &[] },
            pad_to: 60,
        };
        if i == gap_packet {
            continue;
        }
        let (fa, fb) = (synth::udp_frame(&a, p), synth::udp_frame(&b, p));
        // B ahead of A now and then: the duplicate is the later one either way.
        let b_first = i % 5 == 0;
        if b_first {
            push(fb.clone(), None);
        }
        match i {
            _ if i == only_b => {}
            _ if i == cut_a => push(fa, Some(96)),
            _ => push(fa, None),
        }
        if !b_first {
            push(fb, None);
        }
        if i == 10 {
            push(synth::udp_frame(&a, &foreign[0].1), None);
            push(
                synth::udp_frame(&a, &empty_packet(session(SESSION), seq + 1, 0)),
                None,
            );
        }
    }
    let gap = (packets[gap_packet].0, packets[gap_packet + 1].0 - 1);
    let on_wire = binaryfile(
        msgs.iter()
            .enumerate()
            .filter(|(i, _)| !(gap.0..=gap.1).contains(&(*i as u64 + 1)))
            .map(|(_, m)| m),
    );
    let d = dir.path();
    let reference = write(d, "reference.itch50", &on_wire);
    let pcap = |nanos, be| {
        let mut f = PcapFile::new(1, nanos, be);
        for (t, fr, snap) in &frames {
            f.record(*t, fr, *snap);
        }
        f.into_bytes()
    };
    let mut ng = PcapNgFile::new();
    ng.interface(1, true);
    for (t, fr, snap) in &frames {
        ng.packet(0, *t, fr, *snap);
    }
    let captures = vec![
        write(d, "us_le.pcap", &pcap(false, false)),
        write(d, "ns_be.pcap", &pcap(true, true)),
        write(d, "day.pcapng", &ng.into_bytes()),
        write(d, "ns_le.pcap.gz", &gzip(&pcap(true, false))),
    ];
    Files {
        reference,
        captures,
        gap,
        packets,
        all: msgs,
        dir: d.to_owned(),
        _dir: dir,
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `book`'s output with its first line's file name taken out.
fn book(file: &Path, extra: &[&str]) -> (String, String) {
    let mut args = vec!["book", s(file), "--depth", "5"];
    args.extend_from_slice(extra);
    let out = ok(&args);
    let text = String::from_utf8(out.stdout).unwrap();
    (
        text.replacen(s(file), "FILE", 1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_command_reads_the_captures_as_the_binaryfile_of_the_wire() {
    let f = files();
    let (ref_book, _) = book(&f.reference, &[]);
    let ref_bbo = ok(&["bbo", s(&f.reference)]).stdout;
    let ref_at = book(&f.reference, &["--at", "10:00:00"]).0;
    let ref_decode = ok(&["decode", s(&f.reference)]).stdout;
    let ref_tp = String::from_utf8(ok(&["throughput", s(&f.reference)]).stdout).unwrap();
    let counts = |tp: &str| -> Vec<String> {
        tp.split_whitespace()
            .filter(|w| w.starts_with("messages=") || w.starts_with("bbo_changes="))
            .map(str::to_owned)
            .collect()
    };
    let ref_counts = counts(&ref_tp);
    let ref_dbn = f.dir.join("ref.dbn");
    ok(&[
        "export",
        s(&f.reference),
        "--schema",
        "mbp-1",
        "--date",
        "2024-01-02",
        "-o",
        s(&ref_dbn),
    ]);
    assert!(ref_bbo.len() > 10_000, "a day with many BBO changes");
    let missing = format!("first {}, last {}", f.gap.0, f.gap.1);
    for cap in &f.captures {
        let (got, err) = book(cap, &[]);
        assert_eq!(got, ref_book, "book of {}", cap.display());
        assert!(
            err.contains("GAPS: 1 ranges") && err.contains(&missing),
            "{}: the missing packet is reported: {err}",
            cap.display()
        );
        assert!(
            err.contains("1 records truncated by the snap length"),
            "{err}"
        );
        assert!(err.contains("1 packets of other sessions dropped"), "{err}");
        assert!(err.contains("1 non-UDP frames"), "{err}");
        assert!(err.contains("1 UDP payloads not MoldUDP64"), "{err}");
        assert_eq!(book(cap, &["--at", "10:00:00"]).0, ref_at);
        let bbo = ok(&["bbo", s(cap)]).stdout;
        assert!(bbo == ref_bbo, "bbo of {}", cap.display());
        assert!(
            ok(&["decode", s(cap)]).stdout == ref_decode,
            "decode of {}",
            cap.display()
        );
        let tp = String::from_utf8(ok(&["throughput", s(cap)]).stdout).unwrap();
        assert_eq!(
            counts(&tp),
            ref_counts,
            "throughput of {}: {tp}",
            cap.display()
        );
        let dbn = f.dir.join("cap.dbn");
        ok(&[
            "export",
            s(cap),
            "--schema",
            "mbp-1",
            "--date",
            "2024-01-02",
            "-o",
            s(&dbn),
        ]);
        assert!(
            std::fs::read(&dbn).unwrap() == std::fs::read(&ref_dbn).unwrap(),
            "export of {}",
            cap.display()
        );
    }
}

#[test]
fn destination_options_pick_the_feeds() {
    let f = files();
    let cap = &f.captures[0];
    let ref_bbo = ok(&["bbo", s(&f.reference)]).stdout;
    // B alone has every packet but the one missing on both feeds.
    for args in [
        &["--dst-port", "26478"][..],
        &["--dst-addr", "233.49.196.111"],
        &["--dst-port", "26477,26478", "--dst-addr", "233.49.196.111"],
    ] {
        let mut a = vec!["bbo", s(cap)];
        a.extend_from_slice(args);
        let out = ok(&a);
        assert!(out.stdout == ref_bbo, "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("GAPS: 1 ranges"), "{args:?}: {err}");
        assert!(err.contains("UDP datagrams filtered out"), "{err}");
    }
    // A alone lacks two more packets, next to each other: one more range.
    let out = ok(&["bbo", s(cap), "--dst-port", "26477"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GAPS: 2 ranges"), "{err}");
    assert!(out.stdout != ref_bbo);
    // A port nobody sends to: nothing read, and the command says so.
    let out = feed_handler(&["bbo", s(cap), "--dst-port", "9"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no ITCH message"), "{err}");
    assert!(err.contains("--dst-port"), "{err}");
}

#[test]
fn help_names_the_formats_and_options() {
    for cmd in [
        "book",
        "bbo",
        "decode",
        "export",
        "throughput",
        "replay",
        "run",
    ] {
        let text = String::from_utf8(feed_handler(&[cmd, "--help"]).stdout).unwrap();
        for word in ["--dst-port", "--dst-addr", "pcap"] {
            assert!(text.contains(word), "`{cmd} --help` lacks {word}:\n{text}");
        }
    }
    let text = String::from_utf8(feed_handler(&["--help"]).stdout).unwrap();
    for word in [
        "pcapng",
        "gzip",
        "VLAN",
        "SLL2",
        "A and a B feed",
        "snap length",
    ] {
        assert!(text.contains(word), "`--help` lacks {word}:\n{text}");
    }
}

#[test]
fn gzipped_binaryfile_and_refused_formats() {
    let f = files();
    let gz = write(
        &f.dir,
        "ref.itch50.gz",
        &gzip(&std::fs::read(&f.reference).unwrap()),
    );
    assert!(ok(&["bbo", s(&gz)]).stdout == ok(&["bbo", s(&f.reference)]).stdout);
    let mut zst = vec![0x28, 0xb5, 0x2f, 0xfd];
    zst.extend_from_slice(&[0; 64]);
    let zst = write(&f.dir, "day.itch50.zst", &zst);
    let out = feed_handler(&["bbo", s(&zst)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("zstd"));
}

#[test]
fn ipv6_feeds_are_picked_by_group_and_port() {
    // The day's A and B feeds over IPv6 (ff0e:: and ff02:: groups, hop-by-hop options on A),
    // with packet 70 on neither and packet 40 on B only.
    let f = files();
    let a6: Ipv6Addr = "ff0e::db8:1:111".parse().unwrap();
    let b6: Ipv6Addr = "ff02::1:3".parse().unwrap();
    let mut pcap = PcapFile::new(1, true, true);
    for (i, (_, p)) in f.packets.iter().enumerate() {
        let t = T0 + i as u64 * 10_000;
        if i == 70 {
            continue;
        }
        if i != 40 {
            pcap.record(
                t,
                &synth::udp6_frame(a6, 26477, &[Ipv6Ext::HopByHop], p),
                None,
            );
        }
        pcap.record(t + 1, &synth::udp6_frame(b6, 26478, &[], p), None);
    }
    let cap = write(&f.dir, "v6.pcap", &pcap.into_bytes());
    let ref_bbo = ok(&["bbo", s(&f.reference)]).stdout;
    for args in [
        &[][..],
        &["--dst-addr", "ff02::1:3"],
        &[
            "--dst-addr",
            "ff0e::db8:1:111,ff02::1:3",
            "--dst-port",
            "26478",
        ],
    ] {
        let mut a = vec!["bbo", s(&cap)];
        a.extend_from_slice(args);
        let out = ok(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.stdout == ref_bbo, "{args:?}: {err}");
        assert!(err.contains("GAPS: 1 ranges"), "{args:?}: {err}");
    }
    let out = ok(&["bbo", s(&cap), "--dst-addr", "ff0e::db8:1:111"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GAPS: 2 ranges"), "{err}");
    // A group of the capture's other scope is not the same address.
    let out = feed_handler(&["bbo", s(&cap), "--dst-addr", "ff0e::1:3"]);
    assert!(!out.status.success());
}

#[test]
fn big_endian_modified_pcap_is_refused_by_name() {
    let f = files();
    let mut m = PcapFile::modified(1, true);
    m.record(
        T0,
        &synth::udp_frame(&Frame::default(), &f.packets[0].1),
        None,
    );
    let m = write(&f.dir, "old.pcap", &m.into_bytes());
    let out = feed_handler(&["decode", s(&m)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("big-endian modified pcap"), "{err}");
    assert!(err.contains("editcap"), "{err}");
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// text2pcap frames the packets itself (Ethernet, IPv4, UDP), tshark rewrites the file as
/// pcapng and as nanosecond pcap: captures written by real tools read the same.
#[test]
fn captures_written_by_wireshark_tools_read_the_same() {
    // Never a pass without having compared: without the tools the test fails and says why.
    assert!(
        have("text2pcap") && have("tshark"),
        "this test needs text2pcap and tshark (Debian's tshark package): run `cargo xtask setup`"
    );
    let f = files();
    let mut hex = String::new();
    for (_, p) in &f.packets {
        for (i, chunk) in p.chunks(16).enumerate() {
            hex.push_str(&format!("{:06x}", i * 16));
            for b in chunk {
                hex.push_str(&format!(" {b:02x}"));
            }
            hex.push('\n');
        }
    }
    let txt = write(&f.dir, "packets.txt", hex.as_bytes());
    let t2p = f.dir.join("text2pcap.pcap");
    let run = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(Command::new("text2pcap")
        .args(["-q", "-4", "10.0.0.1,233.54.12.111", "-u", "26400,26477"])
        .arg(&txt)
        .arg(&t2p));
    let ng = f.dir.join("tshark.pcapng");
    let ns = f.dir.join("tshark-ns.pcap");
    run(Command::new("tshark")
        .args(["-r", s(&t2p), "-F", "pcapng", "-w", s(&ng)])
        .env("HOME", &f.dir));
    run(Command::new("tshark")
        .args(["-r", s(&t2p), "-F", "nsecpcap", "-w", s(&ns)])
        .env("HOME", &f.dir));
    let whole = write(&f.dir, "whole.itch50", &binaryfile(&f.all));
    let want = ok(&["bbo", s(&whole)]).stdout;
    for cap in [&t2p, &ng, &ns] {
        let out = ok(&["bbo", s(cap)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("GAPS"), "{}: {err}", cap.display());
        assert!(out.stdout == want, "{}: {err}", cap.display());
    }
}
