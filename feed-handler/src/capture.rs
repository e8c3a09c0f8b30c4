//! Opening a capture file of any supported kind as a BinaryFILE byte stream.
//!
//! The commands that take a capture (`decode`, `book`, `bbo`, `export`, `throughput`,
//! `replay`, `run --capture`) read:
//!
//! - BinaryFILE ([`crate::binaryfile`]: length-prefixed or all-zero-prefixed records);
//! - pcap and pcapng captures of MoldUDP64 over UDP ([`crate::pcap`]): the ITCH messages of
//!   one session, in sequence order, A/B duplicates once, gaps reported;
//! - any of these gzip-compressed (NASDAQ's sample files are `.gz`), decompressed while
//!   reading.
//!
//! The kind is told from the first bytes, never from the file name. Whatever the input,
//! what comes out is BinaryFILE bytes, which [`crate::binaryfile::Reader`] (and so every
//! command) reads as before. The magic numbers are in one table, [`MAGIC_NUMBERS`]: the
//! formats it names but nothing reads (zstd, bzip2, xz, zip, big-endian "modified" pcap) are
//! refused here with the error [`crate::binaryfile::detect`] gives for them, and `detect`
//! refuses every format of the table, so a packet capture handed to a BinaryFILE reader is
//! never taken for records. Unknown data goes through as it is, for `detect` to judge.

use crate::binaryfile::DetectError;
use crate::pcap::{Container, WireFilter, WireReader, WireReport};
use flate2::read::MultiGzDecoder;
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Cursor, Read};
use std::path::Path;

/// What a capture file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// BinaryFILE records (or something [`crate::binaryfile::detect`] will judge).
    BinaryFile,
    /// A packet capture of the wire.
    Wire(Container),
}

/// A capture's format and whether it was gzip-compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// What the (decompressed) file holds.
    pub format: Format,
    /// Whether the file is gzip-compressed.
    pub gzip: bool,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let format = match self.format {
            Format::BinaryFile => "BinaryFILE",
            Format::Wire(Container::Pcap) => "pcap",
            Format::Wire(Container::PcapNg) => "pcapng",
        };
        write!(f, "{format}{}", if self.gzip { " (gzip)" } else { "" })
    }
}

/// What a format told by its magic number is to this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MagicKind {
    /// A packet capture that [`WireReader`] reads.
    Wire(Container),
    /// gzip, decompressed while reading.
    Gzip,
    /// A format nothing here reads; the text says what to do with it.
    Unread(&'static str),
}

/// One capture format recognised by its leading bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Magic {
    /// The leading bytes.
    pub bytes: &'static [u8],
    /// The format's name, for messages.
    pub name: &'static str,
    /// Whether and how it is read.
    pub kind: MagicKind,
}

const DECOMPRESS_FIRST: &str = "only gzip compression is read, decompress it first";

