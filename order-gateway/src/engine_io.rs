//! The engines' side of the I/O shell, shared by the service and the simulator: how the
//! decisions of [`EngineLinks`] meet the driver and the engines' connections.
//!
//! [`EngineLinks`] decides (heartbeats, silence, backlog cap, logon timeout) and
//! [`FixDriver`] journals and answers; what joins them — a lost connection becomes a
//! disconnect whose cancel-on-disconnect is staged and flushed in the same turn, a logon
//! starts its link before the gateway hears of it and queues its replay ahead of anything
//! new, a response goes through its engine's backlog to its ring — is written once, here,
//! over [`EngineWire`]: the service implements it on its RDMA connections, the simulator
//! on simulated engines. What the simulator checks is then what the service runs.
//!
//! Flow control is the links' ([`EngineLinks::request_budget`]): a shell polling an
//! engine's ring takes at most that many frames (zero: it leaves them all, and the reliable
//! connection holds the engine back once its ring is full), and polls it again on the next
//! turn whatever its activity mark says, since the frames left there will not mark it again.
//!
//! Owns no state; must not read a clock (time is the turn's [`Now`], passed in).

use rocebus::clock::{Mono, Now, Wall};

use crate::driver::{DriverError, FixDriver, VenueLink};
use crate::gateway::{
    CloseReason, ConnId, DisconnectReason, EngineId, EngineLinks, LinkOutput, Offered,
};
use crate::proto::{msg_type, Response};

/// Why a write into an engine's ring did not go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The ring is full (the engine has not read yet): try again next turn.
    BackPressured,
    /// The connection is lost.
    Lost,
}

/// The engines' connections as a shell holds them. Writes are not visible to the engine
/// before [`flush`](Self::flush).
pub trait EngineWire {
    /// The `i`th logged-on engine's id (none: past the last). The list changes only in
    /// [`close_engine`](Self::close_engine) and when the shell adds a logged-on engine.
    fn engine_at(&self, i: usize) -> Option<EngineId>;
    /// Writes a response into `engine`'s ring.
    fn offer(&mut self, engine: EngineId, r: &Response) -> Result<(), WireError>;
    /// Writes a heartbeat stamped `now` into `engine`'s ring (an engine the shell does
    /// not hold: nothing, `Ok`).
    fn heartbeat(&mut self, engine: EngineId, now: Wall) -> Result<(), WireError>;
    /// Makes what was written to `engine` since the last flush visible to it (nothing
    /// written: nothing to do); false if the connection is lost.
    fn flush(&mut self, engine: EngineId) -> bool;
    /// Closes `engine`'s connection: the links disconnected it (its cancel-on-disconnect
    /// is staged right after, by [`carry_out`]).
    fn close_engine(&mut self, engine: EngineId, reason: DisconnectReason);
    /// Closes a connection that never became an engine.
    fn close_conn(&mut self, conn: ConnId, reason: CloseReason);
}

/// One frame read from a logged-on engine's ring: a request goes to the driver, a
/// heartbeat is nothing more (both are signs of life: [`frames_polled`]). True: a request.
pub fn take_frame<L: VenueLink>(
    driver: &mut FixDriver<L>,
    engine: EngineId,
    frame_type: u16,
    payload: &[u8],
    now: Wall,
) -> bool {
    if frame_type == u16::from(msg_type::HEARTBEAT) {
        return false;
    }
    driver.stage_engine_message(engine, payload, now);
    true
}

/// A poll of `engine`'s ring took `n` frames (`Ok`) or failed (`Err`): any frame is a sign
/// of life, a failure a lost connection (unless the links disconnected it already). True:
/// the connection was found lost now (worth a log line).
pub fn frames_polled(
    links: &mut EngineLinks,
    engine: EngineId,
    polled: Result<usize, ()>,
    now: Mono,
) -> bool {
    match polled {
        Ok(0) => false,
        Ok(_) => {
            links.handle_frame(engine, now);
            false
        }
        // Disconnected by the links already (closed, not yet reaped).
        Err(()) if !links.is_linked(engine) => false,
        Err(()) => {
            links.handle_lost(engine);
            true
        }
    }
}

/// `conn` logged on as `engine` at `now`, having seen responses up to `after`; the shell
/// checked the logon and sent the accepting answer. Its link starts, the gateway hears of
/// the logon, and what the engine missed is queued, oldest first, ahead of anything new
/// (single thread: nothing new can be produced in between); the shell then adds the
/// engine to its wire and offers it ([`offer_queued`]). Returns the responses replayed, or
/// `None` when the links refuse it (`conn` closed already, or `engine` linked): nothing
/// changed, the shell refuses the logon.
pub fn logon<L: VenueLink>(
    links: &mut EngineLinks,
    driver: &mut FixDriver<L>,
    conn: ConnId,
    engine: EngineId,
    after: u32,
    now: Mono,
) -> Option<usize> {
    if !links.handle_logon(conn, engine, now) {
        return None;
    }
    driver.stage(|gw, out| gw.on_engine_logon(engine, out));
    let mut n = 0;
    if let Ok(missed) = driver.gateway().responses_after(engine, after) {
        for r in missed {
            n += 1;
            links.queue_replay(engine, r);
        }
    }
    Some(n)
}

