//! Fan-in for a receiver of many orders connections (a gateway serving
//! engines): poll only the connections whose peer marked new frames,
//! instead of every ring on every turn.
//!
//! A listener with `fanin_slots > 0` maps one activity summary (a byte per
//! slot, [`crate::ring::fanin`]) and grants each initiator that asks (all
//! of ours do) a slot in the handshake: the slot's address and the rkey of
//! a memory region covering that one byte, registered in the connection's
//! own protection domain, bound by both proofs ([`crate::auth`]). After
//! each flush the initiator posts one more inline RDMA WRITE of one byte to
//! its slot, on the same queue pair and with the same doorbell as the
//! frames. The receiver scans the summary, clears each mark, then polls
//! that ring (the ORDERING argument is in [`crate::ring::fanin`]).
//!
//! [`ConnectionSet`] owns connections and does all of it;
//! [`FanIn`] is the scanner alone, for a caller that keeps its connections
//! in its own structures (the order gateway). Connections without a slot
//! (fan-in off, slots exhausted, or accepted by another listener) are
//! polled on every turn, as before. Every turn also *sweeps* one
//! connection round robin, marked or not: its idle poll returns credit,
//! reaps completions and notices a disconnect, so an idle engine's health
//! is still watched, one connection per turn.

use super::{Connection, Frame, OrdersError};
use crate::ring::fanin::{ActivityMemory, ScanStats, Scanner, Visit};
use crate::ring::mem::ActivityRegion;
use crate::verbs::{MemoryRegion, ProtectionDomain, VerbsError};
use std::sync::{Arc, Mutex};

/// A listener's activity summary and its free slots.
#[derive(Debug)]
pub(crate) struct Activity {
    region: ActivityRegion,
    free: Mutex<Vec<u32>>,
}

impl Activity {
    pub(crate) fn new(slots: usize) -> Result<Arc<Self>, VerbsError> {
        Ok(Arc::new(Self {
            region: ActivityRegion::new(slots)?,
            // Lowest slots first: the summary words scanned stay few.
            free: Mutex::new((0..slots as u32).rev().collect()),
        }))
    }

    /// Takes a free slot and registers its byte in `pd`; `None` when all
    /// slots are taken (the connection is then polled every turn).
    pub(crate) fn grant(
        self: &Arc<Self>,
        pd: &Arc<ProtectionDomain>,
    ) -> Result<Option<GrantedSlot>, VerbsError> {
        let Some(slot) = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop() else {
            return Ok(None);
        };
        self.region.clear(slot as usize);
        // Built before registering: a failed registration drops it, which
        // gives the slot back.
        let mut g = GrantedSlot {
            mr: None,
            slot,
            activity: self.clone(),
        };
        g.mr = Some(self.region.register_slot(pd, slot as usize)?);
        Ok(Some(g))
    }
}

/// An accepted connection's slot: its byte's registration and its place
/// in the free list, given back when the connection is dropped.
#[derive(Debug)]
pub(crate) struct GrantedSlot {
    mr: Option<MemoryRegion>,
    slot: u32,
    activity: Arc<Activity>,
}

impl GrantedSlot {
    pub(crate) fn slot(&self) -> u32 {
        self.slot
    }
    /// Address and rkey the peer marks.
    pub(crate) fn remote(&self) -> (u64, u32) {
        let mr = self.mr.as_ref().expect("registered while granted");
        (mr.addr(), mr.rkey())
    }
}

impl Drop for GrantedSlot {
    fn drop(&mut self) {
        // Deregister first, so the old peer can no longer mark the byte,
        // then free the slot for the next connection.
        drop(self.mr.take());
        self.activity
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.slot);
    }
}

/// Where an initiator writes its mark (from the listener's grant).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
}

/// The byte a mark writes (any nonzero value would do).
pub(crate) const MARK_BYTE: [u8; 1] = [1];

/// The scanner of one listener's activity summary, for a caller that
/// keeps its own connections: [`slot_of`](Self::slot_of) tells which slot
/// an accepted connection marks, [`scan`](Self::scan) which slots were
/// marked since the last scan. Built by [`super::OrdersListener::fan_in`].
#[derive(Debug)]
pub struct FanIn {
    activity: Option<Arc<Activity>>,
    scanner: Scanner,
}

impl FanIn {
    pub(crate) fn new(activity: Option<Arc<Activity>>) -> Self {
        let slots = activity.as_ref().map_or(0, |a| a.region.slots());
        Self {
            activity,
            scanner: Scanner::new(slots),
        }
    }

