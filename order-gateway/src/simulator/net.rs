//! The simulated network between the gateway and the venue: a [`VenueLink`] over a
//! [`SimVenue`] that outlives every gateway process of a run, driven by the run's clock and
//! its own seeded RNG. It also keeps the venue's record of what the gateway sent, across
//! restarts, to check that no ClOrdID and no MsgSeqNum is ever used twice.
//!
//! Must not read a clock or touch files.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::rc::Rc;
use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::driver::{LinkRead, VenueLink};
use crate::fix::{split_frame, tag, Message};
use crate::sim::SimVenue;

/// Orders above this quantity rest at the simulated venue until canceled.
pub const REST_ABOVE: u64 = 70;

/// The venue's view of the gateway, kept across gateway restarts.
#[derive(Debug, Default)]
pub struct VenueRecord {
    /// The MsgSeqNum the venue expects next from the gateway.
    pub next_in: u64,
    /// Every ClOrdID of a NewOrderSingle, cancel or replace received.
    pub cl_ord_ids: HashSet<Vec<u8>>,
    /// Net quantity the venue filled, by symbol (it fills every order at once).
    pub filled: HashMap<Vec<u8>, i64>,
    /// Sequence gaps seen (the gateway's numbers jumped: allowed, a venue asks for a resend).
    pub gaps: u64,
    /// Invariant violations seen by the venue.
    pub violations: Vec<String>,
}

impl VenueRecord {
    fn on_frame(&mut self, frame: &[u8]) {
        let Ok(m) = Message::parse(frame) else {
            self.violations
                .push("the gateway sent a frame that does not parse".into());
            return;
        };
        let Some(seq) = m.seq() else {
            self.violations
                .push("the gateway sent a message without MsgSeqNum".into());
            return;
        };
        let ty = m.msg_type();
        let cl = m.get(tag::CL_ORD_ID).unwrap_or(b"");
        if m.poss_dup() {
            // A resend: its number and ClOrdID were used by the original, unless the
            // original was lost on the way; the venue then takes it (as `SimVenue` does).
            if ty == b"D" && !self.cl_ord_ids.contains(cl) {
                self.cl_ord_ids.insert(cl.to_vec());
                self.fill(&m);
            }
            return;
        }
        if seq < self.next_in {
            self.violations.push(format!(
                "MsgSeqNum {seq} reused (35={}): the venue expected {}",
                String::from_utf8_lossy(ty),
                self.next_in
            ));
        } else if seq > self.next_in && self.next_in > 0 {
            self.gaps += 1;
        }
        self.next_in = self.next_in.max(seq + 1);
        if matches!(ty, b"D" | b"F" | b"G") {
            if !self.cl_ord_ids.insert(cl.to_vec()) {
                self.violations.push(format!(
                    "ClOrdID {} reused (35={})",
                    String::from_utf8_lossy(cl),
                    String::from_utf8_lossy(ty)
                ));
            }
            if ty == b"D" {
                self.fill(&m);
            }
        }
    }

    /// The venue fills every order it takes at once, except those that rest.
    fn fill(&mut self, m: &Message<'_>) {
        let qty = m.uint(tag::ORDER_QTY).unwrap_or(0) as i64;
        if qty > REST_ABOVE as i64 {
            return;
        }
        let sign = if m.get(tag::SIDE) == Some(b"1") {
            1
        } else {
            -1
        };
        let sym = m.get(tag::SYMBOL).unwrap_or(b"?").to_vec();
        *self.filled.entry(sym).or_default() += sign * qty;
    }
}

/// Network faults injected, counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetFaults {
    /// Venue replies held back (each write's replies delayed).
    pub delays: u64,
    /// Execution reports delivered twice (the copy with PossDupFlag=Y).
    pub duplicates: u64,
    /// Two adjacent venue messages swapped (a gap that fills itself).
    pub reorders: u64,
}

/// Everything on the venue side of the link: the venue, the wire, the clock.
#[derive(Debug)]
pub struct Net {
    /// The venue (lives for the whole run, as a venue's day does).
    pub venue: SimVenue,
    /// The simulated clock, nanoseconds since the UNIX epoch.
    pub now: u64,
    /// A connection is up.
    pub up: bool,
    /// Venue messages on the wire to the gateway: (deliverable from, frame).
    pub to_gw: VecDeque<(u64, Vec<u8>)>,
    /// Nothing reaches the gateway before this time.
    pub frozen_until: u64,
    /// The gateway process is dying: what it writes never reaches the venue.
    pub blackhole: bool,
    /// Chance (per million) that a write's replies are delayed; duplicated; reordered.
    pub delay_ppm: u32,
    /// See `delay_ppm`.
    pub dup_ppm: u32,
    /// See `delay_ppm`.
    pub reorder_ppm: u32,
    /// The venue's record.
    pub record: VenueRecord,
    /// Faults injected.
    pub faults: NetFaults,
    rng: ChaCha8Rng,
}

