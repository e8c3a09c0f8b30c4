//! TOML configuration of the market-data path.
//!
//! ```toml
//! max_datagram_payload = 1024   # UD payload incl. our 24-byte header, <= path MTU
//! history_depth = 4096          # datagrams kept for retransmission
//!
//! [receive]
//! depth = 1024                  # receive WRs posted per line
//! replenish_batch = 32          # re-post in batches of this many
//!
//! [batching]
//! max_messages = 64             # per datagram
//! flush_interval_ns = 0         # 0 = flush on every poll
//!
//! [pacing]
//! max_datagrams_per_sec = 0     # 0 = unpaced
//! burst = 32
//!
//! [recovery]
//! timeout_ns = 200000           # least wait before asking for a hole again
//! max_timeout_ns = 100000000    # the wait follows the measured repair time
//!                               # (backing off when unanswered) up to this;
//!                               # <= timeout_ns: fixed at timeout_ns
//! max_retries = 3
//! max_outstanding = 16
//! max_buffered = 4096           # datagrams held out of order
//! snapshot_timeout_ns = 1000000000
//! ab_grace_ns = 20000           # wait for the other line before requesting a hole
//! reconnect_min_ns = 1000000    # recovery connection lost: first retry after 1 ms,
//! reconnect_max_ns = 1000000000 # doubling up to 1 s
//! dead_link_ns = 1000000000     # a link that answers nothing: given up after
//!                               # 3 request timeouts and at least this long
//! join_replay_max = 4096        # first datagram this few messages in: replay
//!                               # the start from history, not a snapshot
//! max_request_messages = 4096   # most messages one retransmit request asks for
//! status_interval_ns = 100000000 # report position and rate to the publisher (0 = never)
//!
//! [recovery_server]             # the publisher's recovery port (strangers cost little)
//! max_connections = 32          # recovery connections, handshakes included
//! max_pending_per_address = 2   # handshakes from one address (checked first, < max_connections)
//! cookie_when_pending = 4       # this many handshakes in progress: a proved hello must
//!                               # echo an address-bound cookie first (< max_connections)
//! handshake_timeout_ns = 1000000000
//! request_max_age_ms = 30000    # a hello made longer ago (or ahead) is refused; one
//!                               # answered before is refused inside this window (a replay)
//! requests_per_sec = 2000       # retransmit requests per connection
//! request_burst = 256
//! snapshots_per_sec = 5         # snapshot requests per connection
//! snapshot_burst = 8
//! snapshot_reuse_ns = 10000000  # one serialised snapshot serves every request this long
//! max_outbox_bytes = 8388608    # answers queued per connection before requests are dropped
//! rnr_retry = 3                 # RNR retries (0..=6; 7 would retry for ever)
//! stall_timeout_ns = 2000000000 # a client that takes nothing this long is dropped
//! log_per_sec = 10              # refused/dropped log lines per second
//! multicast_repair = true       # a loss several subscribers share: one multicast retransmit
//! repair_window_ns = 2000000    # requests this close for one range are the same loss
//! repair_holdoff_ns = 100000    # a retry this soon after its answer crossed it: dropped
//! repair_bytes_per_sec = 33554432 # the repair budget of one connection: unicast answers,
//!                               # the multicast retransmits it caused (every line) and
//!                               # snapshots; also the pace of multicast retransmits
//! repair_burst_bytes = 8388608  # of which this much at once
//! repair_request_bytes = 1048576 # one retransmit request is answered with at most this
//! lag_alert_messages = 0        # report a subscriber this far behind (0 = never)
//!
//! [auth]
//! secret = "..."                # shared by publisher and subscribers (recovery admission)
//! datagram_tag = false          # an 8-byte tag on every datagram (untrusted fabrics)
//!
//! [[channels]]
//! id = 1
//! name = "itch"
//! line_a = "239.1.1.1"
//! line_b = "239.1.2.1"          # optional
//! port = 5001
//! # qkey = 0x01234567           # optional, rdma_cm's default for UD
//! ```
//! Every table rejects unknown keys, so a typo is an error, not a default.

use std::net::IpAddr;
use std::path::Path;

use serde::Deserialize;

use super::publisher::PublisherConfig;
use super::subscriber::SubscriberConfig;
use super::wire::{DATAGRAM_HEADER_LEN, MSG_PREFIX_LEN};

/// The QKey rdma_cm uses for UD and multicast (`RDMA_UDP_QKEY`).
pub const DEFAULT_QKEY: u32 = 0x0123_4567;
/// Largest RoCE path MTU.
pub const MAX_PATH_MTU: usize = 4096;
/// Upper bound of `max_message_bytes` (64 MiB).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Upper bound of `recovery_server.repair_bytes_per_sec` and
/// `repair_burst_bytes` (1 TiB: no limit in practice, and far from
/// overflowing the budget's arithmetic).
pub const MAX_REPAIR_BYTES_PER_SEC: u64 = 1 << 40;

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read market-data config {path}")]
    Read {
        /// The path as given.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Not valid TOML, or a key is unknown or mistyped.
    #[error("invalid market-data config")]
    Parse(#[source] toml::de::Error),
    /// A value is out of range; `key` names it as written in the file.
    #[error("market-data config: `{key}` {reason}")]
    Invalid {
        /// Dotted key, e.g. `recovery.max_retries` or `channels[1].line_b`.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// How a channel's stream reaches its subscribers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// UD multicast on `line_a` (and `line_b`), gaps repaired over RC.
    #[default]
    Multicast,
    /// RC fan-out for fabrics that route no multicast: the publisher
    /// RDMA-WRITEs every datagram into each subscriber's ring
    /// ([`super::rcfanout`]); `line_a`/`line_b` must be left out.
    Rc,
}

impl Transport {
    /// The name as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Multicast => "multicast",
            Transport::Rc => "rc",
        }
    }
}

