//! NASDAQ BinaryFILE captures: each ITCH message preceded by its 2-byte big-endian length.
//!
//! Owns the file framing only; message layouts are [`crate::itch`]'s.
//!
//! Some captures in circulation write every length prefix as `0x0000` (see the README of the
//! shared samples). [`detect`] recognises such a file by checking that the first records all
//! have a zero prefix and a known type, and the [`Reader`] then takes each message's size from
//! its type. A zero prefix in a length-prefixed file, or a non-zero one in a zero-prefixed
//! file, is a bad record: counted and reported, never silently reinterpreted.

use crate::badinput::RateLimitedLog;
use crate::capture::{self, Magic};
use crate::itch::{self, DecodeError, Message};
use std::io::{self, Read, Write};
use std::ops::ControlFlow;
use std::time::Instant;

/// How a capture frames its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// The standard: a 2-byte big-endian length before each message.
    LengthPrefixed,
    /// Every prefix is 0x0000; the message type decides the size.
    ZeroPrefixed,
}

/// Records [`detect`] examines before trusting a zero-prefixed layout.
const DETECT_RECORDS: usize = 16;

/// Why a capture could not be recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DetectError {
    /// The first prefix is 0x0000 but the records after it do not follow type-driven sizes.
    #[error("length prefix at offset {offset} is 0 and the data does not follow ITCH type sizes either: not a BinaryFILE capture")]
    Unrecognized {
        /// Offset of the first record that did not fit.
        offset: usize,
    },
    /// The file starts with the magic number of another format (a packet capture, a
    /// compressed file): read as length-prefixed records it would be garbage, some of which
    /// could decode as messages by chance. [`crate::capture`] reads pcap, pcapng and gzip
    /// into BinaryFILE bytes first; other formats are refused. The formats are those of
    /// [`crate::capture::MAGIC_NUMBERS`].
    #[error("this is a {} file: {}", .0.name, .0.hint())]
    OtherFormat(&'static Magic),
}

/// Decides the framing of `data` from its first records.
pub fn detect(data: &[u8]) -> Result<Framing, DetectError> {
    if let Some(magic) = capture::identify(data) {
        return Err(DetectError::OtherFormat(magic));
    }
    let Some(prefix) = data.get(..2) else {
        return Ok(Framing::LengthPrefixed);
    };
    if prefix != [0, 0] {
        return Ok(Framing::LengthPrefixed);
    }
    let mut pos = 0;
    for _ in 0..DETECT_RECORDS {
        if pos == data.len() {
            break;
        }
        let fits = data.get(pos..pos + 2) == Some(&[0, 0][..])
            && data
                .get(pos + 2)
                .and_then(|&t| itch::message_size(t))
                .is_some_and(|n| pos + 2 + n <= data.len());
        if !fits {
            return Err(DetectError::Unrecognized { offset: pos });
        }
        pos += 2 + itch::message_size(data[pos + 2]).unwrap_or(0);
    }
    Ok(Framing::ZeroPrefixed)
}

/// What was wrong with one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The message inside the frame did not decode (unknown type, length contradicting the type).
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A zero length prefix in a length-prefixed file.
    #[error("zero length prefix")]
    ZeroLength,
    /// A non-zero length prefix in a zero-prefixed file.
    #[error("non-zero length prefix {0} in a file whose prefixes are all zero")]
    UnexpectedPrefix(u16),
    /// The file ends inside a record.
    #[error("file ends inside a record: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes the record needs.
        need: usize,
        /// Bytes left in the file.
        have: usize,
    },
}

/// A bad record and where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("bad record at offset {offset}: {error}")]
pub struct BadRecord {
    /// Byte offset of the record's length prefix.
    pub offset: usize,
    /// What was wrong.
    pub error: RecordError,
}

