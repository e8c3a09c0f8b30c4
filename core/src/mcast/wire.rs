//! Wire formats of the market-data path: the multicast datagram and the
//! recovery messages exchanged over RC.
//!
//! # Byte order
//! Every multi-byte field is **little-endian**. These are our own frames, read
//! and written only by rocebus on x86_64 and aarch64 hosts, which are both
//! little-endian: a field access compiles to a plain load. Exchange protocols
//! (ITCH, MoldUDP64) keep their big-endian order; they travel *inside* our
//! messages untouched.
//!
//! # Datagram layout
//! ```text
//! offset  size  field
//!      0     2  magic      0x4252 ("RB" on the wire)
//!      2     1  version    1
//!      3     1  line       0 = A, 1 = B (informational, see below)
//!      4     2  channel
//!      6     2  count      number of messages; 0 = heartbeat
//!      8     8  session    publisher session, strictly greater after a restart
//!     16     8  first_seq  sequence of the first message (sequences start at 1)
//!     24     …  messages:  u16 length, then `length` bytes, repeated `count` times
//! ```
//! Messages are packed back to back with no padding: a 64-byte message costs
//! 66 bytes instead of the 72 that 8-byte alignment would cost, and every view
//! in this crate (and in zerocopy-based application decoders) uses byte-order
//! types of alignment 1, so nothing ever needs an aligned address. The datagram
//! ends exactly after the last message: trailing bytes are a malformed datagram.
//!
//! # Fragment datagrams (version 2)
//! A message too large for one datagram is cut into fragments, each sent as
//! its own datagram with [`FRAGMENT_VERSION`] in the version byte and the
//! same header otherwise. Each fragment takes one sequence number, so gap
//! detection, A/B arbitration and retransmission work per fragment exactly
//! as for any datagram. Its body is one message (`count` must be 1) whose
//! bytes start with a [`FragmentHeader`]:
//! ```text
//! offset  size  field
//!      0     4  total_len  length of the whole (reassembled) message
//!      4     4  offset     where this fragment's bytes go in it
//!      8     …  the fragment's bytes (at least one)
//! ```
//! The parser checks `offset + bytes <= total_len`; whether a fragment
//! continues the message being reassembled is the subscriber's
//! [`super::fragment::Reassembler`]'s business. A version-1-only decoder
//! rejects these datagrams as [`WireError::BadVersion`]. Messages that fit
//! one datagram are sent exactly as before (version 1), so small messages
//! do not pay for fragmentation.
//!
//! A heartbeat (count 0) carries the sequence the publisher will assign next:
//! it lets a subscriber detect the loss of the last datagram of a burst.
//!
//! The `line` byte records the line the publisher meant; the subscriber
//! arbitrates on the line the I/O layer received the datagram on (it knows the
//! queue pair), so one history buffer can be sent on both lines unchanged.
//!
//! # Recovery messages
//! Every recovery message starts with a 24-byte [`RecoveryHeader`] whose `len`
//! covers the whole message, so several messages can share one RC buffer.
//!
//! # Recovery admission
//! The recovery connection is admitted by [`crate::auth`]'s challenge-response,
//! carried in rdma_cm private data and the connection's first message:
//! the subscriber's connect request carries a [`Hello`] (24 bytes, within the
//! 56 a connect request can carry) with its nonce; the publisher's accept
//! carries a [`Welcome`] (72 bytes): what the subscriber must filter
//! datagrams by (the publisher's session, UD queue pair and GID), the
//! publisher's nonce and its proof over both; the subscriber's first message
//! on the connection is an [`RecoveryKind::AuthProof`] with its own proof.
//! The proofs cover the Hello and the Welcome up to the nonce, so the
//! announced session, QPN and GID cannot be altered unnoticed. The publisher
//! serves nothing on a connection before its proof checked.

use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Magic of a datagram header, `b"RB"` read as a little-endian u16.
pub const DATAGRAM_MAGIC: u16 = u16::from_le_bytes(*b"RB");
/// Magic of a recovery message header, `b"RR"` read as a little-endian u16.
pub const RECOVERY_MAGIC: u16 = u16::from_le_bytes(*b"RR");
/// Wire version of both formats.
pub const VERSION: u8 = 1;
/// Version byte of a fragment datagram (see the module documentation).
pub const FRAGMENT_VERSION: u8 = 2;
/// Size of [`FragmentHeader`].
pub const FRAGMENT_HEADER_LEN: usize = 8;
/// Size of [`DatagramHeader`].
pub const DATAGRAM_HEADER_LEN: usize = 24;
/// Size of the length prefix in front of each message.
pub const MSG_PREFIX_LEN: usize = 2;
/// Size of [`RecoveryHeader`].
pub const RECOVERY_HEADER_LEN: usize = 24;

/// Which of the two redundant multicast lines a datagram came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Line {
    /// Line A (primary group).
    A = 0,
    /// Line B (secondary group, same stream).
    B = 1,
}

impl Line {
    /// Decodes the header's line byte.
    pub fn from_u8(v: u8) -> Option<Line> {
        match v {
            0 => Some(Line::A),
            1 => Some(Line::B),
            _ => None,
        }
    }
}

/// Header in front of every multicast datagram (little-endian view).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub struct DatagramHeader {
    /// [`DATAGRAM_MAGIC`].
    pub magic: U16,
    /// [`VERSION`].
    pub version: u8,
    /// [`Line`] as u8.
    pub line: u8,
    /// Channel id.
    pub channel: U16,
    /// Number of messages that follow; 0 for a heartbeat.
    pub count: U16,
    /// Publisher session; a restarted publisher uses a greater value.
    pub session: U64,
    /// Sequence of the first message (of the next message for a heartbeat).
    pub first_seq: U64,
}
const _: () = assert!(core::mem::size_of::<DatagramHeader>() == DATAGRAM_HEADER_LEN);

/// Header of a fragment, at the start of the one message of a fragment
/// datagram (little-endian view).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub struct FragmentHeader {
    /// Length of the whole message.
    pub total_len: U32,
    /// Offset of this fragment's bytes in the message.
    pub offset: U32,
}
const _: () = assert!(core::mem::size_of::<FragmentHeader>() == FRAGMENT_HEADER_LEN);

/// One fragment of a large message, from a validated fragment datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment<'a> {
    /// The fragment's sequence.
    pub seq: u64,
    /// Length of the whole message.
    pub total_len: u32,
    /// Offset of `bytes` in the message.
    pub offset: u32,
    /// The fragment's bytes (non-empty, `offset + len <= total_len`).
    pub bytes: &'a [u8],
}

