//! The shells' counters published in a shared-memory
//! [`CountersFile`](crate::counters::CountersFile), what `rocebus stat`
//! reads: [`SubscriberCountersExport`] and [`PublisherCountersExport`].

use std::net::IpAddr;

use super::publisher::{McastPublisher, PublisherIoStats};
use super::subscriber::{McastSubscriber, SubscriberIoStats};
use crate::mcast::subscriber::SubscriberCounters;

type CounterField = fn(&SubscriberCounters, &SubscriberIoStats) -> u64;

/// The subscriber counters worth watching live, by label.
const EXPORTED: &[(&str, CounterField)] = &[
    ("received_a", |c, _| c.received_a),
    ("received_b", |c, _| c.received_b),
    ("received_retransmit", |c, _| c.received_retransmit),
    ("duplicates_a", |c, _| c.duplicates_a),
    ("duplicates_b", |c, _| c.duplicates_b),
    ("delivered", |c, _| c.delivered),
    ("gaps_detected", |c, _| c.gaps_detected),
    ("messages_recovered", |c, _| c.messages_recovered),
    ("retransmit_requests", |c, _| c.retransmit_requests),
    ("timeouts", |c, _| c.timeouts),
    ("unrecoverable", |c, _| c.unrecoverable),
    ("snapshots_applied", |c, _| c.snapshots_applied),
    ("receive_queue_low", |c, _| c.receive_queue_low),
    ("malformed_dropped", |c, _| c.malformed_dropped),
    ("foreign_source_dropped", |_, io| io.foreign_source_dropped),
    ("wrong_session_dropped", |c, _| c.wrong_session_dropped),
    ("bad_tag_dropped", |c, _| c.bad_tag_dropped),
    ("claimed", |c, _| c.claimed),
    ("claims_disproved", |c, _| c.claims_disproved),
    ("claims_accepted", |c, _| c.claims_accepted),
    ("not_yet_published", |c, _| c.not_yet_published),
    ("requests_dropped", |_, io| io.requests_dropped),
    ("gaps_filled_by_other_line", |c, _| {
        c.gaps_filled_by_other_line
    }),
    ("connections_lost", |_, io| io.connections_lost),
    ("reconnects", |_, io| io.reconnects),
];

/// A subscriber's counters published in a shared-memory
/// [`CountersFile`](crate::counters::CountersFile) (what `rocebus stat`
/// reads). Counters are allocated once; [`update`](Self::update) only stores
/// values, so it can run every few milliseconds from the polling loop.
pub struct SubscriberCountersExport {
    counters: Vec<(crate::counters::Counter, CounterField)>,
}

impl std::fmt::Debug for SubscriberCountersExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriberCountersExport")
            .field("counters", &self.counters.len())
            .finish()
    }
}

impl SubscriberCountersExport {
    /// Allocates `<prefix>.<name>` counters in `file` (a
    /// [`CountersFile`](crate::counters::CountersFile), or
    /// [`LocalCounters`](crate::counters::LocalCounters)).
    pub fn new<A: crate::counters::AllocateCounter + ?Sized>(
        file: &A,
        prefix: &str,
    ) -> Result<Self, crate::counters::CountersError> {
        let counters = EXPORTED
            .iter()
            .map(|(name, field)| {
                let label = format!("{prefix}.{name}");
                let c = file.allocate_counter(&label, crate::counters::Kind::Counter, 0)?;
                Ok((c, *field))
            })
            .collect::<Result<_, crate::counters::CountersError>>()?;
        Ok(SubscriberCountersExport { counters })
    }

    /// Stores the subscriber's current values (a [`McastSubscriber`] or an
    /// [`MdSubscriber`](crate::mcast::MdSubscriber) of either transport).
    pub fn update(&self, s: &impl SubscriberStats) {
        let (c, io) = (s.counters(), s.io_stats());
        for (counter, field) in &self.counters {
            counter.set(field(&c, &io));
        }
    }
}

/// A subscriber whose counters [`SubscriberCountersExport`] publishes.
pub trait SubscriberStats {
    /// Protocol counters.
    fn counters(&self) -> SubscriberCounters;
    /// I/O counters (an RC fan-out subscriber fills those it has).
    fn io_stats(&self) -> SubscriberIoStats;
}

impl SubscriberStats for McastSubscriber {
    fn counters(&self) -> SubscriberCounters {
        McastSubscriber::counters(self)
    }
    fn io_stats(&self) -> SubscriberIoStats {
        McastSubscriber::io_stats(self)
    }
}