/// Totals kept by a [`Reader`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReaderCounters {
    /// Messages decoded.
    pub messages: u64,
    /// Records skipped as bad (all kinds).
    pub bad_records: u64,
    /// Of those, records whose type byte is unknown.
    pub unknown_types: u64,
    /// Of those, records whose frame length contradicts the type.
    pub length_mismatches: u64,
    /// Bytes left unread because the reader could not resynchronise (truncation, or an
    /// unknown type in a zero-prefixed file where sizes come from types).
    pub unread_bytes: u64,
}

/// Iterates over the records of a capture held in memory; bad records come out as `Err`,
/// counted and logged at a bounded rate, and reading goes on where the framing allows.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    framing: Framing,
    counters: ReaderCounters,
    log: RateLimitedLog,
    /// Offset of `data` in the stream it was cut from (for [`BadRecord::offset`]).
    base: usize,
}

impl<'a> Reader<'a> {
    /// A reader for `data`, framing detected by [`detect`].
    pub fn new(data: &'a [u8]) -> Result<Self, DetectError> {
        Ok(Self::with_framing(data, detect(data)?))
    }

    /// A reader for `data` with a known framing.
    pub fn with_framing(data: &'a [u8], framing: Framing) -> Self {
        Self {
            data,
            pos: 0,
            framing,
            counters: ReaderCounters::default(),
            log: RateLimitedLog::new(10),
            base: 0,
        }
    }

    /// The framing in use.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Totals so far.
    pub fn counters(&self) -> &ReaderCounters {
        &self.counters
    }

    /// Size of the whole capture in bytes (with [`Reader::position`], how far reading got).
    pub fn len_bytes(&self) -> usize {
        self.data.len()
    }

    /// Bytes consumed so far (a reader over `&data[position..]` with the same framing
    /// continues where this one stopped).
    pub fn position(&self) -> usize {
        self.pos
    }

    fn bad(&mut self, offset: usize, error: RecordError) -> BadRecord {
        self.counters.bad_records += 1;
        match error {
            RecordError::Decode(DecodeError::UnknownType(_)) => self.counters.unknown_types += 1,
            RecordError::Decode(DecodeError::LengthMismatch { .. }) => {
                self.counters.length_mismatches += 1
            }
            _ => {}
        }
        let bad = BadRecord {
            offset: self.base + offset,
            error,
        };
        if let Some(suppressed) = self.log.allow(Instant::now()) {
            tracing::warn!(%bad, suppressed, "skipping bad BinaryFILE record");
        }
        bad
    }

    fn stop(&mut self) {
        self.counters.unread_bytes += (self.data.len() - self.pos) as u64;
        self.pos = self.data.len();
    }

    fn next_record(&mut self) -> Option<Result<Message<'a>, BadRecord>> {
        let data = self.data;
        let start = self.pos;
        let rest = &data[start..];
        if rest.is_empty() {
            return None;
        }
        let Some((prefix, body)) = rest.split_first_chunk::<2>() else {
            let e = self.bad(
                start,
                RecordError::Truncated {
                    need: 2,
                    have: rest.len(),
                },
            );
            self.stop();
            return Some(Err(e));
        };
        let prefix = u16::from_be_bytes(*prefix);
        match self.framing {
            Framing::LengthPrefixed => {
                let len = usize::from(prefix);
                if len == 0 {
                    // Without a length there is no next record to find: the file is not what
                    // its first records said.
                    let e = self.bad(start, RecordError::ZeroLength);
                    self.stop();
                    return Some(Err(e));
                }
                let Some(frame) = body.get(..len) else {
                    let e = self.bad(
                        start,
                        RecordError::Truncated {
                            need: len,
                            have: body.len(),
                        },
                    );
                    self.stop();
                    return Some(Err(e));
                };
                self.pos = start + 2 + len;
                match itch::decode_exact(frame) {
                    Ok(m) => {
                        self.counters.messages += 1;
                        Some(Ok(m))
                    }
                    Err(e) => Some(Err(self.bad(start, e.into()))),
                }
            }
            Framing::ZeroPrefixed => {
                if prefix != 0 {
                    let e = self.bad(start, RecordError::UnexpectedPrefix(prefix));
                    self.stop();
                    return Some(Err(e));
                }
                match itch::decode(body) {
                    Ok((m, n)) => {
                        self.pos = start + 2 + n;
                        self.counters.messages += 1;
                        Some(Ok(m))
                    }
                    Err(e) => {
                        let e = self.bad(start, e.into());
                        self.stop();
                        Some(Err(e))
                    }
                }
            }
        }
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<Message<'a>, BadRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record()
    }
}