/// Why bytes were rejected by a decoder. Small and `Copy`: decoders run per
/// datagram and the caller only counts the drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the fixed part requires.
    #[error("truncated: need {needed} bytes, got {got}")]
    Truncated {
        /// Bytes required.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// Unknown magic.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// Unsupported version.
    #[error("unsupported version {0}")]
    BadVersion(u8),
    /// Line byte is neither A nor B.
    #[error("bad line {0}")]
    BadLine(u8),
    /// A message length prefix runs past the end of the datagram.
    #[error("message {index} overruns the datagram")]
    MessageOverrun {
        /// Index of the offending message.
        index: u16,
    },
    /// Bytes left after the last message.
    #[error("{0} trailing bytes after the last message")]
    TrailingBytes(usize),
    /// Unknown recovery message kind.
    #[error("unknown recovery message kind {0}")]
    BadKind(u8),
    /// The recovery header's length is inconsistent with its kind or the buffer.
    #[error("bad recovery message length {0}")]
    BadLength(u32),
    /// A sequence range that would overflow u64.
    #[error("sequence range overflows")]
    SeqOverflow,
    /// A fragment datagram whose count is not 1, that is too short for its
    /// fragment header or empty, or whose bytes run past its total length.
    #[error("malformed fragment")]
    BadFragment,
}

/// An encoder was handed a buffer too small for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("buffer too small: need {needed} bytes, have {have}")]
pub struct BufferTooSmall {
    /// Bytes required.
    pub needed: usize,
    /// Bytes provided.
    pub have: usize,
}

/// A validated datagram: the header has been checked and the messages walked
/// once, so iteration cannot fail.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    header: &'a DatagramHeader,
    body: &'a [u8],
}

impl<'a> Datagram<'a> {
    /// Validates `bytes` as one complete datagram (GRH already stripped).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, WireError> {
        let (header, body) =
            DatagramHeader::ref_from_prefix(bytes).map_err(|_| WireError::Truncated {
                needed: DATAGRAM_HEADER_LEN,
                got: bytes.len(),
            })?;
        if header.magic.get() != DATAGRAM_MAGIC {
            return Err(WireError::BadMagic(header.magic.get()));
        }
        if header.version != VERSION && header.version != FRAGMENT_VERSION {
            return Err(WireError::BadVersion(header.version));
        }
        if Line::from_u8(header.line).is_none() {
            return Err(WireError::BadLine(header.line));
        }
        let count = header.count.get();
        if header
            .first_seq
            .get()
            .checked_add(u64::from(count))
            .is_none()
        {
            return Err(WireError::SeqOverflow);
        }
        let mut rest = body;
        for index in 0..count {
            let Some((len, tail)) = split_len(rest) else {
                return Err(WireError::MessageOverrun { index });
            };
            rest = tail.get(len..).ok_or(WireError::MessageOverrun { index })?;
        }
        if !rest.is_empty() {
            return Err(WireError::TrailingBytes(rest.len()));
        }
        let d = Datagram { header, body };
        if header.version == FRAGMENT_VERSION && (count != 1 || d.fragment_parts().is_none()) {
            return Err(WireError::BadFragment);
        }
        Ok(d)
    }

    /// True for a fragment datagram (one fragment of a large message).
    pub fn is_fragment(&self) -> bool {
        self.header.version == FRAGMENT_VERSION
    }

    /// The fragment a fragment datagram carries; `None` for any other
    /// datagram.
    pub fn fragment(&self) -> Option<Fragment<'a>> {
        if !self.is_fragment() {
            return None;
        }
        let (total_len, offset, bytes) = self.fragment_parts()?;
        Some(Fragment {
            seq: self.first_seq(),
            total_len,
            offset,
            bytes,
        })
    }

    fn fragment_parts(&self) -> Option<(u32, u32, &'a [u8])> {
        let (_, msg) = self.messages().next()?;
        let (h, bytes) = FragmentHeader::ref_from_prefix(msg).ok()?;
        let (total, offset) = (h.total_len.get(), h.offset.get());
        let end = u64::from(offset) + bytes.len() as u64;
        (!bytes.is_empty() && end <= u64::from(total)).then_some((total, offset, bytes))
    }

    /// The header.
    pub fn header(&self) -> &'a DatagramHeader {
        self.header
    }
    /// Channel id.
    pub fn channel(&self) -> u16 {
        self.header.channel.get()
    }
    /// Publisher session.
    pub fn session(&self) -> u64 {
        self.header.session.get()
    }
    /// Sequence of the first message.
    pub fn first_seq(&self) -> u64 {
        self.header.first_seq.get()
    }
    /// Number of messages.
    pub fn count(&self) -> u16 {
        self.header.count.get()
    }
    /// One past the last message's sequence.
    pub fn end_seq(&self) -> u64 {
        // Cannot overflow: checked in parse().
        self.first_seq() + u64::from(self.count())
    }
    /// True for a heartbeat (no messages).
    pub fn is_heartbeat(&self) -> bool {
        self.count() == 0
    }
    /// Messages with their sequences, in order.
    pub fn messages(&self) -> Messages<'a> {
        Messages {
            rest: self.body,
            seq: self.first_seq(),
            left: self.count(),
        }
    }
}

/// The same 24 bytes as [`DatagramHeader`], as three little-endian words:
/// magic, version, line, channel and count in the first, for
/// [`OneMessageHeader`]'s compares.
#[derive(FromBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct HeaderWords {
    head: U64,
    session: U64,
    first_seq: U64,
}
const _: () = assert!(core::mem::size_of::<HeaderWords>() == DATAGRAM_HEADER_LEN);

/// The header a subscriber expects in front of a datagram carrying one
/// message (a latency-bound publisher's usual datagram), prebuilt from its
/// channel and session: [`match_datagram`](Self::match_datagram) checks a
/// datagram against it with two compares of the header, where
/// [`Datagram::parse`] and the caller's channel and session checks take a
/// dozen. It accepts only datagrams that `parse` accepts with this channel
/// and session, and answers `None` for everything else, which the caller
/// then takes through `parse` (to drop and count it by its reason, or to
/// take a heartbeat, a batch or a fragment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneMessageHeader {
    /// The first header word with the line byte 0: magic, version 1,
    /// channel, count 1.
    head: u64,
    session: u64,
}

impl OneMessageHeader {
    /// The line byte's low bit, which is masked out: line A (0) and B (1)
    /// both match, any other value does not.
    const LINE_BIT: u64 = 1 << 24;

    /// The header of a one-message datagram of `channel` and `session`.
    pub fn new(channel: u16, session: u64) -> Self {
        let head = u64::from(DATAGRAM_MAGIC)
            | u64::from(VERSION) << 16
            | u64::from(channel) << 32
            | 1 << 48;
        OneMessageHeader { head, session }
    }

