//! The checkpoint writer: builds the next journal segment's checkpoint off the service
//! thread, from an immutable copy of the state, and writes it beside the journal.
//!
//! The immutable copy is the current segment itself: the service appends a
//! [`record::CUT`] in an ordinary append and applies it where it stands
//! ([`Gateway::checkpoint_written`]); what the segment holds before the cut never changes.
//! The writer replays that prefix into a fresh [`Gateway`] through the same replay path a
//! start uses ([`journal::replay_prefix_in`]), so the state it encodes is the state a
//! restart would rebuild there, with no pass over the live state on the service thread. It
//! then writes `FILE.next` ([`journal::prepare_segment_in`]) and catches up
//! ([`journal::catch_up_in`]): it copies the records the service appended after the cut
//! behind the checkpoint, reading the live segment only up to the end of its last
//! completed append, round after round until at most [`CatchUp::slack`] bytes are left,
//! fdatasyncs the live segment (so the seal on the service thread syncs only what came
//! since), copies what came meanwhile and syncs `FILE.next`. The service puts it in place
//! with a short switch ([`Journal::switch_prepared`](crate::journal::Journal::switch_prepared))
//! that copies only the rest, so the new segment restores to exactly the live state.
//!
//! A job is a value: the service runs it on a thread of its own, the simulator and the tests
//! run it in line ([`CheckpointJob::run`]), over the same storage and fault hooks. It owns no
//! decision: when to cut, what to do when it fails (back off, cut again later) and when to
//! switch are the driver's.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use crate::checkpoint::CheckpointError;
use crate::fix::SessionConfig;
use crate::gateway::{record, Gateway};
use crate::journal::{self, CatchUp, JournalError, PreparedSegment, Storage, StorageFaults};
use crate::risk::{RiskConfig, RiskConfigError};

/// A checkpoint to build at a cut of the current segment.
#[derive(Debug)]
pub struct CheckpointJob {
    /// The journal's storage.
    pub fs: Arc<dyn Storage>,
    /// The journal (its current segment).
    pub path: PathBuf,
    /// Offset of the [`record::CUT`] record in the current segment.
    pub cut: u64,
    /// What the gateway is built with (as at a start).
    pub session: SessionConfig,
    /// Risk configuration (as at a start).
    pub risk: RiskConfig,
    /// The end of the current segment's last completed append ([`journal::Journal::appended`]).
    pub appended: Arc<AtomicU64>,
    /// How far to catch up before the switch.
    pub catch_up: CatchUp,
}

/// A checkpoint written as the first record of `FILE.next`, ready for the switch.
#[derive(Debug)]
pub struct Written {
    /// The next segment's file.
    pub prepared: PreparedSegment,
    /// End of the cut record: the records after it go after the checkpoint.
    pub cut_end: u64,
    /// Bytes of records appended after the cut the writer copied (the switch copies the
    /// rest).
    pub caught_up: u64,
    /// Bytes of the checkpoint record.
    pub checkpoint_bytes: u64,
    /// Wall time the job took, nanoseconds.
    pub took_ns: u64,
}

/// A checkpoint job that failed; the current segment stays in use, nothing is lost.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriterError {
    /// Reading the segment's prefix or writing `FILE.next` failed. When the fdatasync of
    /// the current segment failed ([`JournalError::SyncCurrent`]) the journal must re-check
    /// what it has not synced ([`journal::Journal::distrust_unsynced`]).
    #[error("checkpoint writer")]
    Journal(#[from] JournalError),
    /// The prefix did not replay into a state (an unknown record: the start would stop too).
    #[error("checkpoint writer: replaying the segment")]
    Replay(#[from] CheckpointError),
    /// The gateway could not be built.
    #[error("checkpoint writer: risk configuration")]
    Risk(#[from] RiskConfigError),
    /// The writer thread is gone (it panicked).
    #[error("checkpoint writer thread ended without an answer")]
    Gone,
}

impl CheckpointJob {
    /// Replays the segment up to the cut, encodes the checkpoint, writes `FILE.next` and
    /// catches up with the segment (with `faults`, the simulator's, on its writes and
    /// syncs).
    pub fn run(
        self,
        mut faults: Option<&mut (dyn StorageFaults + 'static)>,
    ) -> Result<Written, WriterError> {
        let t0 = Instant::now();
        let mut gw = Gateway::new(self.session, &self.risk)?;
        let cut =
            journal::replay_prefix_in(&*self.fs, &self.path, self.cut, record::CUT, |k, p| {
                gw.replay_record(k, p)
            })?;
        if let Some(e) = gw.take_replay_error() {
            return Err(e.into());
        }
        let payload = gw.checkpoint()?;
        drop(gw);
        let mut prepared = journal::prepare_segment_in(
            &*self.fs,
            &self.path,
            cut,
            record::CHECKPOINT,
            &payload,
            faults.as_deref_mut(),
        )?;
        drop(payload);
        journal::catch_up_in(
            &*self.fs,
            &self.path,
            &mut prepared,
            &self.appended,
            self.catch_up,
            faults,
        )?;
        Ok(Written {
            checkpoint_bytes: prepared.first_len(),
            caught_up: prepared.copied(),
            prepared,
            cut_end: cut.end,
            took_ns: t0.elapsed().as_nanos() as u64,
        })
    }
}