/// Every format told apart by its first bytes: the one table [`CaptureReader`] (which reads
/// the packet captures and gzip) and [`crate::binaryfile::detect`] (which refuses them all, as
/// a BinaryFILE reader must) consult. None of these can start a BinaryFILE: as a first length
/// prefix each is far longer than any ITCH message.
pub const MAGIC_NUMBERS: &[Magic] = &[
    magic(
        &[0xd4, 0xc3, 0xb2, 0xa1],
        "pcap",
        MagicKind::Wire(Container::Pcap),
    ),
    magic(
        &[0xa1, 0xb2, 0xc3, 0xd4],
        "pcap",
        MagicKind::Wire(Container::Pcap),
    ),
    magic(
        &[0x4d, 0x3c, 0xb2, 0xa1],
        "pcap (nanosecond)",
        MagicKind::Wire(Container::Pcap),
    ),
    magic(
        &[0xa1, 0xb2, 0x3c, 0x4d],
        "pcap (nanosecond)",
        MagicKind::Wire(Container::Pcap),
    ),
    // Alexey Kuznetsov's "modified" pcap, as old Linux tcpdumps wrote it (longer record
    // headers); pcap_parser reads the little-endian one only.
    magic(
        &[0x34, 0xcd, 0xb2, 0xa1],
        "modified pcap",
        MagicKind::Wire(Container::Pcap),
    ),
    magic(
        &[0xa1, 0xb2, 0xcd, 0x34],
        "big-endian modified pcap",
        MagicKind::Unread(
            "it is not read, convert it to standard pcap first \
             (`editcap -F pcap IN OUT`, or `tcpdump -r IN -w OUT`)",
        ),
    ),
    magic(
        &[0x0a, 0x0d, 0x0d, 0x0a],
        "pcapng",
        MagicKind::Wire(Container::PcapNg),
    ),
    magic(&[0x1f, 0x8b, 0x08], "gzip", MagicKind::Gzip),
    magic(
        &[0x28, 0xb5, 0x2f, 0xfd],
        "zstd-compressed",
        MagicKind::Unread(DECOMPRESS_FIRST),
    ),
    magic(
        b"BZh",
        "bzip2-compressed",
        MagicKind::Unread(DECOMPRESS_FIRST),
    ),
    magic(
        &[0xfd, b'7', b'z', b'X', b'Z', 0],
        "xz-compressed",
        MagicKind::Unread(DECOMPRESS_FIRST),
    ),
    magic(b"PK\x03\x04", "zip", MagicKind::Unread(DECOMPRESS_FIRST)),
];

const fn magic(bytes: &'static [u8], name: &'static str, kind: MagicKind) -> Magic {
    Magic { bytes, name, kind }
}

impl Magic {
    /// What to do with a file of this format, for an error message about it.
    pub fn hint(&self) -> &'static str {
        match self.kind {
            MagicKind::Wire(_) | MagicKind::Gzip => {
                "BinaryFILE readers take BinaryFILE bytes only: read it through \
                 feed_handler::capture (`load` or `open`), as every feed-handler command that \
                 takes a capture does (decode, book, bbo, export, throughput, replay, \
                 run --capture; --dst-port/--dst-addr choose the feed of a packet capture)"
            }
            MagicKind::Unread(hint) => hint,
        }
    }
}

/// The format whose magic number `head` starts with, if any.
pub fn identify(head: &[u8]) -> Option<&'static Magic> {
    MAGIC_NUMBERS.iter().find(|m| head.starts_with(m.bytes))
}

/// The container a file starting with `head` is, if it is a packet capture this crate reads.
pub fn sniff_wire(head: &[u8]) -> Option<Container> {
    match identify(head)?.kind {
        MagicKind::Wire(c) => Some(c),
        _ => None,
    }
}

/// Whether a file starting with `head` is gzip-compressed.
pub fn is_gzip(head: &[u8]) -> bool {
    identify(head).is_some_and(|m| m.kind == MagicKind::Gzip)
}

/// Reads up to `N` leading bytes of `r` (fewer only at the end of the input).
fn read_head<const N: usize>(r: &mut impl Read) -> io::Result<([u8; N], usize)> {
    let mut head = [0u8; N];
    let mut n = 0;
    while n < N {
        match r.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((head, n))
}

type Input = Box<dyn Read + Send>;

enum Inner {
    BinaryFile(Input),
    Wire(Box<WireReader<Input>>),
}

/// A capture as a stream of BinaryFILE bytes (see the module docs).
pub struct CaptureReader {
    inner: Inner,
    kind: Kind,
}

impl fmt::Debug for CaptureReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureReader")
            .field("kind", &self.kind)
            .field("wire", &self.wire_report())
            .finish()
    }
}