/// Offers `engine` at `now` the responses its link hands out, oldest first, until its ring
/// is full; then flushes. A failure is a lost connection, reported to the links.
pub fn offer_queued(
    links: &mut EngineLinks,
    wire: &mut impl EngineWire,
    engine: EngineId,
    now: Mono,
) {
    // `has_queued` first: the common turn has nothing queued, and costs no lookup.
    while let Some(r) = links
        .has_queued()
        .then(|| links.poll_response(engine))
        .flatten()
    {
        match wire.offer(engine, &r) {
            Ok(()) => links.handle_offered(engine, Offered::Accepted, now),
            Err(WireError::BackPressured) => {
                links.handle_offered(engine, Offered::BackPressured, now);
                break;
            }
            Err(WireError::Lost) => {
                links.handle_lost(engine);
                return;
            }
        }
    }
    if !wire.flush(engine) {
        links.handle_lost(engine);
    }
}

/// [`offer_queued`] for every engine of the wire.
pub fn offer_all(links: &mut EngineLinks, wire: &mut impl EngineWire, now: Mono) {
    let mut i = 0;
    while let Some(engine) = wire.engine_at(i) {
        offer_queued(links, wire, engine, now);
        i += 1;
    }
}

/// Carries out what the links decided, in order: heartbeats, closes, and disconnects, each
/// with its cancel-on-disconnect staged; the cancels (and any responses to engines still
/// connected) go out in this turn, and what that leads to is carried out too.
pub fn carry_out<L: VenueLink>(
    links: &mut EngineLinks,
    driver: &mut FixDriver<L>,
    wire: &mut impl EngineWire,
    now: Now,
) -> Result<(), DriverError> {
    loop {
        let mut disconnected = false;
        while let Some(o) = links.poll_output() {
            match o {
                LinkOutput::Heartbeat(id) => {
                    // A ring too full to take it has responses to read: no failure.
                    if wire.heartbeat(id, now.wall) == Err(WireError::Lost) {
                        links.handle_lost(id);
                    }
                }
                LinkOutput::Disconnect(id, reason) => {
                    wire.close_engine(id, reason);
                    driver.stage_engine_disconnect(id, now.wall);
                    disconnected = true;
                }
                LinkOutput::Close(id, reason) => wire.close_conn(id, reason),
            }
        }
        if !disconnected {
            return Ok(());
        }
        driver.flush_with(|engine, r| links.queue_response(engine, r))?;
        offer_all(links, wire, now.mono);
    }
}

/// What the driver has for the engines after staging (requests, an operator command):
/// journaled, then through their links to their rings, then what the links decided.
pub fn flush<L: VenueLink>(
    links: &mut EngineLinks,
    driver: &mut FixDriver<L>,
    wire: &mut impl EngineWire,
    now: Now,
) -> Result<(), DriverError> {
    driver.flush_with(|engine, r| links.queue_response(engine, r))?;
    offer_all(links, wire, now.mono);
    carry_out(links, driver, wire, now)
}

/// Venue bytes, timers, then the write-ahead flush that hands responses to engines
/// (through their links; an engine the gateway cut off is disconnected), then what the
/// links decided. Returns the driver's work count.
pub fn poll_venue<L: VenueLink>(
    links: &mut EngineLinks,
    driver: &mut FixDriver<L>,
    wire: &mut impl EngineWire,
    now: Now,
) -> Result<usize, DriverError> {
    let n = driver.poll_with(now, |engine, r| links.queue_response(engine, r))?;
    while let Some(id) = driver.pop_kicked() {
        links.handle_cut_off(id);
    }
    offer_all(links, wire, now.mono);
    carry_out(links, driver, wire, now)?;
    Ok(n)
}

/// The links' timers when due (heartbeats, silence, logon timeouts, lingers), then what
/// the links decided, carried out.
pub fn poll_links<L: VenueLink>(
    links: &mut EngineLinks,
    driver: &mut FixDriver<L>,
    wire: &mut impl EngineWire,
    now: Now,
) -> Result<(), DriverError> {
    if links.poll_timeout().is_some_and(|t| now.mono >= t) {
        links.handle_timeout(now.mono);
    }
    carry_out(links, driver, wire, now)
}