    /// Whether the listener grants slots (`fanin_slots > 0`).
    pub fn enabled(&self) -> bool {
        self.activity.is_some()
    }

    /// Slots of the summary.
    pub fn slots(&self) -> usize {
        self.scanner.slots()
    }

    /// The slot `conn` marks in this summary; `None` if it has none here
    /// (poll it every turn).
    pub fn slot_of(&self, conn: &Connection) -> Option<usize> {
        let g = conn.fanin.as_ref()?;
        let mine = self.activity.as_ref()?;
        Arc::ptr_eq(&g.activity, mine).then_some(g.slot() as usize)
    }

    /// Hands `visit` each slot marked since the last scan (its mark
    /// cleared first) and each slot whose last visit returned
    /// [`Visit::Again`]. Returns how many.
    #[inline]
    pub fn scan<F: FnMut(usize) -> Visit>(&mut self, visit: F) -> usize {
        match &self.activity {
            Some(a) => self.scanner.scan(&a.region, visit),
            None => 0,
        }
    }

    /// Counts a visit whose poll found nothing.
    pub fn count_wasted(&mut self) {
        self.scanner.count_wasted();
    }

    /// Forgets a pending revisit of `slot` (its connection left).
    pub fn forget(&mut self, slot: usize) {
        self.scanner.forget(slot);
    }

    /// Visits `slot` on the next scan whatever its mark (e.g. a connection
    /// that joins the caller's polling after marks were already taken).
    pub fn revisit(&mut self, slot: usize) {
        self.scanner.revisit(slot);
    }

    /// Counters.
    pub fn stats(&self) -> ScanStats {
        self.scanner.stats()
    }

    /// Summary words a scan reads (8 slots each).
    pub fn summary_words(&self) -> usize {
        self.activity.as_ref().map_or(0, |a| a.region.words())
    }
}

/// A connection's handle in a [`ConnectionSet`].
pub type ConnId = usize;

/// A connection of a [`ConnectionSet`] failed.
#[derive(Debug, thiserror::Error)]
#[error("connection {id}: {error}")]
pub struct SetError {
    /// Which (still in the set: [`ConnectionSet::remove`] it).
    pub id: ConnId,
    /// Why.
    #[source]
    pub error: OrdersError,
}

/// Counters of a [`ConnectionSet`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetStats {
    /// The scanner's counters (marked visits, wasted ones).
    pub scan: ScanStats,
    /// Polls of connections without a slot (one per turn each).
    pub unmarked_polls: u64,
    /// Sweep polls (one per turn).
    pub sweeps: u64,
}

#[derive(Debug)]
struct Member {
    conn: Connection,
    slot: Option<usize>,
}

/// Connections accepted by one listener, polled through its activity
/// summary: a turn costs a scan of the summary, the polls of the marked
/// connections, one sweep poll, and one poll per connection without a slot.
///
/// ```no_run
/// # use rocebus::orders::{ConnectionSet, OrdersConfig, OrdersListener};
/// # use std::time::Duration;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = OrdersConfig { token: "s3cret".into(), fanin_slots: 256, ..OrdersConfig::default() };
/// let mut listener = OrdersListener::bind(cfg, "198.18.0.1:7470".parse()?)?;
/// let mut set = ConnectionSet::new(&listener);
/// while let Some(c) = listener.accept(Duration::from_secs(1))? {
///     set.insert(c);
/// }
/// loop {
///     if let Err(e) = set.poll(|id, f| println!("{id}: {} bytes", f.payload.len()), 16) {
///         set.remove(e.id);
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct ConnectionSet {
    fanin: FanIn,
    members: Vec<Option<Member>>,
    free_ids: Vec<ConnId>,
    /// Slot -> member, `usize::MAX` for none.
    by_slot: Vec<ConnId>,
    unmarked: Vec<ConnId>,
    sweep: usize,
    sweep_every: u32,
    turn: u32,
    stats: SetStats,
}

impl ConnectionSet {
    /// An empty set for connections accepted by `listener`.
    pub fn new(listener: &super::OrdersListener) -> Self {
        let fanin = listener.fan_in();
        Self {
            by_slot: vec![usize::MAX; fanin.slots()],
            fanin,
            members: Vec::new(),
            free_ids: Vec::new(),
            unmarked: Vec::new(),
            sweep: 0,
            sweep_every: 1,
            turn: 0,
            stats: SetStats::default(),
        }
    }