    /// The sequence and the message of `bytes` if it is a version-1
    /// datagram of this channel and session (line A or B) holding exactly
    /// one message that ends where `bytes` ends; `None` otherwise.
    pub fn match_datagram<'a>(&self, bytes: &'a [u8]) -> Option<(u64, &'a [u8])> {
        let (h, body) = HeaderWords::ref_from_prefix(bytes).ok()?;
        let (len, msg) = U16::ref_from_prefix(body).ok()?;
        let seq = h.first_seq.get();
        // seq + 1 must not overflow, as parse checks.
        (h.head.get() & !Self::LINE_BIT == self.head
            && h.session.get() == self.session
            && usize::from(len.get()) == msg.len()
            && seq != u64::MAX)
            .then_some((seq, msg))
    }
}

fn split_len(bytes: &[u8]) -> Option<(usize, &[u8])> {
    let (len, tail) = U16::ref_from_prefix(bytes).ok()?;
    Some((usize::from(len.get()), tail))
}

/// Iterator over `(seq, message)` of a validated [`Datagram`].
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    rest: &'a [u8],
    seq: u64,
    left: u16,
}

impl<'a> Iterator for Messages<'a> {
    type Item = (u64, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        // The datagram was validated; the checked accessors only make a
        // hypothetical inconsistency end the iteration instead of panicking.
        let (len, tail) = split_len(self.rest)?;
        let msg = tail.get(..len)?;
        self.rest = tail.get(len..)?;
        let seq = self.seq;
        self.seq += 1;
        self.left -= 1;
        Some((seq, msg))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::from(self.left), Some(usize::from(self.left)))
    }
}

/// Writes a datagram header into the first [`DATAGRAM_HEADER_LEN`] bytes of `out`.
pub fn write_datagram_header(
    out: &mut [u8],
    line: Line,
    channel: u16,
    session: u64,
    first_seq: u64,
    count: u16,
) -> Result<(), BufferTooSmall> {
    let have = out.len();
    let (h, _) = DatagramHeader::mut_from_prefix(out).map_err(|_| BufferTooSmall {
        needed: DATAGRAM_HEADER_LEN,
        have,
    })?;
    *h = DatagramHeader {
        magic: U16::new(DATAGRAM_MAGIC),
        version: VERSION,
        line: line as u8,
        channel: U16::new(channel),
        count: U16::new(count),
        session: U64::new(session),
        first_seq: U64::new(first_seq),
    };
    Ok(())
}

/// Marks an encoded datagram (header written) as a fragment datagram.
/// Returns false if `datagram` is shorter than a header.
pub fn set_fragment_version(datagram: &mut [u8]) -> bool {
    match DatagramHeader::mut_from_prefix(datagram) {
        Ok((h, _)) => {
            h.version = FRAGMENT_VERSION;
            true
        }
        Err(_) => false,
    }
}

/// Rewrites the line byte of an encoded datagram (for a publisher that sends a
/// separate copy on line B). Returns false if `datagram` is shorter than a header.
pub fn set_line(datagram: &mut [u8], line: Line) -> bool {
    match DatagramHeader::mut_from_prefix(datagram) {
        Ok((h, _)) => {
            h.line = line as u8;
            true
        }
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------
// Recovery messages (RC, reliable and ordered)
// ---------------------------------------------------------------------------

/// Kinds of recovery messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecoveryKind {
    /// Subscriber → publisher: resend a range.
    RetransmitRequest = 1,
    /// Publisher → subscriber: one original datagram.
    RetransmitData = 2,
    /// Publisher → subscriber: part of a range is no longer in the history.
    NotAvailable = 3,
    /// Subscriber → snapshot server: send a snapshot.
    SnapshotRequest = 4,
    /// Snapshot server → subscriber: a piece of the snapshot.
    SnapshotChunk = 5,
    /// Snapshot server → subscriber: the snapshot is complete.
    SnapshotEnd = 6,
    /// Subscriber → publisher, first message of a connection: the
    /// initiator's proof of the shared secret.
    AuthProof = 7,
    /// Subscriber → publisher, periodically: where it stands.
    SubscriberStatus = 8,
}

impl RecoveryKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::RetransmitRequest,
            2 => Self::RetransmitData,
            3 => Self::NotAvailable,
            4 => Self::SnapshotRequest,
            5 => Self::SnapshotChunk,
            6 => Self::SnapshotEnd,
            7 => Self::AuthProof,
            8 => Self::SubscriberStatus,
            _ => return None,
        })
    }
}

/// Header of every recovery message (little-endian view).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub struct RecoveryHeader {
    /// [`RECOVERY_MAGIC`].
    pub magic: U16,
    /// [`VERSION`].
    pub version: u8,
    /// [`RecoveryKind`] as u8.
    pub kind: u8,
    /// Channel id.
    pub channel: U16,
    /// Zero.
    pub reserved: U16,
    /// Length of the whole message, this header included.
    pub len: U32,
    /// Zero.
    pub reserved2: U32,
    /// Publisher session the message refers to (0 = unknown, in a first
    /// snapshot request).
    pub session: U64,
}
const _: () = assert!(core::mem::size_of::<RecoveryHeader>() == RECOVERY_HEADER_LEN);

/// Body of a retransmit request.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct RangeBody {
    from_seq: U64,
    count: U64,
}
const _: () = assert!(core::mem::size_of::<RangeBody>() == 16);

/// Body of a not-available answer.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct NotAvailableBody {
    from_seq: U64,
    count: U64,
    oldest_available: U64,
}
const _: () = assert!(core::mem::size_of::<NotAvailableBody>() == 24);

/// Fixed part of a snapshot chunk; the data follows.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct ChunkBody {
    snapshot_seq: U64,
    offset: U64,
}
const _: () = assert!(core::mem::size_of::<ChunkBody>() == 16);

/// Body of a snapshot end.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct EndBody {
    snapshot_seq: U64,
    total_len: U64,
    crc32: U32,
    reserved: U32,
}
const _: () = assert!(core::mem::size_of::<EndBody>() == 24);

/// Body of a subscriber status.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct StatusBody {
    next_seq: U64,
    msgs_per_sec: U64,
    requests: U64,
}
const _: () = assert!(core::mem::size_of::<StatusBody>() == 24);

