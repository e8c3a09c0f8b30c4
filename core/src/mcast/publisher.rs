//! Publisher state machine: batching, sequencing, history and retransmission.
//!
//! Datagrams are built in place inside a preallocated history ring, so a
//! flushed datagram is already its own retransmission copy and nothing is
//! copied or allocated per message. The publisher never waits for anyone: a
//! subscriber asking for data older than the history gets a NotAvailable.
//!
//! A message larger than one datagram (up to `max_message_bytes`) is cut
//! into fragment datagrams (see [`wire`]'s "Fragment datagrams"), each
//! sealed into the history like any datagram and taking one sequence: the
//! message's sequence is that of its last fragment. A claim of such a size
//! hands out a staging buffer allocated once, fragmented at commit.
//!
//! With a datagram key ([`PublisherState::set_datagram_key`]) every sealed
//! datagram and heartbeat ends with an 8-byte keyed tag over the rest of
//! it, computed once at sealing: the history holds the tagged bytes, so
//! retransmissions carry the same tag.

use super::wire::{
    self, Line, NotAvailable, RetransmitRequest, DATAGRAM_HEADER_LEN, FRAGMENT_HEADER_LEN,
    MSG_PREFIX_LEN,
};
use crate::auth::{DatagramKey, DATAGRAM_TAG_LEN as TAG_LEN};

/// Static parameters of one publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublisherConfig {
    /// Channel id written in every datagram.
    pub channel: u16,
    /// Session id; must be greater than any earlier session of this channel
    /// (e.g. the start time in nanoseconds since the epoch).
    pub session: u64,
    /// Largest datagram, header included (at most the path MTU).
    pub max_datagram: usize,
    /// Most messages per datagram.
    pub max_messages: u16,
    /// A non-empty datagram is flushed by [`PublisherState::poll_flush`] once
    /// this much time has passed since it was first seen non-empty.
    pub flush_interval_ns: u64,
    /// Datagrams kept for retransmission.
    pub history_depth: usize,
    /// Largest message, fragmented across datagrams if it does not fit one
    /// (0: one datagram's worth, no fragmentation). A claim of more than a
    /// datagram's worth is staged in a buffer of this size.
    pub max_message_bytes: usize,
}

/// Why a message could not be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// The message can never fit in a datagram.
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Requested length.
        len: usize,
        /// Largest message that fits in an empty datagram.
        max: usize,
    },
    /// The open datagram is full: [`PublisherState::flush`] it, then claim again.
    #[error("datagram full: flush first")]
    Full,
}

/// One answer part to a retransmit request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetransmitReply<'a> {
    /// An original datagram, to be sent as RetransmitData.
    Data(&'a [u8]),
    /// Part of the range is gone.
    NotAvailable(NotAvailable),
}

/// What a publishing call left for the I/O layer: whether sealed datagrams
/// are now waiting to go out. The one place that decides it, so the
/// multicast shell and the RC fan-out act on the same rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "sealed datagrams wait until the I/O layer sends them"]
pub enum Output {
    /// Nothing sealed: the message waits in the open datagram (sent by a
    /// later flush, or by [`PublisherState::poll_flush`]'s timer).
    Nothing,
    /// The open datagram was full and was sealed to make room: send it
    /// (it may wait for the next batch of sends).
    Sealed,
    /// A message larger than one datagram was sealed as fragments: send
    /// them now, they are the whole message.
    Fragments,
}

impl Output {
    /// Whether anything was sealed.
    pub fn is_due(self) -> bool {
        self != Output::Nothing
    }
}

/// A message published, and what it left to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The message's sequence.
    pub seq: u64,
    /// What is due to go out.
    pub output: Output,
}

/// Publisher counters (plain values, copied out by [`PublisherState::counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublisherCounters {
    /// Messages committed.
    pub messages: u64,
    /// Datagrams flushed.
    pub datagrams: u64,
    /// Heartbeats produced.
    pub heartbeats: u64,
    /// Retransmit requests answered.
    pub retransmit_requests: u64,
    /// Datagrams handed out for retransmission.
    pub retransmitted_datagrams: u64,
    /// NotAvailable answers.
    pub not_available: u64,
    /// Requests reaching beyond what was ever sent, answered so (a
    /// NotAvailable from the publisher's end on: a heartbeat ahead of the
    /// stream, forged or stray, made the subscriber ask).
    pub not_yet_published: u64,
    /// Messages sent as fragments (also counted in `messages`).
    pub large_messages: u64,
    /// Fragment datagrams sealed (also counted in `datagrams`).
    pub fragments: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct SlotMeta {
    first_seq: u64,
    count: u16,
    len: u16,
}

/// The publisher's protocol state. See the module documentation.
#[derive(Debug)]
pub struct PublisherState {
    cfg: PublisherConfig,
    /// `nslots * max_datagram` bytes; slot `i % nslots` holds datagram `i`.
    slots: Box<[u8]>,
    meta: Box<[SlotMeta]>,
    /// Index of the open datagram; sealed datagrams are `oldest..open`.
    open: u64,
    /// `open`'s slot (`open % slots`), kept as `open` advances: a claim and
    /// a flush find the open datagram with no division.
    open_slot: usize,
    oldest: u64,
    open_len: usize,
    open_count: u16,
    /// Sequence of the next message to commit.
    next_seq: u64,
    /// Length of the outstanding claim, if any.
    claimed: Option<usize>,
    /// The outstanding claim is in `large` (to be fragmented at commit).
    claimed_large: bool,
    /// The open datagram is a fragment (sealed with the fragment version).
    fragment_open: bool,
    /// Staging buffer of a large claim (`max_message_bytes`, or empty when
    /// no large message fits it).
    large: Box<[u8]>,
    open_since: Option<u64>,
    heartbeat: [u8; DATAGRAM_HEADER_LEN + TAG_LEN],
    counters: PublisherCounters,
    /// Datagram tag key; bytes reserved for the tag in every datagram.
    key: Option<DatagramKey>,
    tag_len: usize,
}