/// One channel: a stream carried on one or two multicast groups, or (with
/// `transport = "rc"`) fanned out over RC connections.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    /// Channel id carried in every datagram.
    pub id: u16,
    /// Human-readable name (logs, counters).
    pub name: String,
    /// `"multicast"` (the default) or `"rc"`.
    #[serde(default)]
    pub transport: Transport,
    /// Multicast group of line A (required with multicast, absent with rc,
    /// where it reads as the unspecified address).
    #[serde(default = "no_group")]
    pub line_a: IpAddr,
    /// Multicast group of line B, if the stream is duplicated.
    #[serde(default)]
    pub line_b: Option<IpAddr>,
    /// rdma_cm (RC) port of the publisher's recovery and snapshot service.
    pub port: u16,
    /// UD QKey.
    #[serde(default = "default_qkey")]
    pub qkey: u32,
}

fn default_qkey() -> u32 {
    DEFAULT_QKEY
}

fn no_group() -> IpAddr {
    IpAddr::from([0u8; 4])
}

/// Receive-side queue sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReceiveConfig {
    /// Receive work requests posted per line.
    pub depth: u32,
    /// Re-post receive buffers in batches of this many.
    pub replenish_batch: u32,
    /// Fewer posted receives than this is counted as "receive queue low"
    /// (clamped to `depth`).
    pub low_water: u32,
}

impl Default for ReceiveConfig {
    fn default() -> Self {
        ReceiveConfig {
            depth: 1024,
            replenish_batch: 32,
            low_water: 128,
        }
    }
}

/// Publisher batching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchingConfig {
    /// Most messages per datagram.
    pub max_messages: u16,
    /// Longest a non-empty datagram waits before it is flushed.
    pub flush_interval_ns: u64,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        BatchingConfig {
            max_messages: 64,
            flush_interval_ns: 0,
        }
    }
}

/// Publisher pacing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PacingConfig {
    /// Average datagram rate limit; 0 disables pacing.
    pub max_datagrams_per_sec: u64,
    /// Datagrams allowed back to back.
    pub burst: u64,
}

impl Default for PacingConfig {
    fn default() -> Self {
        PacingConfig {
            max_datagrams_per_sec: 0,
            burst: 32,
        }
    }
}

/// Subscriber recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    /// Least wait for a retransmission before asking again.
    pub timeout_ns: u64,
    /// Most wait: above `timeout_ns` the wait follows the measured time a
    /// repair takes (unicast or multicast), backing off when a request goes
    /// unanswered, within `timeout_ns..=max_timeout_ns`; at or below it the
    /// wait is `timeout_ns`, fixed
    /// ([`SubscriberConfig::max_recovery_timeout_ns`]).
    pub max_timeout_ns: u64,
    /// Re-requests before a range is declared lost.
    pub max_retries: u32,
    /// Retransmit requests in flight at once.
    pub max_outstanding: usize,
    /// Datagrams held out of order.
    pub max_buffered: usize,
    /// Time without snapshot progress before asking again.
    pub snapshot_timeout_ns: u64,
    /// RC ACK timeout exponent of the recovery connections (4.096 us x
    /// 2^exp; 12 = 16.8 ms): how fast RC itself resends a lost request.
    pub rc_timeout: u8,
    /// A/B arbitration window: a hole is requested only if the other line
    /// has not filled it within this time. 0 = at once; ignored (0) for a
    /// channel with one line.
    pub ab_grace_ns: u64,
    /// First delay before reconnecting a lost recovery connection; doubles
    /// per failed attempt up to `reconnect_max_ns`.
    pub reconnect_min_ns: u64,
    /// Longest delay between reconnection attempts.
    pub reconnect_max_ns: u64,
    /// A subscriber whose first datagram starts at most this many messages
    /// into the stream asks the history for the start it missed (it was
    /// there, the first datagrams were lost) instead of a snapshot.
    pub join_replay_max: u64,
    /// Most messages one retransmit request asks for: the subscriber splits
    /// larger holes, the publisher answers no more than this per request.
    pub max_request_messages: u64,
    /// The subscriber reports its position and receive rate to the
    /// publisher this often, over the recovery connection (0: never).
    pub status_interval_ns: u64,
    /// Gap-tolerant delivery: a hole that has held up delivery this long
    /// (or is known unrecoverable) is skipped and reported to the handler
    /// (`Handler::on_gap`, `Event::GapSkipped`) instead of re-synchronising
    /// from a snapshot. 0 (the default): strict, never skip.
    pub gap_tolerance_ns: u64,
    /// A recovery link that answers nothing (requests time out, delivery
    /// does not move) is dropped and reconnected after three request
    /// timeouts in a row and no sooner than this long after it last showed
    /// progress, so a publisher busy or descheduled for a moment keeps its
    /// subscribers. 0: after the timeouts alone. On an RC fan-out channel
    /// (`transport = "rc"`): a connection that brought nothing, not even a
    /// heartbeat, for this long (at least ten `heartbeat_interval_ns`) is
    /// given up and made again.
    pub dead_link_ns: u64,
    /// Untagged datagrams (no `auth.secret`) starting more than this many
    /// messages beyond the highest sequence known are an unconfirmed claim:
    /// no hole is requested and nothing is declared lost until the stream
    /// corroborates the jump, so one forged heartbeat cannot skip the feed.
    pub claim_threshold: u64,
    /// Far-ahead datagrams that must back a claim before it is accepted.
    pub claim_packets: u32,
    /// How long a claim must stand with no new datagram of the stream
    /// before it is accepted (keep it well above `heartbeat_interval_ns`).
    pub claim_timeout_ns: u64,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            timeout_ns: 200_000,
            max_timeout_ns: 100_000_000,
            max_retries: 3,
            max_outstanding: 16,
            max_buffered: 4096,
            snapshot_timeout_ns: 1_000_000_000,
            rc_timeout: 12,
            ab_grace_ns: 20_000,
            reconnect_min_ns: 1_000_000,
            reconnect_max_ns: 1_000_000_000,
            join_replay_max: 4096,
            max_request_messages: 4096,
            status_interval_ns: 100_000_000,
            gap_tolerance_ns: 0,
            dead_link_ns: 1_000_000_000,
            claim_threshold: 4096,
            claim_packets: 3,
            claim_timeout_ns: 20_000_000,
        }
    }
}

