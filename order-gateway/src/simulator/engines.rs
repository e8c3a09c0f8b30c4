//! The simulated engines' connections: the engine side of an orders connection (a ring of
//! frames the gateway writes and the engine reads at its own pace, frames the engine writes
//! for the gateway to poll) and the gateway side as [`EngineWire`], so that the service's
//! own code ([`crate::engine_io`]) drives them through [`EngineLinks`](crate::gateway::EngineLinks).
//!
//! An orders connection is a reliable connection (RC): frames are neither lost, doubled
//! nor reordered while it is up. What a reliable link can do, and what is modelled: stall
//! (an engine that stops reading, writing, or both, for a while), fill (a ring the engine
//! does not read), and end (either side closes it; frames not read by then are lost with
//! it, and the engine learns what it missed from the gateway's replay at its next logon).
//!
//! Must not read a clock or touch files.

use std::collections::{HashSet, VecDeque};

use rocebus::clock::Wall;

use crate::client::Client;
use crate::engine_io::{EngineWire, WireError};
use crate::gateway::{CloseReason, ConnId, DisconnectReason, EngineId};
use crate::proto::{Response, Symbol};

/// Frames an engine's ring holds (responses and heartbeats); one more is back-pressured.
pub const RING_FRAMES: usize = 16;

/// A frame the gateway wrote into an engine's ring.
#[derive(Clone, Copy, Debug)]
pub enum Frame {
    Response(Response),
    Heartbeat,
}

/// An engine's connection, as both ends see it.
#[derive(Debug)]
pub enum Conn {
    /// None; the engine connects at its `reconnect_at`.
    Idle,
    /// Accepted, waiting for the engine's logon (which it sends at `logon_at`).
    Pending { cid: ConnId, logon_at: u64 },
    /// Logged on: the ring the gateway writes into.
    Up { ring: VecDeque<Frame> },
    /// Closed by the gateway: the engine notices when it next runs (not frozen).
    ClosedByGateway,
    /// Closed by the engine: the gateway notices at its next poll.
    ClosedByEngine,
}

/// One engine as the simulator plays it, with what it was told.
#[derive(Debug)]
pub struct SimEngine {
    pub id: EngineId,
    pub account: u32,
    pub symbol: Symbol,
    pub client: Client,
    pub conn: Conn,
    pub reconnect_at: u64,
    /// Number of the last response received.
    pub last_seq: u32,
    pub acked: HashSet<u64>,
    pub finals: HashSet<u64>,
    /// Net quantity the engine was told was filled.
    pub position: i64,
    /// Frames written for the gateway, not polled yet: (message type, payload).
    pub out: VecDeque<(u16, Vec<u8>)>,
    /// When it last sent a heartbeat.
    pub heartbeat_at: u64,
    /// Frozen (neither reads nor writes nor notices anything) until then.
    pub frozen_until: u64,
    /// At the end of its freeze it closes its connection (else it resumes).
    pub drop_after_freeze: bool,
    /// Sends nothing (no heartbeat, no request) until then; still reads.
    pub silent_until: u64,
    /// Reads nothing until then; still writes.
    pub slow_until: u64,
    /// Its next logon is sent this long after its connection is accepted.
    pub logon_stall: u64,
}

impl SimEngine {
    pub fn new(id: EngineId, account: u32, symbol: Symbol) -> SimEngine {
        SimEngine {
            id,
            account,
            symbol,
            client: Client::new(1),
            conn: Conn::Idle,
            reconnect_at: 0,
            last_seq: 0,
            acked: HashSet::new(),
            finals: HashSet::new(),
            position: 0,
            out: VecDeque::new(),
            heartbeat_at: 0,
            frozen_until: 0,
            drop_after_freeze: false,
            silent_until: 0,
            slow_until: 0,
            logon_stall: 0,
        }
    }

