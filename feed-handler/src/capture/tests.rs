//! The streaming path (a [`CaptureReader`] read by a [`StreamReader`] in chunks) gives what
//! loading the capture whole and reading it with a [`Reader`] gives, whatever the sizes the
//! input hands out.

use super::*;
use crate::binaryfile::{push_record, BadRecord, Reader, ReaderCounters, StreamReader};
use crate::generate::{generate_binaryfile, GenConfig};
use crate::inspect;
use crate::moldudp64::session;
use crate::pcap::synth::{self, Frame, Ipv6Ext, PcapFile, PcapNgFile};
use std::io::Write as _;

/// A reader that hands out 1 to 7 bytes per `read`, as a pipe or a slow decompressor may.
struct Dribble {
    data: Vec<u8>,
    pos: usize,
    step: usize,
}

impl Read for Dribble {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.step = self.step % 7 + 1;
        let n = self.step.min(buf.len()).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

type Records = Vec<Result<Vec<u8>, BadRecord>>;

fn in_memory(file: &[u8]) -> (Records, ReaderCounters, Option<WireReport>) {
    let loaded = load_bytes(file, &WireFilter::default()).expect("loads");
    let mut r = Reader::new(&loaded.data).expect("BinaryFILE");
    let records = r
        .by_ref()
        .map(|m| m.map(|m| m.as_bytes().to_vec()))
        .collect();
    (records, *r.counters(), loaded.wire)
}

fn streamed(file: &[u8], chunk: usize) -> (Records, ReaderCounters, Option<WireReport>) {
    let input = Dribble {
        data: file.to_vec(),
        pos: 0,
        step: 0,
    };
    let mut r = StreamReader::with_chunk(
        CaptureReader::new(input, &WireFilter::default()).expect("opens"),
        chunk,
    );
    let mut records = Vec::new();
    r.for_each(|m| records.push(m.map(|m| m.as_bytes().to_vec())))
        .expect("reads");
    (records, *r.counters(), r.get_ref().wire_report().cloned())
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

#[test]
fn streaming_in_dribbles_gives_what_loading_whole_gives() {
    let (bf, _) = generate_binaryfile(&GenConfig {
        seed: 3,
        messages: 3000,
        symbols: 8,
    });
    let msgs: Vec<Vec<u8>> = Reader::new(&bf)
        .unwrap()
        .map(|m| m.unwrap().as_bytes().to_vec())
        .collect();
    // A BinaryFILE with a bad record in the middle and a cut last record.
    let mut damaged = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        push_record(&mut damaged, m);
        if i == 1000 {
            push_record(&mut damaged, b"?bad");
        }
    }
    damaged.truncate(damaged.len() - 5);
    // A zero-prefixed one, stopped by an unknown type: the rest is unread.
    let mut zero = Vec::new();
    for m in &msgs[..500] {
        zero.extend_from_slice(&[0, 0]);
        zero.extend_from_slice(m);
    }
    zero.extend_from_slice(&[0, 0, b'?', 1, 2, 3]);
    zero.extend_from_slice(&bf[..300]);
    // Packet captures: A and B feeds, one packet on neither, IPv4 and IPv6.
    let packets = synth::moldudp64_packets(session("STREAM0001"), 1, &msgs, 600);
    let mut pcap = PcapFile::new(1, true, true);
    let mut ng = PcapNgFile::new_big_endian();
    ng.interface(1, true);
    for (i, (_, p)) in packets.iter().enumerate() {
        if i == 9 {
            continue;
        }
        let t = 1_700_000_000_000_000_000 + i as u64 * 100_000;
        pcap.record(t, &synth::udp_frame(&Frame::default(), p), None);
        let b = Frame {
            dst_port: 26478,
            ..Frame::default()
        };
        pcap.record(t + 1, &synth::udp_frame(&b, p), None);
        let v6 = synth::udp6_frame("ff0e::1".parse().unwrap(), 26477, &[Ipv6Ext::HopByHop], p);
        ng.packet(0, t, &v6, if i == 4 { Some(60) } else { None });
    }
    let (pcap, ng) = (pcap.into_bytes(), ng.into_bytes());
    let cut_pcap = &pcap[..pcap.len() - 11];
    for (name, file) in [
        ("binaryfile", bf.clone()),
        ("damaged", damaged),
        ("zero-prefixed", zero),
        ("gzip binaryfile", gzip(&bf)),
        ("pcap", pcap.clone()),
        ("cut pcap", cut_pcap.to_vec()),
        ("pcapng", ng.clone()),
        ("gzip pcapng", gzip(&ng)),
    ] {
        let whole = in_memory(&file);
        assert!(whole.1.messages > 400, "{name}: {:?}", whole.1);
        for chunk in [97, 4096, 1 << 20] {
            let got = streamed(&file, chunk);
            assert_eq!(got.1, whole.1, "{name}, chunk {chunk}");
            assert_eq!(got.2, whole.2, "{name}, chunk {chunk}");
            assert!(got.0 == whole.0, "{name}, chunk {chunk}");
        }
    }
    // book_at over the stream is the book of the loaded capture.
    let data = load_bytes(&pcap, &WireFilter::default()).unwrap().data;
    let input = CaptureReader::new(
        Dribble {
            data: pcap,
            pos: 0,
            step: 0,
        },
        &WireFilter::default(),
    )
    .unwrap();
    let streamed = inspect::book_at(input, None).unwrap();
    let loaded = inspect::book_at(&data[..], None).unwrap();
    assert_eq!(streamed.applied, loaded.applied);
    assert_eq!(streamed.reader, loaded.reader);
}

#[test]
fn a_stream_that_is_no_binaryfile_fails_at_start() {
    let mut r = StreamReader::new(&b"\x00\x00zzzzzzzzzzzzzzzz"[..]);
    let e = r.start().unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("not a BinaryFILE capture"), "{e}");
    let mut empty = StreamReader::new(&b""[..]);
    assert_eq!(empty.start().unwrap(), None);
    assert_eq!(empty.read_records(10, |_| {}).unwrap(), 0);
}