impl Net {
    /// A closed network at `now`.
    pub fn new(now: u64, rng: ChaCha8Rng) -> Net {
        Net {
            venue: SimVenue::new().keep_history().rest_above(REST_ABOVE),
            now,
            up: false,
            to_gw: VecDeque::new(),
            frozen_until: 0,
            blackhole: false,
            delay_ppm: 0,
            dup_ppm: 0,
            reorder_ppm: 0,
            record: VenueRecord::default(),
            faults: NetFaults::default(),
            rng,
        }
    }

    /// The connection breaks: what was on the wire is lost.
    pub fn cut(&mut self) {
        self.up = false;
        self.to_gw.clear();
        self.venue.close();
    }

    fn chance(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.rng.gen_range(0..1_000_000) < ppm
    }

    /// Takes what the venue answered and puts it on the wire, with the faults drawn.
    fn carry_replies(&mut self) {
        let mut buf = vec![0u8; 1 << 16];
        let mut bytes = Vec::new();
        while let LinkRead::Data(n) = self.venue.read(&mut buf, Duration::ZERO) {
            bytes.extend_from_slice(&buf[..n]);
        }
        let delay = if self.chance(self.delay_ppm) {
            self.faults.delays += 1;
            self.rng.gen_range(1..300) * 1_000_000
        } else {
            0
        };
        let earliest = self.to_gw.back().map_or(0, |(t, _)| *t);
        let at = earliest.max(self.now + delay);
        let mut rest = &bytes[..];
        while let Ok(n) = split_frame(rest) {
            if n == 0 || n > rest.len() {
                break;
            }
            let frame = rest[..n].to_vec();
            rest = &rest[n..];
            let report = Message::parse(&frame).is_ok_and(|m| m.msg_type() == b"8");
            let dup = report && self.chance(self.dup_ppm);
            let copy = dup
                .then(|| SimVenue::poss_dup_copy(&frame, self.now))
                .flatten();
            self.to_gw.push_back((at, frame));
            if let Some(c) = copy {
                self.faults.duplicates += 1;
                self.to_gw.push_back((at, c));
            }
        }
        let len = self.to_gw.len();
        if len >= 2 && self.chance(self.reorder_ppm) {
            self.faults.reorders += 1;
            self.to_gw.swap(len - 1, len - 2);
        }
    }
}

/// The gateway's end of the simulated link (the network is shared with the simulator).
#[derive(Clone, Debug)]
pub struct SimLink(pub Rc<RefCell<Net>>);

impl VenueLink for SimLink {
    fn open(&mut self, mono: rocebus::clock::Mono) -> io::Result<()> {
        let mut n = self.0.borrow_mut();
        n.cut();
        n.up = true;
        n.venue.open(mono)
    }

    fn close(&mut self) {
        self.0.borrow_mut().cut();
    }

    fn is_open(&self) -> bool {
        self.0.borrow().up
    }

    fn read(&mut self, buf: &mut [u8], _wait: Duration) -> LinkRead {
        let mut n = self.0.borrow_mut();
        if !n.up {
            return LinkRead::Closed;
        }
        if n.now < n.frozen_until {
            return LinkRead::Idle;
        }
        let mut len = 0;
        while let Some((at, f)) = n.to_gw.front() {
            if *at > n.now || len + f.len() > buf.len() {
                break;
            }
            buf[len..len + f.len()].copy_from_slice(f);
            len += f.len();
            n.to_gw.pop_front();
        }
        if len == 0 {
            LinkRead::Idle
        } else {
            LinkRead::Data(len)
        }
    }

    fn write_all(&mut self, bytes: &[u8], mono: rocebus::clock::Mono) -> io::Result<()> {
        let mut n = self.0.borrow_mut();
        if !n.up {
            return Err(io::ErrorKind::NotConnected.into());
        }
        if n.blackhole {
            return Ok(());
        }
        let mut rest = bytes;
        while let Ok(len) = split_frame(rest) {
            if len == 0 || len > rest.len() {
                break;
            }
            n.record.on_frame(&rest[..len]);
            rest = &rest[len..];
        }
        let now = n.now;
        n.venue.set_now(now);
        n.venue.write_all(bytes, mono)?;
        n.carry_replies();
        Ok(())
    }

    fn describe(&self) -> String {
        "simulated venue link".into()
    }
}