/// Subscriber → publisher, every `recovery.status_interval_ns`: how far it
/// has delivered and how fast it receives. Outside input to the publisher:
/// it is shown and compared, never trusted for anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriberStatus {
    /// Channel id.
    pub channel: u16,
    /// Publisher session the position refers to (0 before one is known).
    pub session: u64,
    /// Next sequence the subscriber will deliver (everything before it was
    /// delivered or given up on).
    pub next_seq: u64,
    /// Messages delivered per second over the last interval.
    pub msgs_per_sec: u64,
    /// Retransmit requests it has sent so far.
    pub requests: u64,
}

impl SubscriberStatus {
    /// Encoded size.
    pub const LEN: usize = RECOVERY_HEADER_LEN + 24;

    /// Encodes into `out`, returning the bytes written.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let body = StatusBody {
            next_seq: U64::new(self.next_seq),
            msgs_per_sec: U64::new(self.msgs_per_sec),
            requests: U64::new(self.requests),
        };
        encode_parts(
            out,
            RecoveryKind::SubscriberStatus,
            self.channel,
            self.session,
            body.as_bytes(),
            &[],
        )
    }
}

/// Subscriber → publisher: resend messages `[from_seq, from_seq + count)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetransmitRequest {
    /// Channel id.
    pub channel: u16,
    /// Publisher session the sequences belong to.
    pub session: u64,
    /// First missing sequence.
    pub from_seq: u64,
    /// Number of messages.
    pub count: u64,
}

/// Publisher → subscriber: `[from_seq, from_seq + count)` cannot be served in
/// full; nothing older than `oldest_available` is kept. Two meanings, told
/// apart by where the range starts: below `oldest_available`, the range is
/// older than the history (lost); at or above it, the range is beyond what
/// the publisher ever sent, `from_seq` its end (never published: nothing
/// lost, a heartbeat ahead of the stream made the subscriber ask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAvailable {
    /// Channel id.
    pub channel: u16,
    /// Publisher session.
    pub session: u64,
    /// First sequence of the unavailable part.
    pub from_seq: u64,
    /// Number of unavailable messages.
    pub count: u64,
    /// Oldest sequence still in the publisher's history.
    pub oldest_available: u64,
}

/// Snapshot server → subscriber: the snapshot is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotEnd {
    /// Channel id.
    pub channel: u16,
    /// Publisher session.
    pub session: u64,
    /// The snapshot reflects every message up to and including this sequence.
    pub snapshot_seq: u64,
    /// Total bytes of snapshot data sent in chunks.
    pub total_len: u64,
    /// CRC-32 (IEEE) of the concatenated chunk data.
    pub crc32: u32,
}

/// A decoded recovery message, borrowing its payload from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryMsg<'a> {
    /// See [`RetransmitRequest`].
    RetransmitRequest(RetransmitRequest),
    /// One original datagram, bytes exactly as multicast.
    RetransmitData {
        /// Channel id.
        channel: u16,
        /// Publisher session.
        session: u64,
        /// The datagram (validate with [`Datagram::parse`]).
        datagram: &'a [u8],
    },
    /// See [`NotAvailable`].
    NotAvailable(NotAvailable),
    /// Ask for a snapshot of `channel`.
    SnapshotRequest {
        /// Channel id.
        channel: u16,
        /// Session the requester knows (0 if none).
        session: u64,
    },
    /// A piece of a snapshot.
    SnapshotChunk {
        /// Channel id.
        channel: u16,
        /// Publisher session.
        session: u64,
        /// Sequence the snapshot is taken at.
        snapshot_seq: u64,
        /// Offset of `data` in the snapshot.
        offset: u64,
        /// The bytes.
        data: &'a [u8],
    },
    /// See [`SnapshotEnd`].
    SnapshotEnd(SnapshotEnd),
    /// See [`SubscriberStatus`].
    SubscriberStatus(SubscriberStatus),
    /// The subscriber's proof of the shared secret (see the module docs).
    AuthProof {
        /// Channel id.
        channel: u16,
        /// The tag.
        tag: [u8; crate::auth::TAG_LEN],
    },
}

/// Decodes the first recovery message in `bytes`; returns it and the number
/// of bytes it occupied.
pub fn decode_recovery(bytes: &[u8]) -> Result<(RecoveryMsg<'_>, usize), WireError> {
    let (h, _) = RecoveryHeader::ref_from_prefix(bytes).map_err(|_| WireError::Truncated {
        needed: RECOVERY_HEADER_LEN,
        got: bytes.len(),
    })?;
    if h.magic.get() != RECOVERY_MAGIC {
        return Err(WireError::BadMagic(h.magic.get()));
    }
    if h.version != VERSION {
        return Err(WireError::BadVersion(h.version));
    }
    let kind = RecoveryKind::from_u8(h.kind).ok_or(WireError::BadKind(h.kind))?;
    let len32 = h.len.get();
    let len = usize::try_from(len32).map_err(|_| WireError::BadLength(len32))?;
    if len < RECOVERY_HEADER_LEN {
        return Err(WireError::BadLength(len32));
    }
    let msg = bytes.get(..len).ok_or(WireError::Truncated {
        needed: len,
        got: bytes.len(),
    })?;
    let body = &msg[RECOVERY_HEADER_LEN..];
    let (channel, session) = (h.channel.get(), h.session.get());
    let exact = |need: usize| {
        if body.len() == need {
            Ok(())
        } else {
            Err(WireError::BadLength(len32))
        }
    };
    let decoded = match kind {
        RecoveryKind::RetransmitRequest => {
            exact(16)?;
            let b = RangeBody::read_from_bytes(body).map_err(|_| WireError::BadLength(len32))?;
            RecoveryMsg::RetransmitRequest(RetransmitRequest {
                channel,
                session,
                from_seq: b.from_seq.get(),
                count: b.count.get(),
            })
        }
        RecoveryKind::RetransmitData => RecoveryMsg::RetransmitData {
            channel,
            session,
            datagram: body,
        },
        RecoveryKind::NotAvailable => {
            exact(24)?;
            let b =
                NotAvailableBody::read_from_bytes(body).map_err(|_| WireError::BadLength(len32))?;
            RecoveryMsg::NotAvailable(NotAvailable {
                channel,
                session,
                from_seq: b.from_seq.get(),
                count: b.count.get(),
                oldest_available: b.oldest_available.get(),
            })
        }
        RecoveryKind::SnapshotRequest => {
            exact(0)?;
            RecoveryMsg::SnapshotRequest { channel, session }
        }
        RecoveryKind::SnapshotChunk => {
            let (b, data) =
                ChunkBody::ref_from_prefix(body).map_err(|_| WireError::BadLength(len32))?;
            RecoveryMsg::SnapshotChunk {
                channel,
                session,
                snapshot_seq: b.snapshot_seq.get(),
                offset: b.offset.get(),
                data,
            }
        }
        RecoveryKind::AuthProof => {
            exact(crate::auth::TAG_LEN)?;
            let tag = body.try_into().map_err(|_| WireError::BadLength(len32))?;
            RecoveryMsg::AuthProof { channel, tag }
        }
        RecoveryKind::SubscriberStatus => {
            exact(24)?;
            let b = StatusBody::read_from_bytes(body).map_err(|_| WireError::BadLength(len32))?;
            RecoveryMsg::SubscriberStatus(SubscriberStatus {
                channel,
                session,
                next_seq: b.next_seq.get(),
                msgs_per_sec: b.msgs_per_sec.get(),
                requests: b.requests.get(),
            })
        }
        RecoveryKind::SnapshotEnd => {
            exact(24)?;
            let b = EndBody::read_from_bytes(body).map_err(|_| WireError::BadLength(len32))?;
            RecoveryMsg::SnapshotEnd(SnapshotEnd {
                channel,
                session,
                snapshot_seq: b.snapshot_seq.get(),
                total_len: b.total_len.get(),
                crc32: b.crc32.get(),
            })
        }
    };
    Ok((decoded, len))
}

