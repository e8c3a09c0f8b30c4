//! Subscribers made visible to their publisher. I/O-free: both halves take
//! `now` and values, and hand back messages, rows and events.
//!
//! - [`StatusReporter`] (subscriber side) says when a
//!   [`SubscriberStatus`] is due (every `recovery.status_interval_ns`) and
//!   fills it: position (next sequence to deliver), messages delivered per
//!   second over the interval, retransmit requests sent so far. The I/O
//!   layer sends it on the authenticated recovery connection.
//! - [`SubscriberTable`] (publisher side) keeps one [`SubscriberRow`] per
//!   admitted recovery connection, takes their reports (validated like any
//!   outside input: wrong channel or session, or a position ahead of what
//!   was published, is dropped and counted), recomputes every row's lag
//!   against the publisher's own position on each poll (so a subscriber
//!   that stops reporting still falls behind), and raises
//!   [`PublisherEvent::SubscriberLagging`] once when a subscriber's lag
//!   passes `recovery_server.lag_alert_messages`, and
//!   [`PublisherEvent::SubscriberCaughtUp`] when it is back under half of it.

use std::collections::VecDeque;

use super::wire::SubscriberStatus;

/// When the subscriber reports, and what.
#[derive(Debug, Clone, Copy)]
pub struct StatusReporter {
    interval_ns: u64,
    /// Time of the last report (None: none yet).
    last_at: Option<u64>,
    last_delivered: u64,
}

impl StatusReporter {
    /// Reports every `interval_ns` (0: never).
    pub fn new(interval_ns: u64) -> Self {
        StatusReporter {
            interval_ns,
            last_at: None,
            last_delivered: 0,
        }
    }

    /// Whether a report is due at `now` (cheap: call it first).
    pub fn due(&self, now: u64) -> bool {
        self.interval_ns != 0
            && self
                .last_at
                .is_none_or(|at| now.saturating_sub(at) >= self.interval_ns)
    }

    /// The report due at `now`, if one is: the first at once, then one per
    /// interval. `delivered` is the running count of messages delivered.
    pub fn poll_transmit(
        &mut self,
        now: u64,
        channel: u16,
        session: u64,
        next_seq: u64,
        delivered: u64,
        requests: u64,
    ) -> Option<SubscriberStatus> {
        if self.interval_ns == 0 {
            return None;
        }
        let msgs_per_sec = match self.last_at {
            Some(at) if now.saturating_sub(at) < self.interval_ns => return None,
            Some(at) => {
                let dt = now.saturating_sub(at).max(1);
                let n = delivered.saturating_sub(self.last_delivered);
                // n * 1e9 / dt without overflow for any realistic n.
                ((u128::from(n) * 1_000_000_000) / u128::from(dt)).min(u128::from(u64::MAX)) as u64
            }
            None => 0,
        };
        self.last_at = Some(now);
        self.last_delivered = delivered;
        Some(SubscriberStatus {
            channel,
            session,
            next_seq,
            msgs_per_sec,
            requests,
        })
    }
}

/// What the publisher knows of one subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberRow {
    /// The recovery connection's id (unique while the publisher runs).
    pub id: u32,
    /// The subscriber's address and port, as its connection came from.
    pub peer: String,
    /// Its IP address (None if `peer` is not an address).
    pub addr: Option<std::net::IpAddr>,
    /// Next sequence it will deliver, as last reported (0: no report yet).
    pub next_seq: u64,
    /// Messages published that it had not delivered, as of the last poll:
    /// the publisher's next sequence minus its last reported one (all that
    /// was published, before its first report).
    pub lag: u64,
    /// Its receive rate, messages per second, as last reported.
    pub msgs_per_sec: u64,
    /// Retransmit requests it says it sent.
    pub requests_reported: u64,
    /// Retransmit requests the publisher received from it.
    pub requests_received: u64,
    /// Reports taken.
    pub reports: u64,
    /// When the last report came (0: none yet).
    pub reported_at: u64,
    /// Whether it is past the lag bound (and not yet back under half of it).
    pub lagging: bool,
}

/// Something the application should know about its subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublisherEvent {
    /// A subscriber fell more than the bound behind.
    SubscriberLagging {
        /// Its connection id.
        id: u32,
        /// Its address.
        peer: String,
        /// Messages behind.
        lag: u64,
    },
    /// A lagging subscriber is back under half the bound.
    SubscriberCaughtUp {
        /// Its connection id.
        id: u32,
        /// Its address.
        peer: String,
    },
}