    /// Adds `conn`; returns its id.
    pub fn insert(&mut self, conn: Connection) -> ConnId {
        let slot = self.fanin.slot_of(&conn);
        let m = Member { conn, slot };
        let id = match self.free_ids.pop() {
            Some(id) => {
                self.members[id] = Some(m);
                id
            }
            None => {
                self.members.push(Some(m));
                self.members.len() - 1
            }
        };
        match slot {
            Some(s) => {
                self.by_slot[s] = id;
                // Marks it made before joining may have been taken already.
                self.fanin.revisit(s);
            }
            None => self.unmarked.push(id),
        }
        id
    }

    /// Sweeps one connection every `turns` turns (default 1; 0: never,
    /// for tests that must find frames through marks alone: an idle
    /// connection then returns credit and notices a disconnect only when
    /// its peer marks).
    pub fn set_sweep_every(&mut self, turns: u32) {
        self.sweep_every = turns;
    }

    /// Takes connection `id` out of the set.
    pub fn remove(&mut self, id: ConnId) -> Option<Connection> {
        let m = self.members.get_mut(id)?.take()?;
        match m.slot {
            Some(s) => {
                self.by_slot[s] = usize::MAX;
                self.fanin.forget(s);
            }
            None => self.unmarked.retain(|&u| u != id),
        }
        self.free_ids.push(id);
        Some(m.conn)
    }

    /// Connection `id`.
    pub fn get(&self, id: ConnId) -> Option<&Connection> {
        self.members.get(id)?.as_ref().map(|m| &m.conn)
    }

    /// Connection `id`, to send on (e.g. a reply to a frame [`poll`](Self::poll)
    /// delivered: collect what to send in the handler, send after the poll).
    pub fn get_mut(&mut self, id: ConnId) -> Option<&mut Connection> {
        self.members.get_mut(id)?.as_mut().map(|m| &mut m.conn)
    }

    /// Connections in the set.
    pub fn len(&self) -> usize {
        self.members.len() - self.free_ids.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections that mark the summary (the rest are polled every turn).
    pub fn marked(&self) -> usize {
        self.len() - self.unmarked.len()
    }

    /// Counters.
    pub fn stats(&self) -> SetStats {
        SetStats {
            scan: self.fanin.stats(),
            ..self.stats
        }
    }

    /// One turn: delivers up to `max` frames per connection polled to
    /// `handler` with the connection's id, in order per connection. A
    /// failed connection stops nothing else; the first failure of the turn
    /// is returned (the connection stays in the set until removed, and
    /// keeps failing).
    pub fn poll<F: FnMut(ConnId, Frame<'_>)>(
        &mut self,
        mut handler: F,
        max: usize,
    ) -> Result<usize, SetError> {
        let mut delivered = 0;
        let mut failed: Option<SetError> = None;
        let Self {
            fanin,
            members,
            by_slot,
            unmarked,
            sweep,
            sweep_every,
            turn,
            stats,
            ..
        } = self;
        let n_members = members.len();
        let mut poll_one = |id: ConnId, failed: &mut Option<SetError>| -> usize {
            let Some(Some(m)) = members.get_mut(id) else {
                return 0;
            };
            match m.conn.subscription().poll(|f| handler(id, f), max) {
                Ok(n) => n,
                Err(error) => {
                    if failed.is_none() {
                        *failed = Some(SetError { id, error });
                    }
                    0
                }
            }
        };
        let mut wasted = 0u64;
        fanin.scan(|slot| {
            let id = by_slot[slot];
            if id == usize::MAX {
                wasted += 1;
                return Visit::Done;
            }
            let n = poll_one(id, &mut failed);
            delivered += n;
            if n == 0 {
                wasted += 1;
            }
            if max > 0 && n == max {
                Visit::Again
            } else {
                Visit::Done
            }
        });
        for &id in unmarked.iter() {
            delivered += poll_one(id, &mut failed);
            stats.unmarked_polls += 1;
        }
        *turn = turn.wrapping_add(1);
        if *sweep_every > 0 && *turn % *sweep_every == 0 && n_members > 0 {
            *sweep = (*sweep + 1) % n_members;
            delivered += poll_one(*sweep, &mut failed);
            stats.sweeps += 1;
        }
        for _ in 0..wasted {
            fanin.count_wasted();
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(delivered),
        }
    }
}