impl PublisherState {
    /// Preallocates and faults in the history ring (`(history_depth + 1) *
    /// max_datagram` bytes). `max_datagram` is clamped to what a u16 length
    /// can describe and to at least a header plus one empty message.
    pub fn new(mut cfg: PublisherConfig) -> Self {
        cfg.max_datagram = cfg.max_datagram.clamp(
            DATAGRAM_HEADER_LEN + MSG_PREFIX_LEN + TAG_LEN,
            usize::from(u16::MAX),
        );
        cfg.max_messages = cfg.max_messages.max(1);
        let nslots = cfg.history_depth + 1;
        let one_datagram = cfg.max_datagram - DATAGRAM_HEADER_LEN - MSG_PREFIX_LEN;
        let staging = if cfg.max_message_bytes > one_datagram {
            cfg.max_message_bytes
        } else {
            0
        };
        PublisherState {
            claimed_large: false,
            fragment_open: false,
            large: super::prefaulted(staging),
            slots: super::prefaulted(nslots * cfg.max_datagram),
            meta: vec![SlotMeta::default(); nslots].into_boxed_slice(),
            open: 0,
            open_slot: 0,
            oldest: 0,
            open_len: DATAGRAM_HEADER_LEN,
            open_count: 0,
            next_seq: 1,
            claimed: None,
            open_since: None,
            heartbeat: [0; DATAGRAM_HEADER_LEN + TAG_LEN],
            counters: PublisherCounters::default(),
            key: None,
            tag_len: 0,
            cfg,
        }
    }

    /// Tags every datagram sealed from now on (and every heartbeat) with
    /// `key`; `None` stops tagging. Set it before the first publish: the
    /// open datagram must have room for the tag.
    pub fn set_datagram_key(&mut self, key: Option<DatagramKey>) {
        self.tag_len = if key.is_some() { TAG_LEN } else { 0 };
        self.key = key;
    }

    /// The configuration in force (after clamping).
    pub fn config(&self) -> &PublisherConfig {
        &self.cfg
    }
    /// Session id.
    pub fn session(&self) -> u64 {
        self.cfg.session
    }
    /// Sequence the next committed message gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
    /// Counters.
    pub fn counters(&self) -> PublisherCounters {
        self.counters
    }
    /// Largest message that fits in an empty datagram.
    pub fn max_message_len(&self) -> usize {
        self.cfg.max_datagram - DATAGRAM_HEADER_LEN - MSG_PREFIX_LEN - self.tag_len
    }
    /// Largest message [`publish`](Self::publish) and
    /// [`try_claim`](Self::try_claim) take, fragmented or not.
    pub fn max_large_message_len(&self) -> usize {
        self.cfg.max_message_bytes.max(self.max_message_len())
    }
    /// Message bytes one fragment datagram carries.
    pub fn fragment_chunk_len(&self) -> usize {
        self.max_message_len().saturating_sub(FRAGMENT_HEADER_LEN)
    }
    /// Messages in the open (not yet flushed) datagram.
    pub fn pending_messages(&self) -> u16 {
        self.open_count
    }
    /// Oldest sequence still retransmittable (equals the first unflushed
    /// sequence when the history is empty).
    pub fn oldest_available(&self) -> u64 {
        if self.oldest == self.open {
            self.open_first_seq()
        } else {
            self.meta[self.slot_of(self.oldest)].first_seq
        }
    }

    fn nslots(&self) -> u64 {
        self.meta.len() as u64
    }
    fn slot_of(&self, idx: u64) -> usize {
        // Fits: the remainder is below meta.len().
        (idx % self.nslots()) as usize
    }
    /// One past the last sequence ever sent (the open datagram's first).
    pub fn published_end(&self) -> u64 {
        self.open_first_seq()
    }
    fn open_first_seq(&self) -> u64 {
        self.next_seq - u64::from(self.open_count)
    }
    /// The open datagram's slot.
    fn open_bytes_mut(&mut self) -> &mut [u8] {
        debug_assert_eq!(self.open_slot, self.slot_of(self.open));
        let start = self.open_slot * self.cfg.max_datagram;
        &mut self.slots[start..start + self.cfg.max_datagram]
    }
    /// The outstanding claim's bytes (empty when nothing is claimed).
    pub fn claimed(&self) -> &[u8] {
        let Some(len) = self.claimed else {
            return &[];
        };
        if self.claimed_large {
            return &self.large[..len];
        }
        let at = self.open_slot * self.cfg.max_datagram + self.open_len + MSG_PREFIX_LEN;
        &self.slots[at..at + len]
    }

    /// [`claimed`](Self::claimed), to write.
    pub fn claimed_mut(&mut self) -> &mut [u8] {
        let Some(len) = self.claimed else {
            return &mut [];
        };
        if self.claimed_large {
            return &mut self.large[..len];
        }
        let at = self.open_slot * self.cfg.max_datagram + self.open_len + MSG_PREFIX_LEN;
        &mut self.slots[at..at + len]
    }