/// Why a report was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// Not about our channel and session.
    #[error("status for another channel or session")]
    Foreign,
    /// A position beyond what was published.
    #[error("status position {next_seq} is ahead of the publisher's {published}")]
    Ahead {
        /// Reported.
        next_seq: u64,
        /// The publisher's next sequence.
        published: u64,
    },
    /// From a connection the table does not know.
    #[error("status from an unknown connection")]
    Unknown,
}

/// Events kept for the application at most; older ones are dropped.
const MAX_EVENTS: usize = 256;

/// The publisher's view of its subscribers. See the module documentation.
#[derive(Debug)]
pub struct SubscriberTable {
    /// Lag (messages) past which a subscriber is reported; 0: never.
    bound: u64,
    rows: Vec<SubscriberRow>,
    events: VecDeque<PublisherEvent>,
    /// Reports dropped as invalid.
    pub invalid_reports: u64,
    /// Events dropped because the application did not take them.
    pub events_dropped: u64,
}

impl SubscriberTable {
    /// An empty table reporting lags past `bound` messages (0: never).
    pub fn new(bound: u64) -> Self {
        SubscriberTable {
            bound,
            rows: Vec::new(),
            events: VecDeque::with_capacity(MAX_EVENTS),
            invalid_reports: 0,
            events_dropped: 0,
        }
    }

    /// Every subscriber, in order of admission.
    pub fn rows(&self) -> &[SubscriberRow] {
        &self.rows
    }

    /// A subscriber was admitted (connection set-up: allocates).
    pub fn add(&mut self, id: u32, peer: String) {
        self.rows.push(SubscriberRow {
            id,
            addr: peer
                .parse::<std::net::SocketAddr>()
                .map(|a| a.ip())
                .or_else(|_| peer.parse())
                .ok(),
            peer,
            next_seq: 0,
            lag: 0,
            msgs_per_sec: 0,
            requests_reported: 0,
            requests_received: 0,
            reports: 0,
            reported_at: 0,
            lagging: false,
        });
    }

    /// Every connection is gone.
    pub fn clear(&mut self) {
        self.rows.clear();
    }

    /// A subscriber's connection is gone.
    pub fn remove(&mut self, id: u32) {
        self.rows.retain(|r| r.id != id);
    }

    /// A retransmit request came from `id`.
    pub fn on_request(&mut self, id: u32) {
        if let Some(r) = self.rows.iter_mut().find(|r| r.id == id) {
            r.requests_received += 1;
        }
    }

    /// Takes `id`'s report. `channel`/`session` are ours, `published` our
    /// next sequence.
    pub fn on_status(
        &mut self,
        now: u64,
        id: u32,
        st: &SubscriberStatus,
        channel: u16,
        session: u64,
        published: u64,
    ) -> Result<(), StatusError> {
        let res = if st.channel != channel || st.session != session {
            Err(StatusError::Foreign)
        } else if st.next_seq > published {
            Err(StatusError::Ahead {
                next_seq: st.next_seq,
                published,
            })
        } else if let Some(r) = self.rows.iter_mut().find(|r| r.id == id) {
            r.next_seq = st.next_seq;
            r.msgs_per_sec = st.msgs_per_sec;
            r.requests_reported = st.requests;
            r.reports += 1;
            r.reported_at = now;
            Ok(())
        } else {
            Err(StatusError::Unknown)
        };
        if res.is_err() {
            self.invalid_reports += 1;
        }
        self.handle_timeout(now, published);
        res
    }