/// Limits of the publisher's recovery and snapshot port: what an admitted
/// (or would-be) client can cost the publishing thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryServerConfig {
    /// Recovery connections at once, handshakes in progress included; a
    /// request beyond is rejected ("busy").
    pub max_connections: usize,
    /// Handshakes in progress (connections that have not proved the
    /// secret) from one address at once, checked before `max_connections`
    /// and less than it, so one address never holds every slot
    /// ([`crate::admission`]).
    pub max_pending_per_address: usize,
    /// With this many handshakes in progress, a connect request (already
    /// proved) must echo an admission cookie before it takes a slot: it is
    /// answered a reject carrying a cookie bound to its address, valid one
    /// to two `handshake_timeout_ns`, and the subscriber connects again
    /// with it ([`crate::admission::CookieJar`]). Proved hellos that never
    /// echo one (sent from addresses their sender cannot receive at) then
    /// hold at most this many slots; a replayed hello gets silence before
    /// this (`request_max_age_ms`). 0: always.
    /// Less than `max_connections`.
    pub cookie_when_pending: usize,
    /// A connection whose proof of the shared secret has not arrived this
    /// long after the accept is dropped.
    pub handshake_timeout_ns: u64,
    /// A proved hello made (by the time in its nonce, covered by its
    /// proof) more than this long before or after the publisher's wall
    /// clock is refused, and one answered before is refused inside this
    /// window: a captured hello played again gets silence and no slot
    /// ([`crate::admission::ReplayGuard`], as on the orders listener). The
    /// hosts' clocks must agree within it. At least 1000.
    pub request_max_age_ms: u64,
    /// Retransmit requests per second per connection (token bucket); the
    /// excess is dropped and counted.
    pub requests_per_sec: u64,
    /// Retransmit requests a connection may send back to back.
    pub request_burst: u64,
    /// Snapshot requests per second per connection.
    pub snapshots_per_sec: u64,
    /// Snapshot requests a connection may send back to back.
    pub snapshot_burst: u64,
    /// A serialised snapshot is reused for every request within this time
    /// of its making (and for as long as its sequence is current), so
    /// clients asking at once cost one serialisation; not once the history
    /// has lost a message after it (the client could not catch up from it).
    pub snapshot_reuse_ns: u64,
    /// Bytes of answers queued on one connection beyond which its requests
    /// are dropped (counted).
    pub max_outbox_bytes: usize,
    /// RNR retries of the publisher's recovery queue pairs (0..=6): a
    /// client with no receive posted fails the send after this many, and is
    /// dropped. 7 (retry for ever) is refused.
    pub rnr_retry: u8,
    /// A connection with answers queued that could send none of them for
    /// this long is dropped.
    pub stall_timeout_ns: u64,
    /// Log lines per second about refused connections and dropped requests
    /// (the counters count every one).
    pub log_per_sec: u32,
    /// Answer a loss that several subscribers share with one multicast
    /// retransmit instead of one unicast repair each
    /// ([`super::repair`]); false: unicast only.
    pub multicast_repair: bool,
    /// Requests of different subscribers for one range within this time are
    /// one loss (and a multicast retransmit covers the requests that follow
    /// it this long).
    pub repair_window_ns: u64,
    /// A subscriber's request for a range answered to it (by unicast or
    /// multicast) less than this long ago crossed the answer in flight and
    /// is dropped (counted `repair_requests_suppressed`); later it is
    /// answered again. About the round trip to the subscribers plus the time
    /// they take to read the answer; at most `repair_window_ns` in effect.
    /// 0: every retry is answered.
    pub repair_holdoff_ns: u64,
    /// The repair budget of one connection, bytes per second: every byte
    /// sent on its behalf (unicast answers with their headers, the
    /// multicast retransmits its requests caused, once per line, and
    /// snapshots) is charged to it, and a request that finds it spent is
    /// dropped (counted `repair_budget_dropped`). Multicast retransmits are
    /// also paced at this rate, whoever caused them. See
    /// [`super::server`] for the bound it gives.
    pub repair_bytes_per_sec: u64,
    /// Bytes of the repair budget a connection may spend at once.
    pub repair_burst_bytes: u64,
    /// Bytes one retransmit request is answered with, at most (whole
    /// datagrams, at least one): the rest of its range is cut (counted
    /// `repair_requests_cut`) and asked for again by the subscriber.
    pub repair_request_bytes: u64,
    /// A subscriber more than this many messages behind the publisher is
    /// reported once ([`super::status::PublisherEvent::SubscriberLagging`]);
    /// 0: never.
    pub lag_alert_messages: u64,
}

impl RecoveryServerConfig {
    /// The caps on connections that have not proved the secret yet.
    pub fn pending_caps(&self) -> crate::admission::PendingCaps {
        crate::admission::PendingCaps {
            per_address: self.max_pending_per_address,
            total: self.max_connections,
        }
    }
}

impl Default for RecoveryServerConfig {
    fn default() -> Self {
        RecoveryServerConfig {
            max_connections: 32,
            max_pending_per_address: 2,
            cookie_when_pending: 4,
            handshake_timeout_ns: 1_000_000_000,
            request_max_age_ms: 30_000,
            requests_per_sec: 2000,
            request_burst: 256,
            snapshots_per_sec: 5,
            snapshot_burst: 8,
            snapshot_reuse_ns: 10_000_000,
            max_outbox_bytes: 8 << 20,
            rnr_retry: 3,
            stall_timeout_ns: 2_000_000_000,
            log_per_sec: 10,
            multicast_repair: true,
            repair_window_ns: 2_000_000,
            repair_holdoff_ns: 100_000,
            repair_bytes_per_sec: 32 << 20,
            repair_burst_bytes: 8 << 20,
            repair_request_bytes: 1 << 20,
            lag_alert_messages: 0,
        }
    }
}

