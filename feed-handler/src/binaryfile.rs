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
use std::io::{self, Write};
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
        let bad = BadRecord { offset, error };
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