/// Writes header + fixed body + tail into `out`; returns the total length.
fn encode_parts(
    out: &mut [u8],
    kind: RecoveryKind,
    channel: u16,
    session: u64,
    fixed: &[u8],
    tail: &[u8],
) -> Result<usize, BufferTooSmall> {
    let len = RECOVERY_HEADER_LEN + fixed.len() + tail.len();
    let have = out.len();
    let too_small = BufferTooSmall { needed: len, have };
    let len32 = u32::try_from(len).map_err(|_| too_small)?;
    let dst = out.get_mut(..len).ok_or(too_small)?;
    let header = RecoveryHeader {
        magic: U16::new(RECOVERY_MAGIC),
        version: VERSION,
        kind: kind as u8,
        channel: U16::new(channel),
        reserved: U16::ZERO,
        len: U32::new(len32),
        reserved2: U32::ZERO,
        session: U64::new(session),
    };
    let (h, rest) = dst.split_at_mut(RECOVERY_HEADER_LEN);
    h.copy_from_slice(header.as_bytes());
    let (f, t) = rest.split_at_mut(fixed.len());
    f.copy_from_slice(fixed);
    t.copy_from_slice(tail);
    Ok(len)
}

impl RetransmitRequest {
    /// Encoded size.
    pub const LEN: usize = RECOVERY_HEADER_LEN + 16;

    /// Encodes into `out`, returning the bytes written.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let body = RangeBody {
            from_seq: U64::new(self.from_seq),
            count: U64::new(self.count),
        };
        encode_parts(
            out,
            RecoveryKind::RetransmitRequest,
            self.channel,
            self.session,
            body.as_bytes(),
            &[],
        )
    }
}

impl NotAvailable {
    /// Encoded size.
    pub const LEN: usize = RECOVERY_HEADER_LEN + 24;

    /// Encodes into `out`, returning the bytes written.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let body = NotAvailableBody {
            from_seq: U64::new(self.from_seq),
            count: U64::new(self.count),
            oldest_available: U64::new(self.oldest_available),
        };
        encode_parts(
            out,
            RecoveryKind::NotAvailable,
            self.channel,
            self.session,
            body.as_bytes(),
            &[],
        )
    }
}

impl SnapshotEnd {
    /// Encoded size.
    pub const LEN: usize = RECOVERY_HEADER_LEN + 24;

    /// Encodes into `out`, returning the bytes written.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let body = EndBody {
            snapshot_seq: U64::new(self.snapshot_seq),
            total_len: U64::new(self.total_len),
            crc32: U32::new(self.crc32),
            reserved: U32::ZERO,
        };
        encode_parts(
            out,
            RecoveryKind::SnapshotEnd,
            self.channel,
            self.session,
            body.as_bytes(),
            &[],
        )
    }
}

/// Encodes a retransmitted datagram; returns the bytes written.
pub fn encode_retransmit_data(
    out: &mut [u8],
    channel: u16,
    session: u64,
    datagram: &[u8],
) -> Result<usize, BufferTooSmall> {
    encode_parts(
        out,
        RecoveryKind::RetransmitData,
        channel,
        session,
        &[],
        datagram,
    )
}

/// Encodes a snapshot request (header only); returns the bytes written.
pub fn encode_snapshot_request(
    out: &mut [u8],
    channel: u16,
    session: u64,
) -> Result<usize, BufferTooSmall> {
    encode_parts(
        out,
        RecoveryKind::SnapshotRequest,
        channel,
        session,
        &[],
        &[],
    )
}

/// Size of an auth proof message.
pub const AUTH_PROOF_LEN: usize = RECOVERY_HEADER_LEN + crate::auth::TAG_LEN;

/// Encodes the subscriber's proof; returns the bytes written.
pub fn encode_auth_proof(
    out: &mut [u8],
    channel: u16,
    tag: &[u8; crate::auth::TAG_LEN],
) -> Result<usize, BufferTooSmall> {
    encode_parts(out, RecoveryKind::AuthProof, channel, 0, tag, &[])
}

/// Magic of a [`Hello`], `b"RH"`.
pub const HELLO_MAGIC: u16 = u16::from_le_bytes(*b"RH");
/// Magic of a [`Welcome`], `b"RW"`.
pub const WELCOME_MAGIC: u16 = u16::from_le_bytes(*b"RW");
/// Hello/Welcome flag: datagrams carry a tag.
pub const FLAG_DATAGRAM_TAG: u8 = 1;
/// Hello flag: the first proof covers the cookie of a
/// [`CookieReply`](crate::admission::CookieReply) the publisher handed out
/// under load (the cookie itself does not travel again: the publisher
/// recomputes it from the request's address and the time).
pub const FLAG_COOKIE: u8 = 2;

/// The subscriber's connect request private data (40 of the 56 bytes a
/// connect request carries).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub struct Hello {
    /// [`HELLO_MAGIC`].
    pub magic: U16,
    /// [`VERSION`].
    pub version: u8,
    /// [`FLAG_DATAGRAM_TAG`] if the subscriber expects tagged datagrams;
    /// [`FLAG_COOKIE`] if its proof covers a cookie.
    pub flags: u8,
    /// Channel id.
    pub channel: U16,
    /// Zero.
    pub reserved: U16,
    /// The initiator's nonce.
    pub nonce: [u8; crate::auth::NONCE_LEN],
    /// The initiator's first proof over the 24 bytes before it
    /// ([`HELLO_SIGNED_LEN`]): `MAC(K, "initiator first", nonce, those
    /// bytes, cookie)`, the cookie empty unless [`FLAG_COOKIE`] is set
    /// ([`crate::auth::Initiator::first_proof`]). The publisher
    /// checks it before it answers anything: without it a connect request is
    /// rejected with no private data (no Welcome: no proof, session, QPN or
    /// GID).
    pub proof: [u8; crate::auth::TAG_LEN],
}
const _: () = assert!(core::mem::size_of::<Hello>() == 40);