/// Authentication of the market-data path.
#[derive(Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Secret shared by the publisher and its subscribers: the recovery
    /// connection's challenge-response proves it both ways, and the
    /// datagram tags are keyed by it. Empty: the handshake still runs (and
    /// still binds the session, QPN and GID it announces to the attempt),
    /// but anyone can pass it; binaries warn.
    pub secret: String,
    /// Append a 16-byte keyed tag to every datagram and drop datagrams
    /// whose tag is wrong. Both sides must agree (checked at connect).
    pub datagram_tag: bool,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("secret", &if self.secret.is_empty() { "" } else { "(set)" })
            .field("datagram_tag", &self.datagram_tag)
            .finish()
    }
}

/// The market-data section of a rocebus configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McastConfig {
    /// UD payload size limit, our header included (at most the path MTU).
    #[serde(default = "default_payload")]
    pub max_datagram_payload: usize,
    /// Datagrams the publisher keeps for retransmission.
    #[serde(default = "default_history")]
    pub history_depth: usize,
    /// Largest message: one larger than a datagram is sent as fragments
    /// (one datagram and one sequence each) and reassembled by the
    /// subscriber into a buffer of this size. 0 (the default): messages
    /// must fit one datagram. At most [`MAX_MESSAGE_BYTES`], and a whole
    /// message must fit the history.
    #[serde(default)]
    pub max_message_bytes: usize,
    /// An idle publisher sends a heartbeat this often, so a subscriber
    /// detects the loss of the last datagram of a burst.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_interval_ns: u64,
    /// Longest a set-up step may take, milliseconds: joining a line through
    /// rdma_cm, each attempt to make the recovery connection (the
    /// non-blocking ones [`McastSubscriber::new`] and a reconnect make
    /// across polls, and [`McastSubscriber::connect`]'s wait).
    ///
    /// [`McastSubscriber::connect`]: crate::mcast::McastSubscriber::connect
    /// [`McastSubscriber::new`]: crate::mcast::McastSubscriber::new
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    /// Receive queues.
    #[serde(default)]
    pub receive: ReceiveConfig,
    /// Batching.
    #[serde(default)]
    pub batching: BatchingConfig,
    /// Pacing.
    #[serde(default)]
    pub pacing: PacingConfig,
    /// Recovery.
    #[serde(default)]
    pub recovery: RecoveryConfig,
    /// The publisher's recovery port limits.
    #[serde(default)]
    pub recovery_server: RecoveryServerConfig,
    /// Authentication (recovery admission, datagram tags).
    #[serde(default)]
    pub auth: AuthConfig,
    /// RC fan-out (channels with `transport = "rc"`).
    #[serde(default)]
    pub rc_fanout: super::rcfanout::RcFanoutConfig,
    /// Channels.
    pub channels: Vec<ChannelConfig>,
    /// Transport settings (traffic class, service level, RC knobs, GID):
    /// the service's top-level `[rdma]` table, set by
    /// [`RdmaSettings::apply_to_mcast`](crate::rdma_settings::RdmaSettings::apply_to_mcast)
    /// or by [`from_toml_str`](Self::from_toml_str) from a file's `[rdma]`.
    #[serde(skip)]
    pub rdma: crate::rdma_settings::RdmaSettings,
}

fn default_payload() -> usize {
    1024
}
fn default_history() -> usize {
    4096
}
fn default_heartbeat() -> u64 {
    1_000_000
}

fn default_connect_timeout() -> u64 {
    10_000
}