    /// Recomputes every lag against `published` (our next sequence) and
    /// raises the events of those that crossed the bound.
    pub fn handle_timeout(&mut self, _now: u64, published: u64) {
        for r in self.rows.iter_mut() {
            // Before its first report: everything published so far.
            let pos = r.next_seq.max(1);
            r.lag = published.saturating_sub(pos);
            if self.bound == 0 {
                continue;
            }
            let ev = if !r.lagging && r.lag > self.bound {
                r.lagging = true;
                Some(PublisherEvent::SubscriberLagging {
                    id: r.id,
                    peer: r.peer.clone(),
                    lag: r.lag,
                })
            } else if r.lagging && r.lag <= self.bound / 2 {
                r.lagging = false;
                Some(PublisherEvent::SubscriberCaughtUp {
                    id: r.id,
                    peer: r.peer.clone(),
                })
            } else {
                None
            };
            if let Some(ev) = ev {
                if self.events.len() == MAX_EVENTS {
                    self.events.pop_front();
                    self.events_dropped += 1;
                }
                self.events.push_back(ev);
            }
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<PublisherEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn status(next_seq: u64) -> SubscriberStatus {
        SubscriberStatus {
            channel: 7,
            session: 9,
            next_seq,
            msgs_per_sec: 100,
            requests: 2,
        }
    }

    #[test]
    fn reporter_sends_at_once_then_per_interval_with_the_rate() {
        let mut r = StatusReporter::new(100 * MS);
        let first = r.poll_transmit(0, 7, 9, 1, 0, 0).unwrap();
        assert_eq!((first.next_seq, first.msgs_per_sec), (1, 0));
        assert_eq!(r.poll_transmit(50 * MS, 7, 9, 400, 399, 0), None);
        let second = r.poll_transmit(200 * MS, 7, 9, 1001, 1000, 3).unwrap();
        assert_eq!(second.msgs_per_sec, 5000, "1000 messages in 200 ms");
        assert_eq!((second.next_seq, second.requests), (1001, 3));
        assert_eq!(StatusReporter::new(0).poll_transmit(0, 7, 9, 1, 0, 0), None);
    }

    #[test]
    fn rows_follow_reports_and_validate_them() {
        let mut t = SubscriberTable::new(0);
        t.add(1, "198.18.0.2".into());
        t.add(2, "198.18.0.3:4791".into());
        assert_eq!(t.rows()[1].addr, Some([198, 18, 0, 3].into()));
        assert_eq!(t.on_status(5, 1, &status(900), 7, 9, 1000), Ok(()));
        t.on_request(2);
        let r = &t.rows()[0];
        assert_eq!(
            (r.next_seq, r.lag, r.msgs_per_sec, r.reports),
            (900, 100, 100, 1)
        );
        assert_eq!(t.rows()[1].lag, 999, "no report yet: everything");
        assert_eq!(t.rows()[1].requests_received, 1);
        let foreign = SubscriberStatus {
            session: 8,
            ..status(10)
        };
        assert_eq!(
            t.on_status(6, 1, &foreign, 7, 9, 1000),
            Err(StatusError::Foreign)
        );
        assert_eq!(
            t.on_status(6, 1, &status(1001), 7, 9, 1000),
            Err(StatusError::Ahead {
                next_seq: 1001,
                published: 1000
            })
        );
        assert_eq!(
            t.on_status(6, 3, &status(10), 7, 9, 1000),
            Err(StatusError::Unknown)
        );
        assert_eq!(t.invalid_reports, 3);
        assert_eq!(t.rows()[0].next_seq, 900, "bad reports change nothing");
        t.remove(1);
        assert_eq!(t.rows().len(), 1);
    }

    #[test]
    fn a_subscriber_that_stops_reporting_falls_behind_and_is_reported_once() {
        let mut t = SubscriberTable::new(1000);
        t.add(4, "198.18.0.4".into());
        t.on_status(0, 4, &status(500), 7, 9, 600).unwrap();
        assert_eq!(t.poll_event(), None);
        // It goes quiet; the publisher goes on.
        t.handle_timeout(10 * MS, 1400);
        assert_eq!(t.poll_event(), None);
        t.handle_timeout(20 * MS, 1600);
        assert_eq!(
            t.poll_event(),
            Some(PublisherEvent::SubscriberLagging {
                id: 4,
                peer: "198.18.0.4".into(),
                lag: 1100
            })
        );
        t.handle_timeout(30 * MS, 5000);
        assert_eq!(t.poll_event(), None, "once, not on every poll");
        assert!(t.rows()[0].lagging);
        // It catches up.
        t.on_status(40 * MS, 4, &status(4800), 7, 9, 5000).unwrap();
        assert_eq!(
            t.poll_event(),
            Some(PublisherEvent::SubscriberCaughtUp {
                id: 4,
                peer: "198.18.0.4".into()
            })
        );
    }

    #[test]
    fn events_are_bounded() {
        let mut t = SubscriberTable::new(10);
        t.add(1, "a".into());
        // Falls behind and catches up again, over and over, and nobody
        // takes the events.
        for i in 0..(MAX_EVENTS as u64 + 10) {
            let published = 1000 * (i + 1);
            t.handle_timeout(i, published);
            t.on_status(i, 1, &status(published), 7, 9, published)
                .unwrap();
        }
        assert!(t.events.len() <= MAX_EVENTS);
        assert!(t.events_dropped > 0);
    }
}