    /// Abandons the outstanding claim: nothing is sequenced, the next claim
    /// takes its room.
    pub fn abort(&mut self) {
        self.claimed = None;
        self.claimed_large = false;
    }

    fn sealed(&self, idx: u64) -> (&[u8], SlotMeta) {
        let slot = self.slot_of(idx);
        let meta = self.meta[slot];
        let start = slot * self.cfg.max_datagram;
        (&self.slots[start..start + usize::from(meta.len)], meta)
    }

    /// The first sealed datagram still in the history that ends after `seq`,
    /// as `(first, end, bytes)`: its first sequence (greater than `seq` if
    /// older datagrams were overwritten) and one past its last. The I/O
    /// layer sends flushed datagrams from here, so a paced sender never
    /// needs a copy.
    pub fn sealed_from(&self, seq: u64) -> Option<(u64, u64, &[u8])> {
        let idx = self.sealed_index_from(seq)?;
        let (bytes, m) = self.sealed(idx);
        Some((m.first_seq, m.first_seq + u64::from(m.count), bytes))
    }

    /// Index of the first sealed datagram in the history ending after `seq`.
    fn sealed_index_from(&self, seq: u64) -> Option<u64> {
        if self.oldest == self.open || seq >= self.open_first_seq() {
            // Nothing sealed, or everything sealed ends at or before `seq`.
            return None;
        }
        // The sender keeps up: the newest sealed datagram is the one wanted
        // (it ends after `seq`, checked above), unless an older one does too.
        let newest = self.open - 1;
        if self.sealed(newest).1.first_seq <= seq {
            return Some(newest);
        }
        let (mut lo, mut hi) = (self.oldest, newest);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let m = self.sealed(mid).1;
            if m.first_seq + u64::from(m.count) <= seq {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }

    /// How much of `[from, to)` a repair of at most `max_bytes` covers,
    /// counting each sealed datagram of the history it overlaps as its
    /// length plus `overhead` (a recovery header, for a unicast answer):
    /// the end of the covered part (`to`, or the first sequence of the
    /// first datagram that did not fit; whole datagrams, at least one) and
    /// the datagrams' own bytes. What lies before the history or after the
    /// last flushed datagram costs nothing here.
    pub fn repair_extent(&self, from: u64, to: u64, max_bytes: u64, overhead: u64) -> (u64, u64) {
        let Some(mut idx) = self.sealed_index_from(from) else {
            return (to, 0);
        };
        let (mut cost, mut bytes) = (0u64, 0u64);
        while idx < self.open {
            let (b, m) = self.sealed(idx);
            if m.first_seq >= to {
                break;
            }
            let len = b.len() as u64;
            if cost > 0 && cost.saturating_add(len + overhead) > max_bytes {
                // A datagram was taken, so this one starts after `from`.
                return (m.first_seq, bytes);
            }
            cost = cost.saturating_add(len + overhead);
            bytes += len;
            idx += 1;
        }
        (to, bytes)
    }

    /// First sequence not yet flushed (that of the open datagram).
    pub fn unflushed_seq(&self) -> u64 {
        self.open_first_seq()
    }

    /// Claims `len` bytes for the next message in the open datagram. Write the
    /// message into the returned slice, then [`commit`](Self::commit). A new
    /// claim without a commit abandons the previous one.
    ///
    /// A claim larger than one datagram but within `max_message_bytes` is
    /// staged and cut into fragment datagrams at commit (the open datagram is
    /// flushed first); those datagrams are sealed at once, ready to send.
    pub fn try_claim(&mut self, len: usize) -> Result<&mut [u8], ClaimError> {
        if len > self.max_message_len() {
            // The one branch small messages pay for large ones.
            return self.try_claim_large(len);
        }
        if self.open_count >= self.cfg.max_messages
            || self.open_len + MSG_PREFIX_LEN + len + self.tag_len > self.cfg.max_datagram
        {
            return Err(ClaimError::Full);
        }
        self.claimed = Some(len);
        // A large claim dropped uncommitted must not make this one a large one.
        self.claimed_large = false;
        let at = self.open_len;
        let slot = self.open_bytes_mut();
        // len <= max_message_len < u16::MAX (max_datagram is clamped).
        slot[at..at + MSG_PREFIX_LEN].copy_from_slice(&(len as u16).to_le_bytes());
        Ok(&mut slot[at + MSG_PREFIX_LEN..at + MSG_PREFIX_LEN + len])
    }

    /// Commits the claimed message and returns its sequence; `None` if
    /// nothing was claimed.
    pub fn commit(&mut self) -> Option<u64> {
        let len = self.claimed.take()?;
        if self.claimed_large {
            self.claimed_large = false;
            let staged = std::mem::take(&mut self.large);
            let seq = self.seal_fragments(&staged[..len]);
            self.large = staged;
            return Some(seq);
        }
        self.open_len += MSG_PREFIX_LEN + len;
        self.open_count += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.counters.messages += 1;
        Some(seq)
    }

    /// Copies `msg` in as one message (claim + commit). A message larger
    /// than one datagram is fragmented straight from `msg` (no staging).
    pub fn publish(&mut self, msg: &[u8]) -> Result<u64, ClaimError> {
        if msg.len() > self.max_message_len() {
            self.check_large(msg.len())?;
            self.claimed = None;
            self.claimed_large = false;
            return Ok(self.seal_fragments(msg));
        }
        self.try_claim(msg.len())?.copy_from_slice(msg);
        Ok(self.commit().unwrap_or(0))
    }

    /// [`publish`](Self::publish) then [`flush`](Self::flush) of a message
    /// that goes out alone, in one step: when no message is open (nothing
    /// to seal first) and `msg` fits one datagram, writes its prefix and
    /// bytes into the open datagram and seals it; returns the message's
    /// sequence and the datagram, as `flush` does. `None`: nothing was
    /// done (the caller publishes and flushes the general way).
    #[inline]
    pub fn publish_alone(&mut self, msg: &[u8]) -> Option<(u64, &[u8])> {
        let len = msg.len();
        if self.open_count != 0 || len > self.max_message_len() {
            return None;
        }
        // Nothing open: the datagram holds only its header so far, and the
        // message fits after it (len <= max_message_len, the room of an
        // empty datagram, tag included).
        debug_assert_eq!(self.open_len, DATAGRAM_HEADER_LEN);
        self.claimed = None;
        self.claimed_large = false;
        let slot = self.open_bytes_mut();
        let body = &mut slot[DATAGRAM_HEADER_LEN..DATAGRAM_HEADER_LEN + MSG_PREFIX_LEN + len];
        // len <= max_message_len < u16::MAX (max_datagram is clamped).
        body[..MSG_PREFIX_LEN].copy_from_slice(&(len as u16).to_le_bytes());
        body[MSG_PREFIX_LEN..].copy_from_slice(msg);
        self.open_len = DATAGRAM_HEADER_LEN + MSG_PREFIX_LEN + len;
        self.open_count = 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.counters.messages += 1;
        let bytes = self.flush()?;
        Some((seq, bytes))
    }

    /// [`publish`](Self::publish) for an I/O layer: a full open datagram
    /// is sealed first to make room, and the answer says what is now due to
    /// go out ([`Output`]), so the caller sends it with one call.
    pub fn publish_flushing(&mut self, msg: &[u8]) -> Result<Published, ClaimError> {
        let large = msg.len() > self.max_message_len();
        match self.publish(msg) {
            Ok(seq) if large => Ok(Published {
                seq,
                output: Output::Fragments,
            }),
            Ok(seq) => Ok(Published {
                seq,
                output: Output::Nothing,
            }),
            Err(ClaimError::Full) => {
                self.flush();
                // An empty datagram takes any message publish did not call
                // too large.
                let seq = self.publish(msg)?;
                Ok(Published {
                    seq,
                    output: Output::Sealed,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Makes room for a claim of `len` bytes: seals the open datagram if
    /// such a claim would not fit it (a claim larger than one datagram is
    /// staged and needs no room). Call it before
    /// [`try_claim`](Self::try_claim); [`Output::Sealed`] says a datagram
    /// is due to go out.
    pub fn make_room(&mut self, len: usize) -> Output {
        if len <= self.max_message_len()
            && (self.open_count >= self.cfg.max_messages
                || self.open_len + MSG_PREFIX_LEN + len + self.tag_len > self.cfg.max_datagram)
            && self.flush().is_some()
        {
            Output::Sealed
        } else {
            Output::Nothing
        }
    }

    /// [`commit`](Self::commit) for an I/O layer: the sequence, and
    /// [`Output::Fragments`] when a large claim was sealed as fragments.
    pub fn commit_flushing(&mut self) -> Option<Published> {
        let large = self.claimed_large;
        let seq = self.commit()?;
        Some(Published {
            seq,
            output: if large {
                Output::Fragments
            } else {
                Output::Nothing
            },
        })
    }

    fn check_large(&self, len: usize) -> Result<(), ClaimError> {
        if len > self.cfg.max_message_bytes
            || len > u32::MAX as usize
            || self.fragment_chunk_len() == 0
        {
            return Err(ClaimError::TooLarge {
                len,
                max: self.max_large_message_len(),
            });
        }
        Ok(())
    }

    fn try_claim_large(&mut self, len: usize) -> Result<&mut [u8], ClaimError> {
        self.check_large(len)?;
        // Staging exists whenever max_message_bytes exceeds one datagram.
        if len > self.large.len() {
            return Err(ClaimError::TooLarge {
                len,
                max: self.max_message_len(),
            });
        }
        self.claimed = Some(len);
        self.claimed_large = true;
        Ok(&mut self.large[..len])
    }

    /// Flushes the open datagram, then seals `msg` (longer than one
    /// datagram's worth, at most u32::MAX) as fragment datagrams. Returns
    /// the sequence of the last fragment, the message's sequence.
    fn seal_fragments(&mut self, msg: &[u8]) -> u64 {
        self.flush();
        let chunk = self.fragment_chunk_len();
        // Checked by the callers (check_large).
        let total = msg.len() as u32;
        let mut offset = 0usize;
        for piece in msg.chunks(chunk) {
            let at = self.open_len;
            let slot = self.open_bytes_mut();
            let len = FRAGMENT_HEADER_LEN + piece.len();
            // len <= max_message_len < u16::MAX (max_datagram is clamped).
            slot[at..at + MSG_PREFIX_LEN].copy_from_slice(&(len as u16).to_le_bytes());
            let body = &mut slot[at + MSG_PREFIX_LEN..at + MSG_PREFIX_LEN + len];
            body[..4].copy_from_slice(&total.to_le_bytes());
            // offset < total <= u32::MAX.
            body[4..8].copy_from_slice(&(offset as u32).to_le_bytes());
            body[FRAGMENT_HEADER_LEN..].copy_from_slice(piece);
            offset += piece.len();
            self.open_len += MSG_PREFIX_LEN + len;
            self.open_count = 1;
            self.next_seq += 1;
            self.fragment_open = true;
            self.flush();
            self.counters.fragments += 1;
        }
        self.counters.messages += 1;
        self.counters.large_messages += 1;
        self.next_seq - 1
    }

    /// Seals the open datagram and returns it, ready to send on both lines;
    /// `None` if it holds no message. The returned bytes stay in the history.
    pub fn flush(&mut self) -> Option<&[u8]> {
        if self.open_count == 0 {
            return None;
        }
        self.claimed = None;
        self.claimed_large = false;
        self.open_since = None;
        let (open, first, count, len) = (
            self.open,
            self.open_first_seq(),
            self.open_count,
            self.open_len,
        );
        let (channel, session) = (self.cfg.channel, self.cfg.session);
        debug_assert_eq!(self.open_slot, self.slot_of(open));
        let slot = self.open_slot;
        let start = slot * self.cfg.max_datagram;
        let datagram = &mut self.slots[start..start + self.cfg.max_datagram];
        // The slot is max_datagram >= header bytes long: cannot fail.
        let _ = wire::write_datagram_header(datagram, Line::A, channel, session, first, count);
        if self.fragment_open {
            self.fragment_open = false;
            let _ = wire::set_fragment_version(datagram);
        }
        let len = if let Some(key) = &self.key {
            // Claims leave room for the tag: len + TAG_LEN <= max_datagram.
            let bytes = &mut datagram[..len + TAG_LEN];
            let tag = key.tag(&bytes[..len]);
            bytes[len..].copy_from_slice(&tag);
            len + TAG_LEN
        } else {
            len
        };
        self.meta[slot] = SlotMeta {
            first_seq: first,
            count,
            // len <= max_datagram <= u16::MAX (claims leave room for the tag).
            len: len as u16,
        };
        self.open += 1;
        self.open_slot = if slot + 1 == self.meta.len() {
            0
        } else {
            slot + 1
        };
        if self.open - self.oldest > self.cfg.history_depth as u64 {
            self.oldest += 1;
        }
        self.open_len = DATAGRAM_HEADER_LEN;
        self.open_count = 0;
        self.counters.datagrams += 1;
        Some(&self.slots[start..start + len])
    }

    /// Flushes the open datagram if it has waited `flush_interval_ns` since
    /// the first call that saw it non-empty. Call it every loop iteration.
    pub fn poll_flush(&mut self, now: u64) -> Option<&[u8]> {
        if self.open_count == 0 {
            return None;
        }
        let since = *self.open_since.get_or_insert(now);
        if now.saturating_sub(since) >= self.cfg.flush_interval_ns {
            self.flush()
        } else {
            None
        }
    }

    /// A heartbeat datagram (no messages, carrying the next sequence to be
    /// sent) so subscribers detect a lost tail. Not kept in the history.
    pub fn heartbeat(&mut self) -> &[u8] {
        let first = self.open_first_seq();
        let _ = wire::write_datagram_header(
            &mut self.heartbeat,
            Line::A,
            self.cfg.channel,
            self.cfg.session,
            first,
            0,
        );
        self.counters.heartbeats += 1;
        if let Some(key) = &self.key {
            let (body, tag) = self.heartbeat.split_at_mut(DATAGRAM_HEADER_LEN);
            tag.copy_from_slice(&key.tag(body));
            &self.heartbeat
        } else {
            &self.heartbeat[..DATAGRAM_HEADER_LEN]
        }
    }

    /// Answers a retransmit request from the history: a NotAvailable for the
    /// part older than the history (the whole range if the session or channel
    /// is not ours), then every datagram overlapping the rest, in order, then,
    /// for a part beyond what was ever sent (not yet flushed or not yet
    /// published), a NotAvailable from the publisher's end on: unlike the
    /// first, it starts at or after `oldest_available`.
    pub fn answer_retransmit(
        &mut self,
        req: &RetransmitRequest,
        mut emit: impl FnMut(RetransmitReply<'_>),
    ) {
        self.counters.retransmit_requests += 1;
        let oldest_available = self.oldest_available();
        let end = req.from_seq.saturating_add(req.count);
        let not_ours = req.session != self.cfg.session || req.channel != self.cfg.channel;
        let gone_end = if not_ours {
            end
        } else {
            end.min(oldest_available)
        };
        if req.from_seq < gone_end {
            self.counters.not_available += 1;
            emit(RetransmitReply::NotAvailable(NotAvailable {
                channel: self.cfg.channel,
                session: self.cfg.session,
                from_seq: req.from_seq,
                count: gone_end - req.from_seq,
                oldest_available,
            }));
        }
        if not_ours {
            return;
        }
        let published = self.open_first_seq();
        let start = req.from_seq.max(oldest_available);
        self.emit_history(start, end.min(published), &mut emit);
        // Beyond what was ever sent: nothing was lost there, whatever a
        // (forged) heartbeat claimed. Said so, from the publisher's end on,
        // so the subscriber forgets the range instead of declaring it lost.
        // Unlike the answer above (which ends at or before
        // `oldest_available`), this one starts at or after it.
        if end > published {
            let from = req.from_seq.max(published);
            self.counters.not_yet_published += 1;
            emit(RetransmitReply::NotAvailable(NotAvailable {
                channel: self.cfg.channel,
                session: self.cfg.session,
                from_seq: from,
                count: end - from,
                oldest_available,
            }));
        }
    }

    /// Emits every sealed datagram overlapping `[start, end)`, in order.
    fn emit_history(&mut self, start: u64, end: u64, emit: &mut impl FnMut(RetransmitReply<'_>)) {
        if start >= end {
            return;
        }
        // Sealed datagrams are in sequence order: binary search the first one
        // that ends after `start`.
        let (mut lo, mut hi) = (self.oldest, self.open);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let m = self.sealed(mid).1;
            if m.first_seq + u64::from(m.count) <= start {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let mut sent = 0;
        for idx in lo..self.open {
            let (bytes, m) = self.sealed(idx);
            if m.first_seq >= end {
                break;
            }
            emit(RetransmitReply::Data(bytes));
            sent += 1;
        }
        self.counters.retransmitted_datagrams += sent;
    }
}

/// Datagram pacing by the generic cell rate algorithm: at most `rate`
/// datagrams per second on average, bursts of up to `burst` back to back.
/// The pacer only answers; the caller decides whether to wait or keep
/// batching.
#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    interval_ns: u64,
    tolerance_ns: u64,
    /// Theoretical arrival time of the next datagram.
    tat: u64,
}

impl Pacer {
    /// `rate == 0` disables pacing.
    pub fn new(rate_per_sec: u64, burst: u64) -> Self {
        let interval_ns = 1_000_000_000u64
            .checked_div(rate_per_sec)
            .map_or(0, |ns| ns.max(1));
        Pacer {
            interval_ns,
            tolerance_ns: interval_ns.saturating_mul(burst.max(1) - 1),
            tat: 0,
        }
    }

    /// Takes a send slot at `now` if one is free.
    pub fn try_acquire(&mut self, now: u64) -> bool {
        if self.interval_ns == 0 {
            return true;
        }
        let tat = self.tat.max(now);
        if tat - now > self.tolerance_ns {
            return false;
        }
        self.tat = tat + self.interval_ns;
        true
    }

    /// Earliest time [`try_acquire`](Self::try_acquire) can succeed.
    pub fn next_allowed(&self, now: u64) -> u64 {
        let earliest = self.tat.saturating_sub(self.tolerance_ns);
        earliest.max(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcast::wire::Datagram;

    fn cfg(depth: usize) -> PublisherConfig {
        PublisherConfig {
            channel: 3,
            session: 10,
            max_datagram: 24 + 3 * (2 + 8),
            max_messages: 100,
            flush_interval_ns: 1_000,
            history_depth: depth,
            max_message_bytes: 0,
        }
    }

    /// Publishes `n` 8-byte messages (the seq, little-endian), flushing on full.
    fn publish_n(p: &mut PublisherState, n: u64, out: &mut Vec<Vec<u8>>) {
        for _ in 0..n {
            let seq = p.next_seq();
            loop {
                match p.try_claim(8) {
                    Ok(buf) => {
                        buf.copy_from_slice(&seq.to_le_bytes());
                        break;
                    }
                    Err(ClaimError::Full) => out.push(p.flush().unwrap().to_vec()),
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(p.commit(), Some(seq));
        }
    }

    /// `publish_alone` is `publish` then `flush`: the same datagrams byte
    /// for byte (header, prefix, message, tag), sequences, counters and
    /// history, over more datagrams than the history holds (the open slot
    /// kept without a division wraps); with a message already open it
    /// declines and changes nothing.
    #[test]
    fn publish_alone_is_publish_then_flush() {
        for key in [None, Some(crate::auth::DatagramKey::derive(b"alone"))] {
            let mut cfg = cfg(3);
            cfg.max_datagram = 24 + 2 + 16 + TAG_LEN;
            let (mut a, mut b) = (PublisherState::new(cfg), PublisherState::new(cfg));
            a.set_datagram_key(key.clone());
            b.set_datagram_key(key.clone());
            for i in 0..11u64 {
                let msg: Vec<u8> = (0..(i % 17) as u8).map(|x| x ^ i as u8).collect();
                let (seq, got) = a.publish_alone(&msg).expect("nothing open, fits");
                let got = got.to_vec();
                assert_eq!(b.publish(&msg), Ok(seq));
                assert_eq!(
                    b.flush().expect("one message open"),
                    &got[..],
                    "datagram {i}"
                );
                assert_eq!(a.counters(), b.counters());
                assert_eq!(a.next_seq(), b.next_seq());
                assert_eq!(a.oldest_available(), b.oldest_available());
                for from in 1..=seq {
                    assert_eq!(a.sealed_from(from), b.sealed_from(from), "{from}");
                }
            }
            // Open message: declined, nothing changed; too large: declined.
            a.publish(&[1, 2]).unwrap();
            let before = (a.counters(), a.next_seq(), a.pending_messages());
            assert!(a.publish_alone(&[3]).is_none());
            assert_eq!(before, (a.counters(), a.next_seq(), a.pending_messages()));
            a.flush().unwrap();
            let too_large = vec![0u8; a.max_message_len() + 1];
            assert!(a.publish_alone(&too_large).is_none());
            assert_eq!(a.pending_messages(), 0);
        }
    }

    #[test]
    fn batches_and_sequences() {
        let mut p = PublisherState::new(cfg(4));
        let mut out = Vec::new();
        publish_n(&mut p, 7, &mut out);
        out.push(p.flush().unwrap().to_vec());
        assert!(p.flush().is_none());
        let firsts: Vec<_> = out
            .iter()
            .map(|d| {
                let d = Datagram::parse(d).unwrap();
                assert_eq!((d.channel(), d.session()), (3, 10));
                (d.first_seq(), d.count())
            })
            .collect();
        assert_eq!(firsts, vec![(1, 3), (4, 3), (7, 1)]);
        let seqs: Vec<u64> = out
            .iter()
            .flat_map(|d| {
                Datagram::parse(d)
                    .unwrap()
                    .messages()
                    .map(|(s, m)| {
                        assert_eq!(m, s.to_le_bytes());
                        s
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(seqs, (1..=7).collect::<Vec<_>>());
        assert_eq!(p.counters().datagrams, 3);
        assert_eq!(p.counters().messages, 7);
    }

    #[test]
    fn sealed_from_walks_the_history_in_order() {
        // 3 messages per datagram, history of 4 datagrams.
        let mut p = PublisherState::new(cfg(4));
        let mut out = Vec::new();
        publish_n(&mut p, 20, &mut out);
        // Datagrams 1-3, 4-6, ..., 16-18 sealed; 19-20 open. Only the last
        // four sealed ones (seq 7..=18) are kept.
        assert_eq!(out.len(), 6);
        assert_eq!(p.unflushed_seq(), 19);
        let (first, end, bytes) = p.sealed_from(1).unwrap();
        assert_eq!((first, end), (7, 10), "older datagrams were overwritten");
        assert_eq!(bytes, &out[2][..]);
        assert_eq!(p.sealed_from(8).unwrap().0, 7);
        assert_eq!(p.sealed_from(10).unwrap(), (10, 13, &out[3][..]));
        assert_eq!(
            p.sealed_from(17).unwrap(),
            (16, 19, &out[5][..]),
            "the newest sealed datagram"
        );
        assert_eq!(p.sealed_from(18).unwrap().0, 16);
        assert_eq!(p.sealed_from(19), None, "the open datagram is not sealed");
        p.flush().unwrap();
        assert_eq!(p.sealed_from(19).unwrap().0, 19);
    }

    #[test]
    fn claim_limits() {
        let mut p = PublisherState::new(PublisherConfig {
            max_messages: 2,
            ..cfg(1)
        });
        assert_eq!(p.max_message_len(), 28);
        assert_eq!(
            p.try_claim(29).unwrap_err(),
            ClaimError::TooLarge { len: 29, max: 28 }
        );
        p.publish(b"a").unwrap();
        p.publish(b"b").unwrap();
        assert_eq!(p.try_claim(1).unwrap_err(), ClaimError::Full);
        assert_eq!(p.commit(), None, "failed claim leaves nothing to commit");
        assert!(p.flush().is_some());
        assert_eq!(p.publish(b"c"), Ok(3));
    }

    #[test]
    fn abandoned_claim_is_not_sent() {
        let mut p = PublisherState::new(cfg(1));
        p.try_claim(8).unwrap().fill(0xee);
        p.publish(b"x").unwrap();
        let d = p.flush().unwrap().to_vec();
        let d = Datagram::parse(&d).unwrap();
        assert_eq!(d.messages().collect::<Vec<_>>(), vec![(1, &b"x"[..])]);
    }

    /// What an `MdClaim` reads and writes is the claim's bytes, small or large, and an
    /// abandoned claim (aborted, or dropped) leaves nothing behind, not even its size.
    #[test]
    fn claimed_bytes_are_the_claim_and_an_abandoned_large_claim_is_forgotten() {
        let mut p = PublisherState::new(PublisherConfig {
            max_message_bytes: 200,
            ..cfg(64)
        });
        assert!(p.claimed().is_empty(), "nothing claimed");
        p.try_claim(5).unwrap();
        p.claimed_mut().copy_from_slice(b"small");
        assert_eq!(p.claimed(), b"small");
        assert_eq!(p.commit(), Some(1));
        p.try_claim(100).unwrap().fill(0xab); // larger than a datagram: staged
        assert_eq!(p.claimed(), &[0xab; 100][..]);
        p.abort();
        assert!(p.claimed().is_empty());
        assert_eq!(p.commit(), None, "aborted: nothing to commit");
        // Dropped without commit or abort (what dropping an `MdClaim` does), then a
        // small message: it goes out as itself, not as fragments of the staging buffer.
        p.try_claim(150).unwrap().fill(0xcd);
        assert_eq!(p.publish(b"x"), Ok(2));
        let mut msgs = Vec::new();
        while let Some(d) = p.flush() {
            let d = Datagram::parse(d)
                .unwrap()
                .messages()
                .map(|(s, m)| (s, m.to_vec()));
            msgs.extend(d.collect::<Vec<_>>());
        }
        assert_eq!(msgs, vec![(1, b"small".to_vec()), (2, b"x".to_vec())]);
        assert_eq!(p.counters().large_messages, 0);
    }

    #[test]
    fn poll_flush_waits_for_interval() {
        let mut p = PublisherState::new(cfg(1));
        assert!(p.poll_flush(0).is_none());
        p.publish(b"x").unwrap();
        assert!(p.poll_flush(100).is_none());
        assert!(p.poll_flush(1_099).is_none());
        assert!(p.poll_flush(1_100).is_some());
        assert!(p.poll_flush(5_000).is_none());
    }

    #[test]
    fn heartbeat_carries_next_seq() {
        let mut p = PublisherState::new(cfg(1));
        p.publish(b"x").unwrap();
        let hb = Datagram::parse(p.heartbeat()).unwrap();
        assert!(hb.is_heartbeat());
        assert_eq!(hb.first_seq(), 1, "unflushed message not announced");
        p.flush();
        assert_eq!(Datagram::parse(p.heartbeat()).unwrap().first_seq(), 2);
    }

    fn answer(
        p: &mut PublisherState,
        from: u64,
        count: u64,
    ) -> (Vec<(u64, u16)>, Vec<NotAvailable>) {
        let (mut data, mut na) = (Vec::new(), Vec::new());
        let req = RetransmitRequest {
            channel: 3,
            session: 10,
            from_seq: from,
            count,
        };
        p.answer_retransmit(&req, |r| match r {
            RetransmitReply::Data(b) => {
                let d = Datagram::parse(b).unwrap();
                data.push((d.first_seq(), d.count()));
            }
            RetransmitReply::NotAvailable(n) => na.push(n),
        });
        (data, na)
    }

    #[test]
    fn retransmits_from_history_or_not_available() {
        let mut p = PublisherState::new(cfg(2));
        let mut out = Vec::new();
        publish_n(&mut p, 10, &mut out); // sealed [1,4) [4,7) [7,10), open [10]
        assert_eq!(p.oldest_available(), 4, "depth 2 keeps the last two");
        // Fully available, mid-datagram start.
        assert_eq!(answer(&mut p, 5, 3), (vec![(4, 3), (7, 3)], vec![]));
        // Partly too old.
        let (data, na) = answer(&mut p, 2, 4);
        assert_eq!(data, vec![(4, 3)]);
        assert_eq!(
            na,
            vec![NotAvailable {
                channel: 3,
                session: 10,
                from_seq: 2,
                count: 2,
                oldest_available: 4
            }]
        );
        // The unflushed message is not served: it was never sent, and the
        // answer says so (it starts at or after `oldest_available`).
        let never = |from_seq, count| NotAvailable {
            channel: 3,
            session: 10,
            from_seq,
            count,
            oldest_available: 4,
        };
        assert_eq!(answer(&mut p, 10, 1), (vec![], vec![never(10, 1)]));
        // Reaching beyond what was sent (a forged heartbeat made the
        // subscriber ask): what was sent, then never published from the end.
        assert_eq!(answer(&mut p, 8, 20), (vec![(7, 3)], vec![never(10, 18)]));
        assert_eq!(answer(&mut p, 30, 5), (vec![], vec![never(30, 5)]));
        assert_eq!(p.counters().not_yet_published, 3);
        // Wrong session: everything unavailable.
        let mut na = Vec::new();
        p.answer_retransmit(
            &RetransmitRequest {
                channel: 3,
                session: 9,
                from_seq: 5,
                count: 1,
            },
            |r| {
                if let RetransmitReply::NotAvailable(n) = r {
                    na.push(n.count)
                }
            },
        );
        assert_eq!(na, vec![1]);
        let c = p.counters();
        assert_eq!(c.retransmit_requests, 6);
        assert_eq!(c.retransmitted_datagrams, 4);
        assert_eq!(c.not_available, 2, "the never-published answers apart");
        // Retransmitted bytes equal the originals.
        p.answer_retransmit(
            &RetransmitRequest {
                channel: 3,
                session: 10,
                from_seq: 7,
                count: 1,
            },
            |r| assert_eq!(r, RetransmitReply::Data(&out[2])),
        );
    }

    #[test]
    fn repair_extent_cuts_at_whole_datagrams() {
        let mut p = PublisherState::new(cfg(4));
        let mut out = Vec::new();
        // Datagrams [1,4) [4,7) [7,10) [10,13), 54 bytes each; 13 open.
        publish_n(&mut p, 13, &mut out);
        let len = out[0].len() as u64;
        assert_eq!(p.repair_extent(1, 13, u64::MAX, 0), (13, 4 * len));
        // Room for two and a half: two, the range cut at the third.
        assert_eq!(p.repair_extent(2, 13, 2 * len + len / 2, 0), (7, 2 * len));
        // With 24 bytes of header each, only one fits.
        assert_eq!(p.repair_extent(2, 13, 2 * len + len / 2, 40), (4, len));
        // At least one datagram, whatever the limit.
        assert_eq!(p.repair_extent(5, 13, 1, 0), (7, len));
        // Nothing flushed in the range: nothing to cut.
        assert_eq!(p.repair_extent(13, 20, 1, 0), (20, 0));
        assert_eq!(p.repair_extent(5, 6, 1, 0), (6, len));
    }

    #[test]
    fn history_wraps_many_times() {
        let mut p = PublisherState::new(cfg(5));
        let mut out = Vec::new();
        publish_n(&mut p, 3 * 1000, &mut out);
        out.push(p.flush().unwrap().to_vec());
        assert_eq!(p.oldest_available(), 3000 - 15 + 1);
        let (data, na) = answer(&mut p, 1, 3000);
        assert_eq!(na.len(), 1);
        assert_eq!(na[0].count, 2985);
        assert_eq!(data.len(), 5);
        assert_eq!(data[0], (2986, 3));
    }

    #[test]
    fn pacer_limits_rate_and_burst() {
        let mut pacer = Pacer::new(1_000_000, 2); // 1 per µs, burst 2
        assert!(pacer.try_acquire(0));
        assert!(pacer.try_acquire(0));
        assert!(!pacer.try_acquire(0));
        assert_eq!(pacer.next_allowed(0), 1_000);
        assert!(pacer.try_acquire(1_000));
        assert!(!pacer.try_acquire(1_500));
        let mut off = Pacer::new(0, 1);
        assert!((0..100).all(|_| off.try_acquire(0)));
    }
}
