//! The subscriber's recovery link: the RC connection to the publisher's
//! recovery port in its states (up, connecting, down), what a (re)connect
//! needs, and the client's side of the admission handshake (checking the
//! welcome, sending the proof). [`super::subscriber`] drives it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use super::common::RC_MSG_LEN;
use super::error::NetError;
use crate::admission::Cookie;
use crate::auth::Key;
use crate::mcast::backoff::Backoff;
use crate::mcast::server::{cookie_asked, Admission, ClientHandshake};
use crate::verbs::cm::{self, Connection};
use crate::verbs::{Dest, PoolConfig, PooledQp, ProtectionDomain, QpType, RcOptions, VerbsError};

/// The subscriber's recovery connection. Variant fields are dropped in
/// order: the queue pair before the rdma_cm id it was connected through.
pub(super) enum Link {
    Up {
        rc: PooledQp,
        conn: Connection,
    },
    Connecting {
        rc: PooledQp,
        connecting: cm::Connecting,
        handshake: ClientHandshake,
    },
    Down,
}

/// Checks the publisher's welcome (see [`ClientHandshake::on_welcome`]).
pub(super) fn admit(
    handshake: &ClientHandshake,
    welcome: &[u8],
    publisher: SocketAddr,
) -> Result<Admission, NetError> {
    handshake
        .on_welcome(welcome)
        .map_err(|reason| NetError::Admission { publisher, reason })
}

/// The cookie a failed connect asks `handshake`'s retry to echo: the
/// publisher was under load and answered our (proved) hello with a cookie
/// reply; `None` for any other failure, and for the retry itself.
pub(super) fn cookie_of(e: &VerbsError, handshake: &ClientHandshake) -> Option<Cookie> {
    match e {
        VerbsError::ConnectionRejected { private_data, .. } => {
            cookie_asked(private_data, handshake.echoes_cookie())
        }
        _ => None,
    }
}

/// Sends the proof as the connection's first message.
pub(super) fn send_proof(rc: &mut PooledQp, admitted: &Admission) -> Result<(), NetError> {
    // A fresh connection's send ring is empty: the send is taken.
    rc.send(&admitted.proof, &[Dest::Connected])?;
    Ok(())
}

/// Everything needed to (re)connect to the recovery service.
pub(super) struct Reconnect {
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) key: Key,
    pub(super) channel: u16,
    pub(super) tags: bool,
    pub(super) publisher: SocketAddr,
    pub(super) local: IpAddr,
    pub(super) opts: RcOptions,
    /// Inline limit of the recovery queue pair (`[rdma] max_inline`).
    pub(super) max_inline: u32,
    /// Bound of one connection attempt (`connect_timeout_ms`).
    pub(super) timeout: Duration,
    /// Next look at connection management (attempt, handshake step, or
    /// disconnect check), and the wait after a failed attempt.
    pub(super) backoff: Backoff,
}

impl Reconnect {
    /// Starts one connection attempt without waiting: a fresh queue pair, a
    /// fresh handshake (over the publisher's `cookie` when it asked for
    /// one), address resolution under way.
    pub(super) fn start_attempt(&self, cookie: Option<&Cookie>) -> Result<Link, NetError> {
        let rc = recovery_qp(&self.pd, self.max_inline)?;
        let connecting = cm::start_connect(self.publisher, Some(self.local), self.timeout)?;
        let handshake =
            ClientHandshake::with_cookie(self.key.clone(), self.channel, self.tags, cookie);
        Ok(Link::Connecting {
            rc,
            connecting,
            handshake,
        })
    }
}

pub(super) fn recovery_qp(
    pd: &Arc<ProtectionDomain>,
    max_inline: u32,
) -> Result<PooledQp, NetError> {
    Ok(PooledQp::new(
        pd,
        QpType::Rc,
        PoolConfig {
            recv_slots: 128,
            recv_len: RC_MSG_LEN,
            recv_batch: 16,
            recv_low_water: 16,
            send_slots: 32,
            send_len: 256,
            signal_every: 8,
            dests_per_send: 1,
            max_inline,
        },
    )?)
}