impl SubscriberStats for crate::mcast::MdSubscriber {
    fn counters(&self) -> SubscriberCounters {
        crate::mcast::MdSubscriber::counters(self)
    }
    fn io_stats(&self) -> SubscriberIoStats {
        match self {
            crate::mcast::MdSubscriber::Multicast(s) => s.io_stats(),
            crate::mcast::MdSubscriber::Rc(s) => {
                let f = s.io_stats();
                SubscriberIoStats {
                    // One stream: its datagrams count as line A's.
                    datagrams_a: f.datagrams,
                    recovery_messages: f.recovery_frames,
                    requests_sent: f.requests_sent,
                    requests_dropped: f.requests_dropped,
                    connections_lost: f.connections_lost,
                    reconnects: f.reconnects,
                    reconnect_failures: f.reconnect_failures,
                    unanswered_links: f.silent_links,
                    ..SubscriberIoStats::default()
                }
            }
        }
    }
}

/// Counters of one subscriber slot of a [`PublisherCountersExport`].
struct SlotCounters {
    ipv4: crate::counters::Counter,
    position: crate::counters::Counter,
    lag: crate::counters::Counter,
    msgs_per_sec: crate::counters::Counter,
    repairs_asked: crate::counters::Counter,
}

/// A publisher's counters in a shared-memory
/// [`CountersFile`](crate::counters::CountersFile) (what `rocebus stat`
/// reads): its repair counters, and one row of gauges per subscriber it sees
/// (`<prefix>.sub<k>.ipv4` (shown as an address by `rocebus stat`),
/// `.position`, `.lag`, `.msgs_per_sec`, `.repairs_asked`), for the first
/// `slots` subscribers in order of admission; unused slots read 0.
/// Allocated once; [`update`](Self::update) only stores values.
pub struct PublisherCountersExport {
    totals: Vec<(crate::counters::Counter, PublisherField)>,
    subscribers: crate::counters::Counter,
    slots: Vec<SlotCounters>,
}

impl std::fmt::Debug for PublisherCountersExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherCountersExport")
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

type PublisherField = fn(&PublisherIoStats) -> u64;

/// The publisher-wide counters exported, by label.
const PUBLISHER_EXPORTED: &[(&str, PublisherField)] = &[
    ("datagrams_sent", |s| s.datagrams_sent),
    ("retransmit_requests", |s| s.retransmit_requests),
    ("repair_unicast_datagrams", |s| s.repair_unicast_datagrams),
    ("repair_multicast_datagrams", |s| {
        s.repair_multicast_datagrams
    }),
    ("repair_requests_covered", |s| s.repair_requests_covered),
    ("repair_requests_suppressed", |s| {
        s.repair_requests_suppressed
    }),
    ("repair_budget_dropped", |s| s.repair_budget_dropped),
    ("repair_requests_cut", |s| s.repair_requests_cut),
    ("status_reports", |s| s.status_reports),
    ("status_invalid", |s| s.status_invalid),
];

impl PublisherCountersExport {
    /// Allocates the counters under `prefix` in `file`, with `slots`
    /// subscriber rows.
    pub fn new<A: crate::counters::AllocateCounter + ?Sized>(
        file: &A,
        prefix: &str,
        slots: usize,
    ) -> Result<Self, crate::counters::CountersError> {
        use crate::counters::Kind;
        let totals = PUBLISHER_EXPORTED
            .iter()
            .map(|(name, field)| {
                let c = file.allocate_counter(&format!("{prefix}.{name}"), Kind::Counter, 0)?;
                Ok((c, *field))
            })
            .collect::<Result<_, crate::counters::CountersError>>()?;
        let subscribers =
            file.allocate_counter(&format!("{prefix}.subscribers"), Kind::Gauge, 0)?;
        let slots = (0..slots)
            .map(|k| {
                let g = |name: &str, kind| {
                    file.allocate_counter(&format!("{prefix}.sub{k}.{name}"), kind, 0)
                };
                Ok(SlotCounters {
                    ipv4: g("ipv4", Kind::Gauge)?,
                    position: g("position", Kind::Gauge)?,
                    lag: g("lag", Kind::Gauge)?,
                    msgs_per_sec: g("msgs_per_sec", Kind::Gauge)?,
                    repairs_asked: g("repairs_asked", Kind::Counter)?,
                })
            })
            .collect::<Result<_, crate::counters::CountersError>>()?;
        Ok(PublisherCountersExport {
            totals,
            subscribers,
            slots,
        })
    }

    /// Stores the publisher's current values.
    pub fn update(&self, p: &McastPublisher) {
        let io = p.io_stats();
        for (c, field) in &self.totals {
            c.set(field(&io));
        }
        let rows = p.subscribers();
        self.subscribers.set(rows.len() as u64);
        for (i, slot) in self.slots.iter().enumerate() {
            let r = rows.get(i);
            let ipv4 = match r.and_then(|r| r.addr) {
                Some(IpAddr::V4(a)) => u64::from(u32::from(a)),
                _ => 0,
            };
            slot.ipv4.set(ipv4);
            slot.position.set(r.map_or(0, |r| r.next_seq));
            slot.lag.set(r.map_or(0, |r| r.lag));
            slot.msgs_per_sec.set(r.map_or(0, |r| r.msgs_per_sec));
            slot.repairs_asked.set(r.map_or(0, |r| r.requests_received));
        }
    }
}
