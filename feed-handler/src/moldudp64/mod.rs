//! MoldUDP64: NASDAQ's sequenced UDP framing for ITCH, and its re-request protocol.
//!
//! Owns the packet and request layouts, a packet builder, the I/O-free [`GapTracker`]
//! (session lock, sequence window, gap detection, re-requests with timeout, losses) and
//! [`Ingress`] around it (which senders are heard). It never touches a socket:
//! [`crate::udp`] moves the bytes.
//!
//! Downstream packet: session (10 bytes), sequence number of the first message (u64 BE),
//! message count (u16 BE), then `count` blocks of message length (u16 BE) and message.
//! A count of 0 is a heartbeat, 0xFFFF the end of the session; both carry no blocks and
//! their sequence number is the next one to be sent. A re-request is the 20-byte header
//! alone, with the count meaning "messages wanted".

mod gap;
mod ingress;

pub use gap::{Counters, Deliver, GapConfig, GapTracker, Loss, Outcome, StartPolicy};
pub use ingress::{BadSource, Ingress, IngressConfig, Origin, SourceAddr, Verdict};

use zerocopy::byteorder::big_endian::{U16, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The 20-byte header of every MoldUDP64 packet, downstream or request.
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, PartialEq, Eq, Debug,
)]
#[repr(C)]
pub struct Header {
    /// Session identifier, ASCII, space padded.
    pub session: [u8; 10],
    /// Sequence number of the first message (downstream) or of the first wanted (request).
    pub sequence_number: U64,
    /// Messages in the packet (downstream) or wanted (request).
    pub message_count: U16,
}
/// Size of [`Header`].
pub const HEADER_LEN: usize = 20;
const _: () = assert!(core::mem::size_of::<Header>() == HEADER_LEN);

/// Message count of a heartbeat.
pub const HEARTBEAT: u16 = 0;
/// Message count of an end-of-session packet.
pub const END_OF_SESSION: u16 = 0xFFFF;

/// A session name padded to 10 bytes (cut if longer).
pub fn session(name: &str) -> [u8; 10] {
    let mut s = [b' '; 10];
    for (d, c) in s.iter_mut().zip(name.bytes()) {
        *d = c;
    }
    s
}

/// Why bytes are not a MoldUDP64 packet. Small and `Copy`: parsing runs per packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PacketError {
    /// Shorter than the 20-byte header.
    #[error("MoldUDP64 packet of {0} bytes is shorter than its header")]
    TooShort(usize),
    /// The declared count of message blocks does not fit in the packet.
    #[error("MoldUDP64 packet declares {declared} messages but only {found} fit")]
    CountMismatch {
        /// Count in the header.
        declared: u16,
        /// Complete blocks found.
        found: u16,
    },
    /// Bytes left after the declared blocks (or after a heartbeat / end of session).
    #[error("MoldUDP64 packet has {0} bytes after its last message")]
    TrailingBytes(usize),
    /// The sequence range overflows u64.
    #[error("MoldUDP64 sequence number overflows")]
    SequenceOverflow,
}

/// What a downstream packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Carries `message_count` messages.
    Data,
    /// No messages; the sequence number is the next expected.
    Heartbeat,
    /// No messages; the session is over, the sequence number is one past the last message.
    EndOfSession,
}

/// A validated downstream packet: after [`Packet::parse`] no accessor can fail.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    header: &'a Header,
    blocks: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Validates `bytes` as one MoldUDP64 packet: every declared block is complete and
    /// nothing follows the last one.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, PacketError> {
        let (header, blocks) =
            Header::ref_from_prefix(bytes).map_err(|_| PacketError::TooShort(bytes.len()))?;
        let declared = header.message_count.get();
        let count = if declared == END_OF_SESSION {
            0
        } else {
            declared
        };
        let mut rest = blocks;
        for found in 0..count {
            let Some((len, after)) = rest.split_first_chunk::<2>() else {
                return Err(PacketError::CountMismatch { declared, found });
            };
            let len = usize::from(u16::from_be_bytes(*len));
            if after.len() < len {
                return Err(PacketError::CountMismatch { declared, found });
            }
            rest = &after[len..];
        }
        if !rest.is_empty() {
            return Err(PacketError::TrailingBytes(rest.len()));
        }
        if header
            .sequence_number
            .get()
            .checked_add(u64::from(count))
            .is_none()
        {
            return Err(PacketError::SequenceOverflow);
        }
        Ok(Self { header, blocks })
    }

    /// The header.
    pub fn header(&self) -> &'a Header {
        self.header
    }

    /// Session identifier.
    pub fn session(&self) -> [u8; 10] {
        self.header.session
    }

    /// Sequence number of the first message (or the next expected, for heartbeat/end).
    pub fn sequence_number(&self) -> u64 {
        self.header.sequence_number.get()
    }

    /// What the packet is.
    pub fn kind(&self) -> Kind {
        match self.header.message_count.get() {
            HEARTBEAT => Kind::Heartbeat,
            END_OF_SESSION => Kind::EndOfSession,
            _ => Kind::Data,
        }
    }

    /// Messages carried (0 for heartbeat and end of session).
    pub fn message_count(&self) -> u16 {
        match self.kind() {
            Kind::Data => self.header.message_count.get(),
            _ => 0,
        }
    }

    /// Sequence number one past the last message.
    pub fn end_sequence(&self) -> u64 {
        // Checked in parse.
        self.sequence_number()
            .saturating_add(u64::from(self.message_count()))
    }

    /// The messages, in order.
    pub fn messages(&self) -> Messages<'a> {
        Messages {
            rest: self.blocks,
            left: self.message_count(),
        }
    }
}