    /// Logged on, and able to send a request at `now` (not frozen, not silent).
    pub fn can_send(&self, now: u64) -> bool {
        matches!(self.conn, Conn::Up { .. }) && now >= self.frozen_until && now >= self.silent_until
    }

    pub fn is_up(&self) -> bool {
        matches!(self.conn, Conn::Up { .. })
    }

    /// The connection is gone (a gateway crash): nothing of it survives.
    pub fn reset(&mut self) {
        self.conn = Conn::Idle;
        self.out.clear();
    }
}

/// The gateway's view of the engines' connections, for [`crate::engine_io`].
pub struct Wire<'a> {
    pub engines: &'a mut [SimEngine],
    /// Connections that never log on (a hung engine process, a stranger with the orders
    /// token): still pending.
    pub strangers: &'a mut Vec<ConnId>,
    /// Engines the links disconnected, in order, for the cancel-on-disconnect check.
    pub disconnected: &'a mut Vec<(EngineId, DisconnectReason)>,
    /// Connections the links closed, with why.
    pub closed: &'a mut Vec<CloseReason>,
    /// The simulated time, for when an engine closed by the gateway may come back.
    pub now: u64,
}

impl Wire<'_> {
    fn up(&mut self, engine: EngineId) -> Result<&mut VecDeque<Frame>, WireError> {
        match self
            .engines
            .iter_mut()
            .find(|e| e.id == engine)
            .map(|e| &mut e.conn)
        {
            Some(Conn::Up { ring }) => Ok(ring),
            _ => Err(WireError::Lost),
        }
    }

    fn write(&mut self, engine: EngineId, f: Frame) -> Result<(), WireError> {
        let ring = self.up(engine)?;
        if ring.len() >= RING_FRAMES {
            return Err(WireError::BackPressured);
        }
        ring.push_back(f);
        Ok(())
    }
}

impl EngineWire for Wire<'_> {
    fn engine_at(&self, i: usize) -> Option<EngineId> {
        // Only engines whose connection is up are on the gateway's wire; the index runs
        // over all of them, so an engine that is not up is skipped by offering nothing.
        self.engines.get(i).map(|e| e.id)
    }

    fn offer(&mut self, engine: EngineId, r: &Response) -> Result<(), WireError> {
        self.write(engine, Frame::Response(*r))
    }

    fn heartbeat(&mut self, engine: EngineId, _now: Wall) -> Result<(), WireError> {
        match self.write(engine, Frame::Heartbeat) {
            Err(WireError::Lost) => {
                // An engine the shell does not hold as up: the gateway closed it, or the
                // engine did and the gateway's poll will find out.
                let closed_by_engine = self
                    .engines
                    .iter()
                    .any(|e| e.id == engine && matches!(e.conn, Conn::ClosedByEngine));
                if closed_by_engine {
                    Err(WireError::Lost)
                } else {
                    Ok(())
                }
            }
            r => r,
        }
    }

    fn flush(&mut self, engine: EngineId) -> bool {
        !self
            .engines
            .iter()
            .any(|e| e.id == engine && matches!(e.conn, Conn::ClosedByEngine))
    }

    fn close_engine(&mut self, engine: EngineId, reason: DisconnectReason) {
        self.disconnected.push((engine, reason));
        if let Some(e) = self.engines.iter_mut().find(|e| e.id == engine) {
            e.conn = match e.conn {
                // The engine closed it and is gone already: it reconnects at its time.
                Conn::ClosedByEngine => Conn::Idle,
                // What it had not read is lost with the connection.
                _ => Conn::ClosedByGateway,
            };
            e.out.clear();
        }
    }

    fn close_conn(&mut self, conn: ConnId, reason: CloseReason) {
        self.closed.push(reason);
        self.strangers.retain(|c| *c != conn);
        let now = self.now;
        for e in self.engines.iter_mut() {
            if matches!(e.conn, Conn::Pending { cid, .. } if cid == conn) {
                e.conn = Conn::Idle;
                e.reconnect_at = now + 100_000_000;
            }
        }
    }
}
