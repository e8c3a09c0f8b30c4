//! The application side of the market-data path: message handler and
//! snapshot traits, and the encoder a snapshot server uses.
//!
//! The application (an order book, a price cache) owns its state; rocebus only
//! moves its serialised bytes. A snapshot server holds a [`Snapshot`] that is
//! fed the same stream (typically the publisher's own book, or a lossless
//! subscriber next to it); a re-synchronising subscriber restores through
//! [`SnapshotSink`].

use super::wire::{self, SnapshotEnd};

/// Receives messages strictly in sequence order. Implemented for every
/// `FnMut(u64, &[u8])`, so a closure is a handler.
pub trait Handler {
    /// One message; `seq` is exactly one more than the previous call's, except
    /// after a snapshot was applied (then it is the snapshot's sequence + 1).
    ///
    /// A large message (reassembled from fragments, each of which took a
    /// sequence) comes with the sequence of its last fragment, so the next
    /// call's `seq` is one more than that.
    fn on_message(&mut self, seq: u64, msg: &[u8]);

    /// Gap-tolerant delivery only: sequences `[from, to)` were lost for good
    /// and skipped; the next message has sequence `to` or later (`to` may be
    /// the middle of a large message cut by the hole, whose remaining
    /// fragments are dropped). Strict subscribers never call it. The default
    /// does nothing.
    fn on_gap(&mut self, from: u64, to: u64) {
        let _ = (from, to);
    }
}

impl<F: FnMut(u64, &[u8])> Handler for F {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        self(seq, msg)
    }
}

/// State that can serialise itself for late joiners and re-synchronisation.
pub trait Snapshot {
    /// Sequence of the last message reflected in the state (0: none yet;
    /// sequences start at 1).
    fn snapshot_seq(&self) -> u64;
    /// Appends the serialised state to `out`.
    fn write_snapshot(&self, out: &mut Vec<u8>);
}

/// The application refused snapshot bytes (corrupt or from an incompatible
/// version). The subscriber asks for a new snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("snapshot rejected by the application")]
pub struct RestoreError;

/// State that can be replaced by a snapshot, received in chunks.
///
/// Call order: `begin_restore`, zero or more `restore_chunk` with consecutive
/// pieces, then `finish_restore`. A `begin_restore` may come again at any
/// time (a transfer was aborted): discard what was staged.
pub trait SnapshotSink {
    /// A new snapshot transfer starts.
    fn begin_restore(&mut self);
    /// The next piece of the serialised state.
    fn restore_chunk(&mut self, data: &[u8]) -> Result<(), RestoreError>;
    /// All pieces arrived (length and CRC verified); replace the state. The
    /// state then reflects every message up to `snapshot_seq`.
    fn finish_restore(&mut self, snapshot_seq: u64) -> Result<(), RestoreError>;
}

/// A [`Handler`] (a plain closure, say) for an application that keeps no
/// state worth a snapshot: `poll` takes it as handler and snapshot sink.
/// When the subscriber starts from, or re-synchronises through, a snapshot,
/// the snapshot's bytes are ignored and the handler is told, as a gap, which
/// sequences it did not see: `on_gap(from, to)` with `to` the snapshot's
/// sequence + 1, the next one it gets.
///
/// ```no_run
/// # use rocebus::{clock::Mono, mcast::{McastSubscriber, snapshot::NoSnapshots}};
/// # fn f(sub: &mut McastSubscriber) -> Result<(), rocebus::mcast::NetError> {
/// let mut quotes = NoSnapshots::new(|seq: u64, msg: &[u8]| println!("{seq}: {} B", msg.len()));
/// sub.poll(Mono::now(), &mut quotes, 16)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct NoSnapshots<H> {
    handler: H,
    /// The last sequence the handler saw (or was told it missed).
    last: u64,
}

impl<H: Handler> NoSnapshots<H> {
    /// Wraps `handler`.
    pub fn new(handler: H) -> Self {
        Self { handler, last: 0 }
    }