impl McastConfig {
    /// Parses and validates TOML text.
    /// A top-level `[rdma]` table is read into [`rdma`](Self::rdma).
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let mut table: toml::Table = toml::from_str(text).map_err(ConfigError::Parse)?;
        let cfg: McastConfig = match table.remove("rdma") {
            // Parsed from the text itself, so errors keep their line.
            None => toml::from_str(text).map_err(ConfigError::Parse)?,
            Some(rdma) => {
                let mut cfg: McastConfig = toml::Value::Table(table)
                    .try_into()
                    .map_err(ConfigError::Parse)?;
                cfg.rdma = rdma.try_into().map_err(ConfigError::Parse)?;
                cfg
            }
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses (without validating) a TOML table already read, its `[rdma]`
    /// table, if any, into [`rdma`](Self::rdma): for loaders that take the
    /// market-data table out of a larger file.
    pub fn from_value(value: toml::Value) -> Result<Self, toml::de::Error> {
        let mut table = match value {
            toml::Value::Table(t) => t,
            other => return other.try_into(),
        };
        let rdma = table.remove("rdma").map(|v| v.try_into()).transpose()?;
        let mut cfg: McastConfig = toml::Value::Table(table).try_into()?;
        cfg.rdma = rdma.unwrap_or_default();
        Ok(cfg)
    }

    /// Registered (pinned) bytes a subscriber to `channels` channels holds
    /// at least: each line's receive slots (payload and GRH). For the
    /// memlock check at start-up.
    pub fn subscriber_pinned_bytes(&self, channels: usize) -> u64 {
        let lines: usize = self
            .channels
            .iter()
            .take(channels)
            .map(|c| 1 + usize::from(c.line_b.is_some()))
            .sum();
        let slot = (self.max_datagram_payload + crate::verbs::GRH_LEN).next_multiple_of(64);
        (lines * slot * self.receive.depth as usize) as u64
    }

    /// Registered (pinned) bytes a publisher of every channel holds at
    /// least: each channel's send slots (256 datagrams).
    pub fn publisher_pinned_bytes(&self) -> u64 {
        let slot = self.max_datagram_payload.next_multiple_of(64);
        (self.channels.len() * 256 * slot) as u64
    }

    /// Parses and validates the market-data part of a service's configuration, the way a
    /// subscriber reads the publisher's file so both sides agree on channels, groups,
    /// recovery and the secret: its `[market_data]` table (the feed handler's configuration),
    /// or the whole text when it has none (a bare file such as `configs/md.toml`). A
    /// top-level `[rdma]` table applies in either case.
    pub fn from_service_toml_str(text: &str) -> Result<Self, ConfigError> {
        let mut table: toml::Table = toml::from_str(text).map_err(ConfigError::Parse)?;
        let Some(md) = table.remove("market_data") else {
            return Self::from_toml_str(text);
        };
        let mut cfg = Self::from_value(md).map_err(ConfigError::Parse)?;
        if let Some(rdma) = table.remove("rdma") {
            cfg.rdma = rdma.try_into().map_err(ConfigError::Parse)?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// [`from_service_toml_str`](Self::from_service_toml_str) of the file at `path`.
    pub fn load_from_service(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_service_toml_str(&text)
    }

    /// Reads, parses and validates a TOML file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text)
    }

    /// Checks ranges and cross-field rules; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let tag = if self.auth.datagram_tag {
            crate::auth::DATAGRAM_TAG_LEN
        } else {
            0
        };
        let min_payload = DATAGRAM_HEADER_LEN + MSG_PREFIX_LEN + 1 + tag;
        if !(min_payload..=MAX_PATH_MTU).contains(&self.max_datagram_payload) {
            return Err(invalid(
                "max_datagram_payload",
                format!("must be within {min_payload}..={MAX_PATH_MTU} (the path MTU)"),
            ));
        }
        if self.history_depth == 0 {
            return Err(invalid("history_depth", "must be at least 1"));
        }
        if self.max_message_bytes > MAX_MESSAGE_BYTES {
            return Err(invalid(
                "max_message_bytes",
                format!("must be at most {MAX_MESSAGE_BYTES}"),
            ));
        }
        let one_datagram = self.max_datagram_payload - DATAGRAM_HEADER_LEN - MSG_PREFIX_LEN - tag;
        if self.max_message_bytes > one_datagram {
            let Some(chunk) = one_datagram
                .checked_sub(crate::mcast::wire::FRAGMENT_HEADER_LEN)
                .filter(|c| *c > 0)
            else {
                return Err(invalid(
                    "max_message_bytes",
                    "max_datagram_payload leaves no room for a fragment",
                ));
            };
            let fragments = self.max_message_bytes.div_ceil(chunk);
            if fragments > self.history_depth {
                return Err(invalid(
                    "max_message_bytes",
                    format!(
                        "a message of {} bytes takes {fragments} datagrams of {} message bytes: raise history_depth to at least that (twice is better), or lower max_message_bytes",
                        self.max_message_bytes, chunk
                    ),
                ));
            }
        }
        if self.receive.depth == 0 {
            return Err(invalid("receive.depth", "must be at least 1"));
        }
        if self.heartbeat_interval_ns == 0 {
            return Err(invalid("heartbeat_interval_ns", "must be greater than 0"));
        }
        if self.connect_timeout_ms == 0 {
            return Err(invalid("connect_timeout_ms", "must be greater than 0"));
        }
        if self.recovery.rc_timeout > 31 {
            return Err(invalid("recovery.rc_timeout", "must be within 0..=31"));
        }
        if self.receive.replenish_batch == 0 || self.receive.replenish_batch > self.receive.depth {
            return Err(invalid(
                "receive.replenish_batch",
                "must be within 1..=receive.depth",
            ));
        }
        if self.batching.max_messages == 0 {
            return Err(invalid("batching.max_messages", "must be at least 1"));
        }
        if self.pacing.max_datagrams_per_sec > 1_000_000_000 {
            return Err(invalid(
                "pacing.max_datagrams_per_sec",
                "must be at most 1e9 (0 disables pacing)",
            ));
        }
        if self.pacing.burst == 0 {
            return Err(invalid("pacing.burst", "must be at least 1"));
        }
        if self.recovery.timeout_ns == 0 {
            return Err(invalid("recovery.timeout_ns", "must be greater than 0"));
        }
        if self.recovery.max_outstanding == 0 {
            return Err(invalid("recovery.max_outstanding", "must be at least 1"));
        }
        if self.recovery.max_buffered == 0 {
            return Err(invalid("recovery.max_buffered", "must be at least 1"));
        }
        if self.recovery.snapshot_timeout_ns == 0 {
            return Err(invalid(
                "recovery.snapshot_timeout_ns",
                "must be greater than 0",
            ));
        }
        if self.recovery.reconnect_min_ns == 0
            || self.recovery.reconnect_min_ns > self.recovery.reconnect_max_ns
        {
            return Err(invalid(
                "recovery.reconnect_min_ns",
                "must be within 1..=recovery.reconnect_max_ns",
            ));
        }
        if self.recovery.max_request_messages == 0 {
            return Err(invalid(
                "recovery.max_request_messages",
                "must be at least 1",
            ));
        }
        let rs = &self.recovery_server;
        if rs.max_connections == 0 {
            return Err(invalid(
                "recovery_server.max_connections",
                "must be at least 1",
            ));
        }
        if let Err(e) = rs.pending_caps().validate() {
            return Err(invalid(
                "recovery_server.max_pending_per_address",
                format!("{e} (recovery_server.max_connections)"),
            ));
        }
        if rs.cookie_when_pending >= rs.max_connections {
            return Err(invalid(
                "recovery_server.cookie_when_pending",
                format!(
                    "{} must be less than recovery_server.max_connections ({}): a cookie is demanded before the port is full",
                    rs.cookie_when_pending, rs.max_connections
                ),
            ));
        }
        if rs.handshake_timeout_ns == 0 {
            return Err(invalid(
                "recovery_server.handshake_timeout_ns",
                "must be greater than 0",
            ));
        }
        if rs.request_max_age_ms < 1000 {
            return Err(invalid(
                "recovery_server.request_max_age_ms",
                format!(
                    "{} is below 1000: the hosts' clocks must agree within it, and a hello must get there in it",
                    rs.request_max_age_ms
                ),
            ));
        }
        for (key, rate, burst) in [
            ("requests_per_sec", rs.requests_per_sec, rs.request_burst),
            ("snapshots_per_sec", rs.snapshots_per_sec, rs.snapshot_burst),
        ] {
            if !(1..=1_000_000_000).contains(&rate) {
                return Err(invalid(
                    format!("recovery_server.{key}"),
                    "must be within 1..=1e9",
                ));
            }
            if burst == 0 {
                return Err(invalid(
                    format!("recovery_server.{}", key.replace("s_per_sec", "_burst")),
                    "must be at least 1",
                ));
            }
        }
        if rs.max_outbox_bytes < 64 << 10 {
            return Err(invalid(
                "recovery_server.max_outbox_bytes",
                "must be at least 65536",
            ));
        }
        if rs.rnr_retry > 6 {
            return Err(invalid(
                "recovery_server.rnr_retry",
                "must be within 0..=6 (7 retries for ever: a client that posts no receive would pin its connection)",
            ));
        }
        if rs.stall_timeout_ns == 0 {
            return Err(invalid(
                "recovery_server.stall_timeout_ns",
                "must be greater than 0",
            ));
        }
        if !(1..=MAX_REPAIR_BYTES_PER_SEC).contains(&rs.repair_bytes_per_sec) {
            return Err(invalid(
                "recovery_server.repair_bytes_per_sec",
                format!("must be within 1..={MAX_REPAIR_BYTES_PER_SEC} (bytes per second)"),
            ));
        }
        if rs.repair_request_bytes < self.max_datagram_payload as u64 {
            return Err(invalid(
                "recovery_server.repair_request_bytes",
                format!(
                    "must be at least max_datagram_payload ({}): a request is answered with whole datagrams",
                    self.max_datagram_payload
                ),
            ));
        }
        if rs.repair_burst_bytes < rs.repair_request_bytes
            || rs.repair_burst_bytes > MAX_REPAIR_BYTES_PER_SEC
        {
            return Err(invalid(
                "recovery_server.repair_burst_bytes",
                format!(
                    "must be within recovery_server.repair_request_bytes ({})..={MAX_REPAIR_BYTES_PER_SEC}",
                    rs.repair_request_bytes
                ),
            ));
        }
        if self.channels.is_empty() {
            return Err(invalid("channels", "at least one channel is required"));
        }
        if self.channels.iter().any(|c| c.transport == Transport::Rc) {
            self.rc_fanout.validate(self.max_datagram_payload)?;
        }
        for (i, ch) in self.channels.iter().enumerate() {
            let key = |field: &str| format!("channels[{i}].{field}");
            if ch.name.is_empty() {
                return Err(invalid(key("name"), "must not be empty"));
            }
            if ch.transport == Transport::Rc {
                if !ch.line_a.is_unspecified() || ch.line_b.is_some() {
                    let k = if ch.line_b.is_some() {
                        "line_b"
                    } else {
                        "line_a"
                    };
                    return Err(invalid(
                        key(k),
                        "has no meaning with transport = \"rc\" (the stream goes over RC to `port`): remove it",
                    ));
                }
            } else if ch.line_a.is_unspecified() {
                return Err(invalid(
                    key("line_a"),
                    "is required with transport = \"multicast\" (or set transport = \"rc\" for a fabric without multicast)",
                ));
            }
            if ch.transport == Transport::Multicast && !ch.line_a.is_multicast() {
                return Err(invalid(
                    key("line_a"),
                    format!("{} is not multicast", ch.line_a),
                ));
            }
            if let Some(b) = ch.line_b {
                if !b.is_multicast() {
                    return Err(invalid(key("line_b"), format!("{b} is not multicast")));
                }
                if b == ch.line_a {
                    return Err(invalid(key("line_b"), "must differ from line_a"));
                }
            }
            if let Some(j) = self.channels[..i].iter().position(|o| o.id == ch.id) {
                return Err(invalid(
                    key("id"),
                    format!("{} is already used by channels[{j}]", ch.id),
                ));
            }
            if let Some(j) = self.channels[..i].iter().position(|o| o.name == ch.name) {
                return Err(invalid(
                    key("name"),
                    format!("{:?} is already used by channels[{j}]", ch.name),
                ));
            }
        }
        Ok(())
    }

