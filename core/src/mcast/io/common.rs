//! What the publisher's and the subscriber's shells share: message sizes,
//! rdma_cm timeouts and check intervals, the clock the state machines are
//! given, and the configuration look-ups both constructors make. Depends on
//! nothing else in this folder but [`super::error`].

use std::net::IpAddr;
use std::time::Duration;

use super::error::NetError;
use crate::mcast::config::{ChannelConfig, McastConfig};
use crate::mcast::wire;
use crate::rdma_settings::DEFAULT_MAX_INLINE;
use crate::verbs::{Gid, RcOptions};

/// Size of one RC message (a send slot of the recovery service, a receive
/// slot of the subscriber). Several recovery messages share one.
pub const RC_MSG_LEN: usize = 4096;
/// Snapshot bytes per SnapshotChunk, so a chunk fills one RC message.
pub const SNAPSHOT_CHUNK: usize = RC_MSG_LEN - wire::snapshot_chunk_len(0);

/// The inline limit of a market-data configuration: its `[rdma] max_inline`, else
/// [`DEFAULT_MAX_INLINE`] (multicast sends, recovery and snapshot connections alike).
pub(crate) fn inline_max(cfg: &McastConfig) -> u32 {
    cfg.rdma.max_inline.unwrap_or(DEFAULT_MAX_INLINE)
}

/// How long the publisher keeps an accepted connection waiting for
/// ESTABLISHED or the subscriber's first message (at least;
/// `connect_timeout_ms` when that is longer). Longer than a subscriber's
/// usual attempt: when our accept (REP) is lost, rdma_cm resends it only
/// after the CM response timeout (about 4 s by default). A lost RTU does
/// not wait for that: the subscriber's proof establishes the connection
/// (see `RecoveryIo::progress`).
pub(super) const PENDING_TIMEOUT: Duration = Duration::from_secs(10);

/// How often connection management (new, closed and half-set-up
/// connections) is looked at: each look is a system call on the rdma_cm
/// channel, so not once per loop.
pub const CM_CHECK_NS: u64 = 1_000_000;
/// The same while a connection is being set up, so each handshake step
/// waits little.
pub(super) const CM_STEP_NS: u64 = 50_000;

pub(crate) use crate::clock::now_ns;

pub(super) fn channel_of(cfg: &McastConfig, channel: u16) -> Result<&ChannelConfig, NetError> {
    let ch = cfg.channel(channel).ok_or(NetError::NoChannel(channel))?;
    // A `transport = "rc"` channel has no groups: see crate::mcast::rcfanout.
    if ch.transport != crate::mcast::config::Transport::Multicast {
        return Err(NetError::WrongTransport {
            channel,
            configured: ch.transport.as_str(),
        });
    }
    Ok(ch)
}

pub(super) fn rc_options(cfg: &McastConfig) -> RcOptions {
    cfg.rdma.rc_options(RcOptions {
        timeout: cfg.recovery.rc_timeout,
        ..RcOptions::default()
    })
}

/// The recovery port's queue pairs: RNR retries bounded, so a client that
/// never posts a receive fails our sends instead of holding them for ever
/// (`recovery_server.rnr_retry` wins over `[rdma] rnr_retry` here).
pub(super) fn server_rc_options(cfg: &McastConfig) -> RcOptions {
    RcOptions {
        rnr_retry: cfg.recovery_server.rnr_retry,
        ..rc_options(cfg)
    }
}

/// The GID a RoCE v2 device sends from for local address `ip` (its
/// IPv4-mapped form for IPv4), as a receiver reads it off the datagram.
pub(super) fn gid_of(ip: IpAddr) -> Gid {
    Gid(match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    })
}

/// Warns (once per constructor call) that an empty `auth.secret` admits anyone.
pub(super) fn warn_if_open(cfg: &McastConfig, channel: u16) {
    if cfg.auth.secret.is_empty() {
        tracing::warn!(
            channel,
            "market data: auth.secret is empty, so the recovery handshake proves nothing: set a shared secret"
        );
    }
}