    /// The wrapped handler.
    pub fn handler(&self) -> &H {
        &self.handler
    }

    /// The wrapped handler, mutably.
    pub fn handler_mut(&mut self) -> &mut H {
        &mut self.handler
    }

    /// Unwraps the handler.
    pub fn into_inner(self) -> H {
        self.handler
    }
}

impl<H: Handler> Handler for NoSnapshots<H> {
    #[inline]
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        self.last = seq;
        self.handler.on_message(seq, msg);
    }

    fn on_gap(&mut self, from: u64, to: u64) {
        self.last = self.last.max(to.saturating_sub(1));
        self.handler.on_gap(from, to);
    }
}

impl<H: Handler> SnapshotSink for NoSnapshots<H> {
    fn begin_restore(&mut self) {}

    fn restore_chunk(&mut self, _data: &[u8]) -> Result<(), RestoreError> {
        Ok(())
    }

    fn finish_restore(&mut self, snapshot_seq: u64) -> Result<(), RestoreError> {
        if snapshot_seq > self.last {
            self.handler.on_gap(self.last + 1, snapshot_seq + 1);
            self.last = snapshot_seq;
        }
        Ok(())
    }
}

/// Encodes `state` (serialised at `snapshot_seq`) as SnapshotChunk messages of
/// at most `max_chunk` data bytes followed by a SnapshotEnd, handing each
/// encoded message to `emit`. Runs on the snapshot server, off the hot path:
/// it allocates one scratch buffer.
pub fn encode_snapshot(
    channel: u16,
    session: u64,
    snapshot_seq: u64,
    state: &[u8],
    max_chunk: usize,
    mut emit: impl FnMut(&[u8]),
) {
    let max_chunk = max_chunk.max(1);
    let mut buf = vec![0u8; wire::snapshot_chunk_len(max_chunk).max(SnapshotEnd::LEN)];
    let mut offset = 0usize;
    for piece in state.chunks(max_chunk) {
        // The buffer is sized for the largest chunk: encoding cannot fail.
        if let Ok(n) = wire::encode_snapshot_chunk(
            &mut buf,
            channel,
            session,
            snapshot_seq,
            offset as u64,
            piece,
        ) {
            emit(&buf[..n]);
        }
        offset += piece.len();
    }
    let end = SnapshotEnd {
        channel,
        session,
        snapshot_seq,
        total_len: state.len() as u64,
        crc32: crc32fast::hash(state),
    };
    if let Ok(n) = end.encode(&mut buf) {
        emit(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcast::wire::{decode_recovery, RecoveryMsg};

    #[test]
    fn snapshot_is_chunked_and_checksummed() {
        let state: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
        let mut msgs = Vec::new();
        encode_snapshot(3, 9, 77, &state, 100, |m| msgs.push(m.to_vec()));
        assert_eq!(msgs.len(), 4);
        let mut joined = Vec::new();
        for m in &msgs[..3] {
            match decode_recovery(m).unwrap().0 {
                RecoveryMsg::SnapshotChunk {
                    channel: 3,
                    session: 9,
                    snapshot_seq: 77,
                    offset,
                    data,
                } => {
                    assert_eq!(offset, joined.len() as u64);
                    joined.extend_from_slice(data);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(joined, state);
        match decode_recovery(&msgs[3]).unwrap().0 {
            RecoveryMsg::SnapshotEnd(end) => {
                assert_eq!(end.total_len, 250);
                assert_eq!(end.crc32, crc32fast::hash(&state));
                assert_eq!(end.snapshot_seq, 77);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn empty_snapshot_is_just_an_end() {
        let mut n = 0;
        encode_snapshot(1, 1, 0, &[], 64, |m| {
            n += 1;
            assert!(matches!(
                decode_recovery(m).unwrap().0,
                RecoveryMsg::SnapshotEnd(SnapshotEnd { total_len: 0, .. })
            ));
        });
        assert_eq!(n, 1);
    }
}