/// The end of the last whole record in `data` (what follows is the start of a record whose
/// rest is in the next chunk). A record whose size cannot be known (an unknown type in a
/// zero-prefixed capture) or a zero length ends the walk at the end of `data`: the reader
/// reports it and stops there.
fn whole_records(data: &[u8], framing: Framing) -> usize {
    let mut pos = 0;
    while let Some(prefix) = data.get(pos..pos + 2) {
        let len = match framing {
            Framing::LengthPrefixed => usize::from(u16::from_be_bytes([prefix[0], prefix[1]])),
            Framing::ZeroPrefixed => match data.get(pos + 2).map(|&t| itch::message_size(t)) {
                Some(Some(n)) => n,
                Some(None) => return data.len(),
                None => break,
            },
        };
        if len == 0 {
            return data.len();
        }
        if pos + 2 + len > data.len() {
            break;
        }
        pos += 2 + len;
    }
    pos
}

/// Bytes a [`StreamReader`] reads at a time by default.
pub const STREAM_CHUNK: usize = 8 << 20;

/// Smallest chunk of a [`StreamReader`]: the records [`detect`] examines must fit in the first
/// (no ITCH message is longer than 64 bytes).
pub const MIN_CHUNK: usize = DETECT_RECORDS * (2 + 64);

/// Reads the records of a BinaryFILE stream chunk by chunk: a file, or a gzip or packet
/// capture through [`crate::capture::open`]. Memory is one chunk (grown only for a record
/// longer than it) whatever the stream's size, and the records, bad ones and counters are
/// those a [`Reader`] over the whole stream gives.
#[derive(Debug)]
pub struct StreamReader<R> {
    input: R,
    buf: Vec<u8>,
    /// Records not handed out yet are `buf[pos..end]`; `buf[end..filled]` starts a record
    /// the chunk cut.
    pos: usize,
    end: usize,
    filled: usize,
    eof: bool,
    /// Reading stopped at a record after which there is no next one to find.
    stopped: bool,
    framing: Option<Framing>,
    counters: ReaderCounters,
    /// Bytes of the stream before `buf[0]`.
    offset: u64,
}

impl<R: Read> StreamReader<R> {
    /// A reader of `input` in [`STREAM_CHUNK`] pieces.
    pub fn new(input: R) -> Self {
        Self::with_chunk(input, STREAM_CHUNK)
    }

    /// A reader of `input` in `chunk`-byte pieces (at least [`MIN_CHUNK`]).
    pub fn with_chunk(input: R, chunk: usize) -> Self {
        Self {
            input,
            buf: vec![0; chunk.max(MIN_CHUNK)],
            pos: 0,
            end: 0,
            filled: 0,
            eof: false,
            stopped: false,
            framing: None,
            counters: ReaderCounters::default(),
            offset: 0,
        }
    }

    /// The framing, once the first chunk was read.
    pub fn framing(&self) -> Option<Framing> {
        self.framing
    }

    /// Totals so far.
    pub fn counters(&self) -> &ReaderCounters {
        &self.counters
    }

    /// Bytes of the stream consumed so far.
    pub fn position(&self) -> u64 {
        self.offset + self.pos as u64
    }

    /// The input, e.g. to ask a [`crate::capture::CaptureReader`] for its report.
    pub fn get_ref(&self) -> &R {
        &self.input
    }