impl CaptureReader {
    /// Reads `input`, told apart by its first bytes; `filter` applies to packet captures.
    pub fn new(input: impl Read + Send + 'static, filter: &WireFilter) -> io::Result<Self> {
        let mut input: Input = Box::new(input);
        let (head, n) = read_head::<4>(&mut input)?;
        let mut input: Input = Box::new(Cursor::new(head).take(n as u64).chain(input));
        let gzip = is_gzip(&head[..n]);
        let mut head = head;
        let mut n = n;
        if gzip {
            let mut unzipped: Input = Box::new(MultiGzDecoder::new(BufReader::new(input)));
            (head, n) = read_head::<4>(&mut unzipped).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("gzip-compressed, but cannot decompress: {e}"),
                )
            })?;
            input = Box::new(Cursor::new(head).take(n as u64).chain(unzipped));
        }
        let (inner, format) = match identify(&head[..n]) {
            None => (Inner::BinaryFile(input), Format::BinaryFile),
            Some(Magic {
                kind: MagicKind::Wire(container),
                ..
            }) => (
                Inner::Wire(Box::new(
                    WireReader::new(input, *container, filter.clone()).map_err(|e| {
                        io::Error::new(e.kind(), format!("not a readable {container:?} file: {e}"))
                    })?,
                )),
                Format::Wire(*container),
            ),
            // Another format, or gzip inside gzip: refused as BinaryFILE readers refuse it.
            Some(other) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    DetectError::OtherFormat(other),
                ))
            }
        };
        Ok(Self {
            inner,
            kind: Kind { format, gzip },
        })
    }

    /// What the file is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// For a packet capture, what reading it found so far (complete at the end).
    pub fn wire_report(&self) -> Option<&WireReport> {
        match &self.inner {
            Inner::Wire(w) => Some(w.report()),
            Inner::BinaryFile(_) => None,
        }
    }
}

impl Read for CaptureReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::BinaryFile(r) => r.read(buf),
            Inner::Wire(w) => w.read(buf),
        }
    }
}

/// Opens the capture at `path` as a stream (for commands that read in chunks).
pub fn open(path: &Path, filter: &WireFilter) -> io::Result<CaptureReader> {
    CaptureReader::new(BufReader::with_capacity(1 << 20, File::open(path)?), filter)
}

/// A whole capture as BinaryFILE bytes in memory.
#[derive(Debug)]
pub struct Loaded {
    /// BinaryFILE bytes: the file itself, decompressed, or extracted from packets.
    pub data: Vec<u8>,
    /// What the file was.
    pub kind: Kind,
    /// For a packet capture, what reading it found.
    pub wire: Option<WireReport>,
}

impl Loaded {
    /// A line for stderr about what was read from a packet capture, if it is one.
    pub fn summary(&self) -> Option<String> {
        self.wire.as_ref().map(|w| format!("{}: {w}", self.kind))
    }
}

/// Reads the capture at `path` whole. An uncompressed BinaryFILE is read as it is, without
/// a copy.
pub fn load(path: &Path, filter: &WireFilter) -> io::Result<Loaded> {
    let mut f = File::open(path)?;
    let (head, n) = read_head::<4>(&mut f)?;
    if identify(&head[..n]).is_none() {
        return Ok(Loaded {
            data: std::fs::read(path)?,
            kind: Kind {
                format: Format::BinaryFile,
                gzip: false,
            },
            wire: None,
        });
    }
    drop(f);
    read_all(open(path, filter)?)
}

/// [`load`] for a capture already in memory (copied first).
pub fn load_bytes(bytes: &[u8], filter: &WireFilter) -> io::Result<Loaded> {
    read_all(CaptureReader::new(Cursor::new(bytes.to_vec()), filter)?)
}

fn read_all(mut r: CaptureReader) -> io::Result<Loaded> {
    let mut data = Vec::new();
    r.read_to_end(&mut data)?;
    Ok(Loaded {
        data,
        kind: r.kind,
        wire: match r.inner {
            Inner::Wire(w) => Some(w.into_report()),
            Inner::BinaryFile(_) => None,
        },
    })
}

#[cfg(test)]
mod tests;