/// Bytes of a [`Hello`] its first proof covers (everything before it).
pub const HELLO_SIGNED_LEN: usize = 24;

/// The publisher's accept private data.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub struct Welcome {
    /// [`WELCOME_MAGIC`].
    pub magic: U16,
    /// [`VERSION`].
    pub version: u8,
    /// [`FLAG_DATAGRAM_TAG`] if the publisher tags its datagrams.
    pub flags: u8,
    /// Channel id.
    pub channel: U16,
    /// Zero.
    pub reserved: U16,
    /// The publisher's session.
    pub session: U64,
    /// The queue pair number the publisher multicasts from.
    pub qpn: U32,
    /// Zero.
    pub reserved2: U32,
    /// The GID the publisher multicasts from.
    pub gid: [u8; 16],
    /// The responder's nonce.
    pub nonce: [u8; crate::auth::NONCE_LEN],
    /// The responder's proof.
    pub tag: [u8; crate::auth::TAG_LEN],
}
const _: () = assert!(core::mem::size_of::<Welcome>() == 72);

/// Bytes of a [`Welcome`] its proofs cover (everything before the nonce).
pub const WELCOME_SIGNED_LEN: usize = 40;

impl Welcome {
    /// A publisher's identity: what it multicasts from, its channel and
    /// session, with the nonce and proof still zero (the recovery server
    /// fills them per handshake).
    pub fn identity(channel: u16, session: u64, tagged: bool, qpn: u32, gid: [u8; 16]) -> Self {
        Welcome {
            magic: WELCOME_MAGIC.into(),
            version: VERSION,
            flags: if tagged { FLAG_DATAGRAM_TAG } else { 0 },
            channel: channel.into(),
            reserved: 0.into(),
            session: session.into(),
            qpn: qpn.into(),
            reserved2: 0.into(),
            gid,
            nonce: [0; crate::auth::NONCE_LEN],
            tag: [0; crate::auth::TAG_LEN],
        }
    }

    /// The part the proofs cover.
    pub fn signed(&self) -> &[u8] {
        &self.as_bytes()[..WELCOME_SIGNED_LEN]
    }
}

/// Size of a snapshot chunk message carrying `data_len` bytes.
pub const fn snapshot_chunk_len(data_len: usize) -> usize {
    RECOVERY_HEADER_LEN + 16 + data_len
}