    /// The channel with id `id`.
    pub fn channel(&self, id: u16) -> Option<&ChannelConfig> {
        self.channels.iter().find(|c| c.id == id)
    }

    /// Publisher parameters for `channel` under `session`.
    pub fn publisher(&self, channel: u16, session: u64) -> PublisherConfig {
        PublisherConfig {
            channel,
            session,
            max_datagram: self.max_datagram_payload,
            max_messages: self.batching.max_messages,
            flush_interval_ns: self.batching.flush_interval_ns,
            history_depth: self.history_depth,
            max_message_bytes: self.max_message_bytes,
        }
    }

    /// [`connect_timeout_ms`](Self::connect_timeout_ms) as a duration.
    pub fn connect_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.connect_timeout_ms)
    }

    /// Subscriber parameters for `channel`.
    pub fn subscriber(&self, channel: u16) -> SubscriberConfig {
        SubscriberConfig {
            channel,
            max_datagram: self.max_datagram_payload,
            max_buffered: self.recovery.max_buffered,
            max_outstanding: self.recovery.max_outstanding,
            recovery_timeout_ns: self.recovery.timeout_ns,
            max_recovery_timeout_ns: self.recovery.max_timeout_ns,
            max_retries: self.recovery.max_retries,
            snapshot_timeout_ns: self.recovery.snapshot_timeout_ns,
            // With one line there is no other copy to wait for.
            ab_grace_ns: if self.channel(channel).is_some_and(|c| c.line_b.is_some()) {
                self.recovery.ab_grace_ns
            } else {
                0
            },
            join_replay_max: self.recovery.join_replay_max,
            max_request_messages: self.recovery.max_request_messages,
            max_message_bytes: self.max_message_bytes,
            gap_tolerance_ns: self.recovery.gap_tolerance_ns,
            claim_threshold: self.recovery.claim_threshold,
            claim_packets: self.recovery.claim_packets,
            claim_timeout_ns: self.recovery.claim_timeout_ns,
        }
    }

    /// The recovery port's admission key (from `auth.secret`).
    pub fn recovery_key(&self) -> crate::auth::Key {
        crate::auth::Key::derive(self.auth.secret.as_bytes(), crate::auth::Purpose::Recovery)
    }

    /// The datagram tag key, when `auth.datagram_tag` is on.
    pub fn datagram_key(&self) -> Option<crate::auth::DatagramKey> {
        self.auth
            .datagram_tag
            .then(|| crate::auth::DatagramKey::derive(self.auth.secret.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
max_datagram_payload = 1024
history_depth = 8192

[receive]
depth = 2048
replenish_batch = 64

[batching]
max_messages = 32
flush_interval_ns = 5000

[pacing]
max_datagrams_per_sec = 1000000
burst = 16

[recovery]
timeout_ns = 100000
max_retries = 5
max_outstanding = 8
max_buffered = 1024
snapshot_timeout_ns = 500000000

[[channels]]
id = 1
name = "itch"
line_a = "239.1.1.1"
line_b = "239.1.2.1"
port = 5001

[[channels]]
id = 2
name = "opra"
line_a = "ff15::1"
port = 5002
qkey = 0x11111111
"#;

    /// A subscriber reads the publisher's service file: its `[market_data]` table, with the
    /// file's top-level `[rdma]`; a bare market-data file the same way; an error inside the
    /// table names its key.
    #[test]
    fn a_services_file_gives_its_market_data_table() {
        let mut nested = String::from(
            "[feed]\ngroup = \"239.1.1.1:1\"\n[rdma]\ntraffic_class = 104\n[market_data]\n",
        );
        for line in FULL.lines() {
            let line = match (line.strip_prefix("[["), line.strip_prefix('[')) {
                (Some(t), _) => format!("[[market_data.{t}"),
                (None, Some(t)) => format!("[market_data.{t}"),
                _ => line.to_string(),
            };
            nested.push_str(&line);
            nested.push('\n');
        }
        let cfg = McastConfig::from_service_toml_str(&nested).unwrap();
        assert_eq!(
            cfg,
            McastConfig {
                rdma: cfg.rdma,
                ..McastConfig::from_toml_str(FULL).unwrap()
            }
        );
        assert_eq!(cfg.rdma.traffic_class, 104);
        let bare = format!("{FULL}\n[rdma]\ntraffic_class = 104\n");
        assert_eq!(McastConfig::from_service_toml_str(&bare).unwrap(), cfg);
        let bad = nested.replace("history_depth = 8192", "history_dpth = 8192");
        let e = McastConfig::from_service_toml_str(&bad).unwrap_err();
        let why = std::error::Error::source(&e)
            .map(|s| s.to_string())
            .unwrap_or_default();
        assert!(why.contains("history_dpth"), "{e}: {why}");
    }

    #[test]
    fn parses_full_config() {
        let cfg = McastConfig::from_toml_str(FULL).unwrap();
        assert_eq!(cfg.history_depth, 8192);
        assert_eq!(cfg.receive.replenish_batch, 64);
        assert_eq!(cfg.batching.flush_interval_ns, 5000);
        assert_eq!(cfg.pacing.burst, 16);
        assert_eq!(cfg.recovery.max_retries, 5);
        assert_eq!(cfg.channels.len(), 2);
        assert_eq!(cfg.channels[0].qkey, DEFAULT_QKEY);
        assert_eq!(cfg.channels[1].qkey, 0x1111_1111);
        assert_eq!(cfg.channels[1].line_b, None);
        assert_eq!(cfg.channel(2).unwrap().name, "opra");
        let p = cfg.publisher(1, 77);
        assert_eq!((p.max_datagram, p.max_messages, p.session), (1024, 32, 77));
        let s = cfg.subscriber(1);
        assert_eq!(
            (s.max_buffered, s.max_outstanding, s.max_retries),
            (1024, 8, 5)
        );
    }

    #[test]
    fn large_messages_and_gap_tolerance_are_checked() {
        let ch = "[[channels]]\nid = 1\nname = \"a\"\nline_a = \"239.0.0.1\"\nport = 1\n";
        let cfg = McastConfig::from_toml_str(ch).unwrap();
        assert_eq!(cfg.max_message_bytes, 0);
        assert_eq!(cfg.subscriber(1).gap_tolerance_ns, 0, "strict by default");
        let cfg = McastConfig::from_toml_str(&format!(
            "max_message_bytes = 1048576\n[recovery]\ngap_tolerance_ns = 5000000\n{ch}"
        ))
        .unwrap();
        assert_eq!(cfg.publisher(1, 1).max_message_bytes, 1 << 20);
        let s = cfg.subscriber(1);
        assert_eq!(
            (s.max_message_bytes, s.gap_tolerance_ns),
            (1 << 20, 5_000_000)
        );
        // 1 MiB in 990-byte fragments is 1,060 datagrams: more than the history.
        let err = McastConfig::from_toml_str(&format!(
            "max_message_bytes = 1048576\nhistory_depth = 1000\n{ch}"
        ))
        .unwrap_err();
        assert!(err.to_string().contains("1060"), "{err}");
        assert!(
            McastConfig::from_toml_str(&format!("max_message_bytes = 67108865\n{ch}")).is_err()
        );
    }

    #[test]
    fn defaults_apply() {
        let cfg = McastConfig::from_toml_str(
            "[[channels]]\nid = 1\nname = \"a\"\nline_a = \"239.0.0.1\"\nport = 1\n",
        )
        .unwrap();
        assert_eq!(cfg.max_datagram_payload, 1024);
        assert_eq!(cfg.recovery, RecoveryConfig::default());
    }

    #[test]
    fn io_keys_parse_and_are_checked() {
        let base = "[[channels]]\nid = 1\nname = \"a\"\nline_a = \"239.0.0.1\"\nport = 1\n";
        let cfg = McastConfig::from_toml_str(&format!(
            "heartbeat_interval_ns = 500\n[receive]\nlow_water = 7\n[recovery]\nrc_timeout = 9\n{base}"
        ))
        .unwrap();
        assert_eq!(cfg.heartbeat_interval_ns, 500);
        assert_eq!(cfg.receive.low_water, 7);
        assert_eq!(cfg.recovery.rc_timeout, 9);
        let d = McastConfig::from_toml_str(base).unwrap();
        assert_eq!(
            (
                d.heartbeat_interval_ns,
                d.receive.low_water,
                d.recovery.rc_timeout
            ),
            (1_000_000, 128, 12)
        );
        assert_eq!(
            key_of(&format!("heartbeat_interval_ns = 0\n{base}")),
            "heartbeat_interval_ns"
        );
        assert_eq!(
            key_of(&format!("[recovery]\nrc_timeout = 32\n{base}")),
            "recovery.rc_timeout"
        );
    }

    #[test]
    fn ab_grace_applies_only_with_two_lines() {
        let cfg = McastConfig::from_toml_str(&FULL.replace(
            "snapshot_timeout_ns = 500000000",
            "snapshot_timeout_ns = 500000000\nab_grace_ns = 7000",
        ))
        .unwrap();
        assert_eq!(cfg.subscriber(1).ab_grace_ns, 7000, "channel 1 has line B");
        assert_eq!(cfg.subscriber(2).ab_grace_ns, 0, "channel 2 has one line");
        assert_eq!(
            McastConfig::from_toml_str(FULL)
                .unwrap()
                .subscriber(1)
                .ab_grace_ns,
            RecoveryConfig::default().ab_grace_ns
        );
        let bad = FULL.replace(
            "snapshot_timeout_ns = 500000000",
            "snapshot_timeout_ns = 500000000\nreconnect_min_ns = 5\nreconnect_max_ns = 4",
        );
        assert_eq!(key_of(&bad), "recovery.reconnect_min_ns");
    }

    fn key_of(text: &str) -> String {
        match McastConfig::from_toml_str(text) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn recovery_server_and_auth_keys_parse_and_are_checked() {
        let d = McastConfig::from_toml_str(FULL).unwrap();
        assert_eq!(d.recovery_server, RecoveryServerConfig::default());
        assert_eq!(d.recovery_server.rnr_retry, 3);
        assert!(!d.auth.datagram_tag && d.datagram_key().is_none());
        assert_eq!(d.recovery.max_request_messages, 4096);
        let text = format!(
            "{FULL}\n[recovery_server]\nmax_connections = 4\ncookie_when_pending = 2\nrnr_retry = 0\n\n[auth]\nsecret = \"s3cret\"\ndatagram_tag = true\n"
        );
        let cfg = McastConfig::from_toml_str(&text).unwrap();
        assert_eq!(cfg.recovery_server.max_connections, 4);
        assert!(cfg.auth.datagram_tag && cfg.datagram_key().is_some());
        assert!(!format!("{:?}", cfg.auth).contains("s3cret"));
        for (bad, key) in [
            ("rnr_retry = 7", "recovery_server.rnr_retry"),
            ("max_connections = 0", "recovery_server.max_connections"),
            (
                "cookie_when_pending = 32",
                "recovery_server.cookie_when_pending",
            ),
            ("requests_per_sec = 0", "recovery_server.requests_per_sec"),
            ("snapshot_burst = 0", "recovery_server.snapshot_burst"),
            ("max_outbox_bytes = 1", "recovery_server.max_outbox_bytes"),
            ("stall_timeout_ns = 0", "recovery_server.stall_timeout_ns"),
            (
                "request_max_age_ms = 999",
                "recovery_server.request_max_age_ms",
            ),
            (
                "repair_bytes_per_sec = 0",
                "recovery_server.repair_bytes_per_sec",
            ),
            (
                "repair_request_bytes = 100",
                "recovery_server.repair_request_bytes",
            ),
            (
                "repair_burst_bytes = 65536",
                "recovery_server.repair_burst_bytes",
            ),
        ] {
            let text = format!("{FULL}\n[recovery_server]\n{bad}\n");
            assert_eq!(key_of(&text), key, "{bad}");
        }
        assert_eq!(
            key_of(&FULL.replace(
                "timeout_ns = 100000",
                "timeout_ns = 100000\nmax_request_messages = 0"
            )),
            "recovery.max_request_messages"
        );
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (
                "max_datagram_payload = 1024",
                "max_datagram_payload = 9000",
                "max_datagram_payload",
            ),
            ("history_depth = 8192", "history_depth = 0", "history_depth"),
            (
                "replenish_batch = 64",
                "replenish_batch = 4096",
                "receive.replenish_batch",
            ),
            (
                "max_messages = 32",
                "max_messages = 0",
                "batching.max_messages",
            ),
            ("burst = 16", "burst = 0", "pacing.burst"),
            (
                "max_retries = 5\nmax_outstanding = 8",
                "max_outstanding = 0",
                "recovery.max_outstanding",
            ),
            (
                "line_b = \"239.1.2.1\"",
                "line_b = \"10.0.0.1\"",
                "channels[0].line_b",
            ),
            (
                "line_b = \"239.1.2.1\"",
                "line_b = \"239.1.1.1\"",
                "channels[0].line_b",
            ),
            ("id = 2", "id = 1", "channels[1].id"),
            ("name = \"opra\"", "name = \"itch\"", "channels[1].name"),
            (
                "line_a = \"ff15::1\"",
                "line_a = \"::1\"",
                "channels[1].line_a",
            ),
        ];
        for (from, to, key) in cases {
            assert!(FULL.contains(from), "{from}");
            assert_eq!(key_of(&FULL.replacen(from, to, 1)), key, "{to}");
        }
    }

    #[test]
    fn unknown_and_mistyped_keys_are_parse_errors() {
        for text in [
            FULL.replace("burst = 16", "burts = 16"),
            FULL.replace("port = 5001", "port = 5001\ngroup = 1"),
            FULL.replace("port = 5001", "port = \"x\""),
            FULL.replace("[[channels]]\nid = 2", "[[channels]]\nid = 70000"),
        ] {
            assert!(matches!(
                McastConfig::from_toml_str(&text),
                Err(ConfigError::Parse(_))
            ));
        }
        assert!(matches!(
            McastConfig::from_toml_str("history_depth = 1"),
            Err(ConfigError::Parse(_))
        ));
    }

    #[test]
    fn missing_file_is_a_read_error() {
        let err = McastConfig::load("does/not/exist.toml").unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        assert!(err.to_string().contains("does/not/exist.toml"));
    }
}