    /// Reads the first chunk, if not yet, and gives the framing (`None` for an empty
    /// stream): a stream that is no BinaryFILE fails here rather than at the first records.
    pub fn start(&mut self) -> io::Result<Option<Framing>> {
        if self.framing.is_none() && self.pos == self.end {
            self.refill()?;
        }
        Ok(self.framing)
    }

    /// Hands up to `max` records to `f`, in order, and returns how many: 0 only at the end.
    /// Errors are the input's, and [`io::ErrorKind::InvalidData`] for a stream that is no
    /// BinaryFILE ([`detect`]'s error).
    pub fn read_records(
        &mut self,
        max: usize,
        mut f: impl FnMut(Result<Message<'_>, BadRecord>),
    ) -> io::Result<usize> {
        self.try_read_records(max, |r| {
            f(r);
            ControlFlow::Continue(())
        })
    }

    /// Hands every remaining record to `f`.
    pub fn for_each(
        &mut self,
        mut f: impl FnMut(Result<Message<'_>, BadRecord>),
    ) -> io::Result<()> {
        while self.read_records(usize::MAX, &mut f)? > 0 {}
        Ok(())
    }

    /// Hands records to `f` until it breaks (after the record it broke on) or the stream
    /// ends.
    pub fn try_for_each(
        &mut self,
        mut f: impl FnMut(Result<Message<'_>, BadRecord>) -> ControlFlow<()>,
    ) -> io::Result<()> {
        let mut stop = false;
        while !stop
            && self.try_read_records(usize::MAX, |r| {
                let flow = f(r);
                stop = flow.is_break();
                flow
            })? > 0
        {}
        Ok(())
    }

    /// Hands up to `max` records to `f`, fewer if it breaks (after the record it broke on),
    /// and returns how many: 0 only at the end.
    pub fn try_read_records(
        &mut self,
        max: usize,
        mut f: impl FnMut(Result<Message<'_>, BadRecord>) -> ControlFlow<()>,
    ) -> io::Result<usize> {
        if self.pos == self.end {
            self.refill()?;
        }
        let Some(framing) = self.framing else {
            return Ok(0);
        };
        let base = self.offset as usize + self.pos;
        let mut r = Reader::with_framing(&self.buf[self.pos..self.end], framing);
        r.base = base;
        let mut n = 0;
        for record in r.by_ref().take(max) {
            n += 1;
            if f(record).is_break() {
                break;
            }
        }
        let c = r.counters();
        let stopped = c.unread_bytes > 0;
        self.counters.messages += c.messages;
        self.counters.bad_records += c.bad_records;
        self.counters.unknown_types += c.unknown_types;
        self.counters.length_mismatches += c.length_mismatches;
        self.counters.unread_bytes += c.unread_bytes;
        self.pos += r.position();
        if stopped {
            // As a reader over the whole stream would: the rest is unread.
            self.stop()?;
        }
        Ok(n)
    }

    /// Counts what is left of the stream as unread and ends it.
    fn stop(&mut self) -> io::Result<()> {
        let copied = io::copy(&mut self.input, &mut io::sink())?;
        self.counters.unread_bytes += (self.filled - self.pos) as u64 + copied;
        self.offset += self.filled as u64 + copied;
        self.pos = 0;
        self.end = 0;
        self.filled = 0;
        self.eof = true;
        self.stopped = true;
        Ok(())
    }

    /// Moves the cut record to the front and reads until the chunk is full or the input ends.
    fn refill(&mut self) -> io::Result<()> {
        if self.stopped {
            return Ok(());
        }
        loop {
            self.buf.copy_within(self.end..self.filled, 0);
            self.offset += self.end as u64;
            self.filled -= self.end;
            self.pos = 0;
            self.end = 0;
            while !self.eof && self.filled < self.buf.len() {
                match self.input.read(&mut self.buf[self.filled..]) {
                    Ok(0) => self.eof = true,
                    Ok(n) => self.filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            let data = &self.buf[..self.filled];
            if data.is_empty() {
                return Ok(());
            }
            let framing = match self.framing {
                Some(f) => f,
                None => *self.framing.insert(
                    detect(data).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
                ),
            };
            self.end = if self.eof {
                self.filled
            } else {
                whole_records(data, framing)
            };
            if self.end > 0 {
                return Ok(());
            }
            // A record longer than the chunk: a larger chunk.
            let size = self.buf.len() * 2;
            self.buf.resize(size, 0);
        }
    }
}

/// Appends one length-prefixed record (`message` is one encoded ITCH message).
pub fn push_record(out: &mut Vec<u8>, message: &[u8]) {
    let len = u16::try_from(message.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&message[..usize::from(len)]);
}

/// Writes one length-prefixed record.
pub fn write_record<W: Write>(w: &mut W, message: &[u8]) -> io::Result<()> {
    let len = u16::try_from(message.len()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "ITCH message longer than 65535 bytes",
        )
    })?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const SYSTEM_EVENT: [u8; 12] = [b'S', 0, 0, 0, 1, 0, 0, 0, 0, 0, 9, b'O'];
    #[rustfmt::skip]
    const DELETE: [u8; 19] = [b'D', 0, 1, 0, 2, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 42];

    #[test]
    fn length_prefixed_reads_and_counts_bad_records() {
        let mut f = Vec::new();
        push_record(&mut f, &SYSTEM_EVENT);
        // A 'D' framed with one byte too many: length contradicts the type.
        let mut long = DELETE.to_vec();
        long.push(0);
        push_record(&mut f, &long);
        // An unknown type.
        push_record(&mut f, &[b'z', 1, 2, 3]);
        push_record(&mut f, &DELETE);
        let mut r = Reader::new(&f).expect("detects");
        assert_eq!(r.framing(), Framing::LengthPrefixed);
        let out: Vec<_> = r.by_ref().collect();
        assert_eq!(out.len(), 4);
        assert!(matches!(out[0], Ok(Message::SystemEvent(_))));
        assert_eq!(
            out[1],
            Err(BadRecord {
                offset: 14,
                error: RecordError::Decode(DecodeError::LengthMismatch {
                    message_type: b'D',
                    expected: 19,
                    got: 20
                })
            })
        );
        assert!(matches!(
            out[2],
            Err(BadRecord {
                error: RecordError::Decode(DecodeError::UnknownType(b'z')),
                ..
            })
        ));
        assert!(
            matches!(out[3], Ok(Message::OrderDelete(d)) if d.order_reference_number.get() == 42)
        );
        assert_eq!(
            *r.counters(),
            ReaderCounters {
                messages: 2,
                bad_records: 2,
                unknown_types: 1,
                length_mismatches: 1,
                unread_bytes: 0
            }
        );
    }

    #[test]
    fn truncated_tail_is_counted() {
        let mut f = Vec::new();
        push_record(&mut f, &SYSTEM_EVENT);
        push_record(&mut f, &DELETE);
        f.truncate(f.len() - 3);
        let mut r = Reader::new(&f).expect("detects");
        assert!(r.next().expect("first").is_ok());
        assert_eq!(
            r.next(),
            Some(Err(BadRecord {
                offset: 14,
                error: RecordError::Truncated { need: 19, have: 16 }
            }))
        );
        assert_eq!(r.next(), None);
        assert_eq!(r.counters().unread_bytes, 18);
    }

    #[test]
    fn zero_prefixed_file_uses_type_sizes() {
        let mut f = Vec::new();
        for m in [&SYSTEM_EVENT[..], &DELETE, &DELETE, &SYSTEM_EVENT] {
            f.extend_from_slice(&[0, 0]);
            f.extend_from_slice(m);
        }
        let mut r = Reader::new(&f).expect("detects");
        assert_eq!(r.framing(), Framing::ZeroPrefixed);
        let types: Vec<u8> = r.by_ref().map(|m| m.expect("ok").message_type()).collect();
        assert_eq!(types, b"SDDS");
        assert_eq!(r.counters().bad_records, 0);
    }

    #[test]
    fn zero_prefix_that_is_not_type_sized_is_rejected() {
        // First prefix zero, then garbage: neither framing fits.
        let f = [0u8, 0, b'S', 0, 0, 0, 1, 0, 0, 0, 0, 0, 9, b'O', 0, 5, b'z'];
        assert_eq!(detect(&f), Err(DetectError::Unrecognized { offset: 14 }));
        // Truncated short files never panic.
        for n in 0..f.len() {
            if let Ok(r) = Reader::new(&f[..n]) {
                r.for_each(drop);
            }
        }
    }

    #[test]
    fn packet_captures_and_compressed_files_are_refused() {
        // Headers as tcpdump (microsecond, nanosecond and Kuznetsov's modified pcap, either
        // byte order), pcapng and gzip write them, each followed by bytes that would read as
        // a record if the magic were taken for a length prefix.
        let mut tail = Vec::new();
        push_record(&mut tail, &SYSTEM_EVENT);
        let read_by_capture = "feed_handler::capture";
        for (magic, format, hint) in [
            (&[0xd4, 0xc3, 0xb2, 0xa1][..], "pcap", read_by_capture),
            (&[0xa1, 0xb2, 0xc3, 0xd4], "pcap", read_by_capture),
            (
                &[0x4d, 0x3c, 0xb2, 0xa1],
                "pcap (nanosecond)",
                read_by_capture,
            ),
            (
                &[0xa1, 0xb2, 0x3c, 0x4d],
                "pcap (nanosecond)",
                read_by_capture,
            ),
            (&[0x34, 0xcd, 0xb2, 0xa1], "modified pcap", read_by_capture),
            (
                &[0xa1, 0xb2, 0xcd, 0x34],
                "big-endian modified pcap",
                "editcap",
            ),
            (&[0x0a, 0x0d, 0x0d, 0x0a], "pcapng", read_by_capture),
            (&[0x1f, 0x8b, 0x08], "gzip", read_by_capture),
            (&[0x28, 0xb5, 0x2f, 0xfd], "zstd-compressed", "decompress"),
            (b"BZh", "bzip2-compressed", "decompress"),
            (
                &[0xfd, b'7', b'z', b'X', b'Z', 0],
                "xz-compressed",
                "decompress",
            ),
            (b"PK\x03\x04", "zip", "decompress"),
        ] {
            let mut f = magic.to_vec();
            f.extend_from_slice(&tail);
            let e = detect(&f).expect_err(format);
            assert!(
                matches!(e, DetectError::OtherFormat(m) if m.name == format),
                "{e}"
            );
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("this is a {format} file: ")),
                "{msg}"
            );
            assert!(msg.contains(hint), "{msg}");
            assert!(Reader::new(&f).is_err());
        }
        // Whatever capture reads or refuses by its magic, detect refuses too.
        for m in capture::MAGIC_NUMBERS {
            let mut f = m.bytes.to_vec();
            f.extend_from_slice(&tail);
            assert_eq!(detect(&f), Err(DetectError::OtherFormat(m)));
        }
        // A real capture's first record is unaffected.
        assert_eq!(detect(&tail), Ok(Framing::LengthPrefixed));
    }

    #[test]
    fn detect_sees_its_records_in_a_stream_s_first_chunk() {
        let longest = (0..=255u8).filter_map(itch::message_size).max().unwrap();
        assert!(DETECT_RECORDS * (2 + longest) <= MIN_CHUNK);
    }

    #[test]
    fn zero_length_in_prefixed_file_stops_with_error() {
        let mut f = Vec::new();
        push_record(&mut f, &SYSTEM_EVENT);
        f.extend_from_slice(&[0, 0, 0, 0]);
        let mut r = Reader::new(&f).expect("detects");
        assert!(r.next().expect("first").is_ok());
        assert_eq!(
            r.next(),
            Some(Err(BadRecord {
                offset: 14,
                error: RecordError::ZeroLength
            }))
        );
        assert_eq!(r.next(), None);
    }
}