/// Encodes a snapshot chunk; returns the bytes written.
pub fn encode_snapshot_chunk(
    out: &mut [u8],
    channel: u16,
    session: u64,
    snapshot_seq: u64,
    offset: u64,
    data: &[u8],
) -> Result<usize, BufferTooSmall> {
    let body = ChunkBody {
        snapshot_seq: U64::new(snapshot_seq),
        offset: U64::new(offset),
    };
    encode_parts(
        out,
        RecoveryKind::SnapshotChunk,
        channel,
        session,
        body.as_bytes(),
        data,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Channel 7, session 0x0102030405060708, first_seq 42, two messages
    /// "abc" and "" on line B.
    static DATAGRAM_BYTES: [u8; 24 + 5 + 2] = [
        0x52, 0x42, // magic "RB"
        0x01, // version
        0x01, // line B
        0x07, 0x00, // channel 7
        0x02, 0x00, // count 2
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // session
        0x2a, 0, 0, 0, 0, 0, 0, 0, // first_seq 42
        0x03, 0x00, b'a', b'b', b'c', // message 42
        0x00, 0x00, // message 43, empty
    ];

    static FRAGMENT_BYTES: [u8; 24 + 2 + 8 + 3] = [
        0x52, 0x42, // magic "RB"
        0x02, // version 2: a fragment
        0x00, // line A
        0x07, 0x00, // channel 7
        0x01, 0x00, // count 1
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // session
        0x2a, 0, 0, 0, 0, 0, 0, 0, // seq 42
        0x0b, 0x00, // message length 11
        0x0a, 0x00, 0x00, 0x00, // total_len 10
        0x07, 0x00, 0x00, 0x00, // offset 7
        b'x', b'y', b'z', // the message's bytes 7..10
    ];

    #[test]
    fn fragment_fixed_bytes_and_bad_fragments() {
        let d = Datagram::parse(&FRAGMENT_BYTES).unwrap();
        assert!(d.is_fragment());
        assert_eq!(
            d.fragment(),
            Some(Fragment {
                seq: 42,
                total_len: 10,
                offset: 7,
                bytes: b"xyz"
            })
        );
        assert_eq!(Datagram::parse(&DATAGRAM_BYTES).unwrap().fragment(), None);
        // Bytes past the total.
        let mut b = FRAGMENT_BYTES;
        b[26] = 9;
        assert_eq!(Datagram::parse(&b).unwrap_err(), WireError::BadFragment);
        // An offset that overflows with the length.
        let mut b = FRAGMENT_BYTES;
        b[30..34].copy_from_slice(&u32::MAX.to_le_bytes());
        b[26..30].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Datagram::parse(&b).unwrap_err(), WireError::BadFragment);
        // No bytes, or no room for the fragment header.
        let mut b = FRAGMENT_BYTES[..24 + 2 + 8].to_vec();
        b[24] = 8;
        assert_eq!(Datagram::parse(&b).unwrap_err(), WireError::BadFragment);
        let mut b = FRAGMENT_BYTES[..24 + 2 + 4].to_vec();
        b[24] = 4;
        assert_eq!(Datagram::parse(&b).unwrap_err(), WireError::BadFragment);
        // A count other than 1.
        let mut b = FRAGMENT_BYTES.to_vec();
        b[6] = 2;
        b.extend_from_slice(&[0, 0]);
        assert_eq!(Datagram::parse(&b).unwrap_err(), WireError::BadFragment);
        // An unknown version stays a version error.
        let mut b = FRAGMENT_BYTES;
        b[2] = 3;
        assert_eq!(Datagram::parse(&b).unwrap_err(), WireError::BadVersion(3));
    }

    #[test]
    fn datagram_fixed_bytes() {
        let d = Datagram::parse(&DATAGRAM_BYTES).unwrap();
        assert_eq!(d.channel(), 7);
        assert_eq!(d.session(), 0x0102_0304_0506_0708);
        assert_eq!(d.first_seq(), 42);
        assert_eq!(d.count(), 2);
        assert_eq!(d.end_seq(), 44);
        assert_eq!(d.header().line, Line::B as u8);
        let msgs: Vec<_> = d.messages().collect();
        assert_eq!(msgs, vec![(42, &b"abc"[..]), (43, &b""[..])]);
    }

    #[test]
    fn datagram_header_encodes_to_fixed_bytes() {
        let mut out = [0u8; 24];
        write_datagram_header(&mut out, Line::B, 7, 0x0102_0304_0506_0708, 42, 2).unwrap();
        assert_eq!(out[..], DATAGRAM_BYTES[..24]);
        assert!(write_datagram_header(&mut out[..23], Line::A, 0, 0, 0, 0).is_err());
    }

    #[test]
    fn datagram_rejects_bad_input() {
        let mut b = DATAGRAM_BYTES;
        b[0] = 0;
        assert!(matches!(Datagram::parse(&b), Err(WireError::BadMagic(_))));
        let mut b = DATAGRAM_BYTES;
        b[2] = 9;
        assert_eq!(Datagram::parse(&b).unwrap_err(), WireError::BadVersion(9));
        let mut b = DATAGRAM_BYTES;
        b[3] = 2;
        assert_eq!(Datagram::parse(&b).unwrap_err(), WireError::BadLine(2));
        let mut b = DATAGRAM_BYTES;
        b[6] = 3; // count 3 but only two messages
        assert_eq!(
            Datagram::parse(&b).unwrap_err(),
            WireError::MessageOverrun { index: 2 }
        );
        let mut b = DATAGRAM_BYTES;
        b[24] = 200; // first message claims 200 bytes
        assert_eq!(
            Datagram::parse(&b).unwrap_err(),
            WireError::MessageOverrun { index: 0 }
        );
        let mut v = DATAGRAM_BYTES.to_vec();
        v.push(0);
        assert_eq!(
            Datagram::parse(&v).unwrap_err(),
            WireError::TrailingBytes(1)
        );
        let mut b = DATAGRAM_BYTES;
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(Datagram::parse(&b).unwrap_err(), WireError::SeqOverflow);
        for n in 0..DATAGRAM_BYTES.len() {
            assert!(Datagram::parse(&DATAGRAM_BYTES[..n]).is_err(), "prefix {n}");
        }
    }

    #[test]
    fn heartbeat_round_trip() {
        let mut out = [0u8; 24];
        write_datagram_header(&mut out, Line::A, 1, 9, 100, 0).unwrap();
        let d = Datagram::parse(&out).unwrap();
        assert!(d.is_heartbeat());
        assert_eq!(d.first_seq(), 100);
        assert_eq!(d.messages().count(), 0);
        let mut out2 = out;
        assert!(set_line(&mut out2, Line::B));
        assert_eq!(out2[3], 1);
    }

    /// RetransmitRequest{channel 7, session 5, from 0x10, count 3}.
    static RETRANSMIT_REQUEST_BYTES: [u8; 40] = [
        0x52, 0x52, // magic "RR"
        0x01, // version
        0x01, // kind RetransmitRequest
        0x07, 0x00, // channel
        0x00, 0x00, // reserved
        0x28, 0x00, 0x00, 0x00, // len 40
        0x00, 0x00, 0x00, 0x00, // reserved
        0x05, 0, 0, 0, 0, 0, 0, 0, // session
        0x10, 0, 0, 0, 0, 0, 0, 0, // from_seq
        0x03, 0, 0, 0, 0, 0, 0, 0, // count
    ];

    #[test]
    fn retransmit_request_fixed_bytes() {
        let req = RetransmitRequest {
            channel: 7,
            session: 5,
            from_seq: 0x10,
            count: 3,
        };
        let mut out = [0u8; 64];
        let n = req.encode(&mut out).unwrap();
        assert_eq!(n, RetransmitRequest::LEN);
        assert_eq!(out[..n], RETRANSMIT_REQUEST_BYTES);
        let (msg, used) = decode_recovery(&RETRANSMIT_REQUEST_BYTES).unwrap();
        assert_eq!(used, 40);
        assert_eq!(msg, RecoveryMsg::RetransmitRequest(req));
        assert_eq!(
            req.encode(&mut out[..39]).unwrap_err(),
            BufferTooSmall {
                needed: 40,
                have: 39
            }
        );
    }

    #[test]
    fn recovery_round_trips() {
        let mut buf = [0u8; 512];
        let mut at = 0;
        let na = NotAvailable {
            channel: 1,
            session: 2,
            from_seq: 3,
            count: 4,
            oldest_available: 5,
        };
        at += na.encode(&mut buf[at..]).unwrap();
        at += encode_retransmit_data(&mut buf[at..], 1, 2, &DATAGRAM_BYTES).unwrap();
        at += encode_snapshot_request(&mut buf[at..], 1, 0).unwrap();
        at += encode_snapshot_chunk(&mut buf[at..], 1, 2, 99, 10, b"state").unwrap();
        let end = SnapshotEnd {
            channel: 1,
            session: 2,
            snapshot_seq: 99,
            total_len: 15,
            crc32: 0xdead_beef,
        };
        at += end.encode(&mut buf[at..]).unwrap();

        let mut rest = &buf[..at];
        let mut got = Vec::new();
        while !rest.is_empty() {
            let (m, used) = decode_recovery(rest).unwrap();
            got.push(m);
            rest = &rest[used..];
        }
        assert_eq!(
            got,
            vec![
                RecoveryMsg::NotAvailable(na),
                RecoveryMsg::RetransmitData {
                    channel: 1,
                    session: 2,
                    datagram: &DATAGRAM_BYTES
                },
                RecoveryMsg::SnapshotRequest {
                    channel: 1,
                    session: 0
                },
                RecoveryMsg::SnapshotChunk {
                    channel: 1,
                    session: 2,
                    snapshot_seq: 99,
                    offset: 10,
                    data: b"state"
                },
                RecoveryMsg::SnapshotEnd(end),
            ]
        );
    }

    /// A subscriber status as the wire carries it (little-endian).
    #[rustfmt::skip]
    const STATUS_BYTES: [u8; 48] = [
        0x52, 0x52, 1, 8, 7, 0, 0, 0, 48, 0, 0, 0, 0, 0, 0, 0, // magic RR v1 kind 8, channel 7, len 48
        9, 0, 0, 0, 0, 0, 0, 0,                                 // session 9
        0x10, 0x27, 0, 0, 0, 0, 0, 0,                           // next_seq 10000
        0xe8, 0x03, 0, 0, 0, 0, 0, 0,                           // 1000 msgs/s
        3, 0, 0, 0, 0, 0, 0, 0,                                 // 3 requests
    ];

    #[test]
    fn subscriber_status_matches_fixed_bytes() {
        let st = SubscriberStatus {
            channel: 7,
            session: 9,
            next_seq: 10_000,
            msgs_per_sec: 1000,
            requests: 3,
        };
        let mut out = [0u8; 64];
        assert_eq!(st.encode(&mut out).unwrap(), SubscriberStatus::LEN);
        assert_eq!(out[..SubscriberStatus::LEN], STATUS_BYTES);
        assert_eq!(
            decode_recovery(&STATUS_BYTES).unwrap(),
            (RecoveryMsg::SubscriberStatus(st), 48)
        );
        let mut long = STATUS_BYTES.to_vec();
        long[8] = 49;
        long.push(0);
        assert_eq!(
            decode_recovery(&long).unwrap_err(),
            WireError::BadLength(49)
        );
        assert!(st.encode(&mut out[..47]).is_err());
    }

    #[test]
    fn recovery_rejects_bad_input() {
        let mut b = RETRANSMIT_REQUEST_BYTES;
        b[3] = 0;
        assert_eq!(decode_recovery(&b).unwrap_err(), WireError::BadKind(0));
        let mut b = RETRANSMIT_REQUEST_BYTES;
        b[8] = 41; // longer than the buffer
        assert!(matches!(
            decode_recovery(&b),
            Err(WireError::Truncated { .. })
        ));
        let mut b = RETRANSMIT_REQUEST_BYTES;
        b[8] = 12; // shorter than a header
        assert_eq!(decode_recovery(&b).unwrap_err(), WireError::BadLength(12));
        let mut v = RETRANSMIT_REQUEST_BYTES.to_vec();
        v[8] = 41; // body one byte too long for the kind
        v.push(0);
        assert_eq!(decode_recovery(&v).unwrap_err(), WireError::BadLength(41));
        for n in 0..RETRANSMIT_REQUEST_BYTES.len() {
            assert!(decode_recovery(&RETRANSMIT_REQUEST_BYTES[..n]).is_err());
        }
    }

    /// One message "abc", sequence 42, line A, channel 7, session 0x0102..08.
    const ONE_MESSAGE_BYTES: [u8; 29] = [
        0x52, 0x42, 1, 0, 7, 0, 1, 0, // magic, version, line A, channel 7, count 1
        8, 7, 6, 5, 4, 3, 2, 1, // session
        42, 0, 0, 0, 0, 0, 0, 0, // first_seq
        3, 0, b'a', b'b', b'c',
    ];

    #[test]
    fn one_message_header_matches_fixed_bytes() {
        let expect = OneMessageHeader::new(7, 0x0102_0304_0506_0708);
        assert_eq!(
            expect.match_datagram(&ONE_MESSAGE_BYTES),
            Some((42, &b"abc"[..]))
        );
        let mut b = ONE_MESSAGE_BYTES;
        b[3] = Line::B as u8;
        assert_eq!(expect.match_datagram(&b), Some((42, &b"abc"[..])));
        // Another channel or session, a bad line, a batch, a fragment, a
        // short or long body, a sequence at the end: all left to parse.
        assert_eq!(
            OneMessageHeader::new(8, 0x0102_0304_0506_0708).match_datagram(&b),
            None
        );
        assert_eq!(OneMessageHeader::new(7, 1).match_datagram(&b), None);
        for (at, v) in [
            (3, 2),
            (3, 3),
            (6, 2),
            (6, 0),
            (2, FRAGMENT_VERSION),
            (0, 0),
        ] {
            let mut b = ONE_MESSAGE_BYTES;
            b[at] = v;
            assert_eq!(expect.match_datagram(&b), None, "byte {at} = {v}");
        }
        assert_eq!(expect.match_datagram(&ONE_MESSAGE_BYTES[..28]), None);
        assert_eq!(expect.match_datagram(&ONE_MESSAGE_BYTES[..24]), None);
        let mut long = [0u8; 30];
        long[..29].copy_from_slice(&ONE_MESSAGE_BYTES);
        assert_eq!(expect.match_datagram(&long), None);
        let mut b = ONE_MESSAGE_BYTES;
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(expect.match_datagram(&b), None);
        assert!(Datagram::parse(&b).is_err());
    }

    /// What the latency path accepts, parse accepts with the same fields.
    #[test]
    fn one_message_header_accepts_only_what_parse_accepts() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let expect = OneMessageHeader::new(7, 0x0102_0304_0506_0708);
        let mut matched = 0;
        for _ in 0..50_000 {
            let mut b = ONE_MESSAGE_BYTES;
            // Change one to three bytes, mostly to a near value.
            for _ in 0..rng.gen_range(1..=3) {
                let at = rng.gen_range(0..b.len());
                b[at] = if rng.gen_bool(0.5) {
                    b[at] ^ (1 << rng.gen_range(0..8))
                } else {
                    rng.gen()
                };
            }
            let n = rng.gen_range(b.len() - 2..=b.len());
            if let Some((seq, msg)) = expect.match_datagram(&b[..n]) {
                matched += 1;
                let d = Datagram::parse(&b[..n]).expect("the latency path took a bad datagram");
                assert_eq!(
                    (d.channel(), d.session(), d.count()),
                    (7, 0x0102_0304_0506_0708, 1)
                );
                assert!(!d.is_fragment());
                assert_eq!(d.messages().collect::<Vec<_>>(), vec![(seq, msg)]);
            }
        }
        // Changes to the sequence and the payload keep it matching.
        assert!(matched > 1_000, "{matched}");
    }

    #[test]
    fn decoders_never_panic_on_noise() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut buf = [0u8; 96];
        for i in 0..20_000 {
            let n = rng.gen_range(0..buf.len());
            rng.fill(&mut buf[..n]);
            // Make a fair share of inputs get past the magic checks.
            if i % 2 == 0 && n >= 4 {
                buf[..3].copy_from_slice(&[0x52, 0x42, 1]);
                buf[3] &= 1;
            } else if n >= 12 {
                buf[..3].copy_from_slice(&[0x52, 0x52, 1]);
                buf[3] = rng.gen_range(1..=8);
                buf[8..12].copy_from_slice(&(rng.gen_range(0..n as u32 + 8)).to_le_bytes());
            }
            if let Ok(d) = Datagram::parse(&buf[..n]) {
                assert!(d.messages().count() == usize::from(d.count()));
            }
            let _ = decode_recovery(&buf[..n]);
        }
    }
}