/// Iterator over the message blocks of a [`Packet`].
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    rest: &'a [u8],
    left: u16,
}

impl<'a> Iterator for Messages<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        // Validated by Packet::parse; the checks only keep this total.
        let (len, after) = self.rest.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_be_bytes(*len));
        let (msg, rest) = after.split_at_checked(len)?;
        self.rest = rest;
        self.left -= 1;
        Some(msg)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::from(self.left), Some(usize::from(self.left)))
    }
}

/// A re-request: "send me `count` messages from `sequence_number` of `session`".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Session identifier.
    pub session: [u8; 10],
    /// First wanted sequence number.
    pub sequence_number: u64,
    /// Messages wanted.
    pub count: u16,
}

impl Request {
    /// The 20 bytes on the wire.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let h = Header {
            session: self.session,
            sequence_number: U64::new(self.sequence_number),
            message_count: U16::new(self.count),
        };
        let mut out = [0u8; HEADER_LEN];
        out.copy_from_slice(h.as_bytes());
        out
    }

    /// Parses a request packet (exactly 20 bytes).
    pub fn parse(bytes: &[u8]) -> Result<Self, PacketError> {
        let h = Header::ref_from_bytes(bytes).map_err(|_| {
            if bytes.len() < HEADER_LEN {
                PacketError::TooShort(bytes.len())
            } else {
                PacketError::TrailingBytes(bytes.len() - HEADER_LEN)
            }
        })?;
        Ok(Self {
            session: h.session,
            sequence_number: h.sequence_number.get(),
            count: h.message_count.get(),
        })
    }
}

/// The 20 bytes of a packet without messages (heartbeat or end of session).
pub fn empty_packet(session: [u8; 10], next_sequence: u64, count: u16) -> [u8; HEADER_LEN] {
    Request {
        session,
        sequence_number: next_sequence,
        count,
    }
    .encode()
}

/// Builds downstream packets into a reused buffer, up to a maximum packet size.
#[derive(Debug)]
pub struct PacketBuilder {
    buf: Vec<u8>,
    max_len: usize,
    count: u16,
}

/// The message does not fit in the packet being built (returned with nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("message does not fit in the MoldUDP64 packet")]
pub struct Full;

impl PacketBuilder {
    /// A builder for packets of at most `max_len` bytes (e.g. 1400 for a 1500-byte MTU).
    pub fn new(max_len: usize) -> Self {
        Self {
            buf: Vec::with_capacity(max_len.max(HEADER_LEN)),
            max_len: max_len.max(HEADER_LEN),
            count: 0,
        }
    }

    /// Starts a packet whose first message has `sequence_number`.
    pub fn start(&mut self, session: [u8; 10], sequence_number: u64) {
        self.buf.clear();
        self.buf
            .extend_from_slice(&empty_packet(session, sequence_number, 0));
        self.count = 0;
    }

    /// Appends a message, or says it does not fit.
    pub fn push(&mut self, message: &[u8]) -> Result<(), Full> {
        let len = u16::try_from(message.len()).map_err(|_| Full)?;
        if self.buf.len() < HEADER_LEN
            || self.buf.len() + 2 + message.len() > self.max_len
            || self.count == END_OF_SESSION - 1
        {
            return Err(Full);
        }
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(message);
        self.count += 1;
        self.buf[18..20].copy_from_slice(&self.count.to_be_bytes());
        Ok(())
    }

    /// Messages in the current packet.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// The packet built so far.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// Builds the answer to `request` from `history` (message `i` has sequence number
/// `first_sequence + i`): as many of the wanted messages as fit in one packet. `None` when
/// the request asks for nothing the history holds.
pub fn build_retransmission<'b, M: AsRef<[u8]>>(
    builder: &'b mut PacketBuilder,
    session: [u8; 10],
    first_sequence: u64,
    history: &[M],
    request: &Request,
) -> Option<&'b [u8]> {
    let start = request.sequence_number.checked_sub(first_sequence)?;
    let start = usize::try_from(start).ok()?;
    let wanted = history
        .get(start..)?
        .iter()
        .take(usize::from(request.count));
    builder.start(session, request.sequence_number);
    for m in wanted {
        if builder.push(m.as_ref()).is_err() {
            break;
        }
    }
    (builder.count() > 0).then(|| builder.bytes())
}

#[cfg(test)]
mod tests;
