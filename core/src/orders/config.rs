//! [`OrdersConfig`]: the orders path's settings (`[orders]` in the
//! binaries' TOML) and their checks. Pure values: nothing here touches a
//! device.

use crate::ring::frame::{frame_len, PROOF_LEN};
use crate::verbs::RcOptions;

/// Configuration of the orders path.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrdersConfig {
    /// Bytes of each incoming ring (power of two).
    pub ring_size: usize,
    /// Largest message payload (at most a quarter of the ring minus a header).
    pub max_payload: usize,
    /// Shared secret both sides must hold. It never travels: each side
    /// proves it knows it by a challenge-response in the handshake
    /// ([`crate::auth`]).
    pub token: String,
    /// Send queue depth.
    pub send_queue_depth: u32,
    /// Frames up to this size (bytes, header included) are posted inline.
    pub max_inline: u32,
    /// Request a completion every this many work requests.
    pub signal_every: u32,
    /// Largest single RDMA WRITE (0: no limit; a flush of many frames is
    /// one WRITE per contiguous run). Soft-RoCE (rxe in Linux 6.1) has
    /// failed retransmitted multi-packet WRITEs with "remote invalid
    /// request" under packet loss in our two-host tests; setting this to
    /// the path MTU keeps every WRITE one packet there.
    pub max_write_bytes: usize,
    /// RC knobs.
    pub rc: RcOptions,
    /// Connection set-up timeout, milliseconds (also how long a listener
    /// waits for a pending handshake to complete).
    pub connect_timeout_ms: u64,
    /// Largest ring (bytes, power of two) a peer may ask us to mirror: our
    /// staging area for it is that large. A larger request is refused
    /// before anything is allocated; a listener's larger reply is refused
    /// by the connector. At least `ring_size`.
    pub max_peer_ring_size: usize,
    /// Listener: handshakes in progress at once (each holds a queue pair and
    /// one of our rings until the peer's proof arrives or it times out);
    /// one more request is refused.
    pub max_pending_handshakes: usize,
    /// Listener: connections (pending and established) from one IP address;
    /// one more request from it is refused.
    pub max_connections_per_peer: usize,
    /// Listener: handshakes in progress from one IP address at once, checked
    /// before `max_pending_handshakes` and less than it, so one address (a
    /// stranger that never completes a handshake) can never hold every slot
    /// ([`crate::admission`]).
    pub max_pending_per_peer: usize,
    /// Listener: with this many handshakes in progress, a request (already
    /// proved) must echo an admission cookie before it takes a slot: it is
    /// answered a reject carrying a cookie bound to its address, valid one
    /// to two `connect_timeout_ms`, and [`Connection::connect`](super::Connection::connect)
    /// connects again with it ([`crate::admission::CookieJar`]). 0: always.
    /// Less than `max_pending_handshakes`.
    pub cookie_when_pending: usize,
    /// Listener: a connect request made (by the initiator's clock, carried
    /// in its nonce and covered by its proof) more than this many
    /// milliseconds before or after the listener's clock is refused
    /// silently, and one answered before is refused silently while it is
    /// younger ([`crate::admission::ReplayGuard`]): a captured request
    /// played again costs no slot. The hosts' wall clocks must agree within
    /// it. At least 1000.
    pub request_max_age_ms: u64,
    /// Listener: slots of its fan-in activity summary (0: off). Each
    /// accepted connection gets one while they last and marks it after
    /// every flush (one more one-byte WRITE), so a [`ConnectionSet`](super::ConnectionSet) or
    /// [`FanIn`](super::FanIn) polls only connections with new frames. At most 65536.
    pub fanin_slots: usize,
    /// Listener: an application that has not called
    /// [`accept`](super::OrdersListener::accept) for this many
    /// milliseconds (its thread frozen, or no longer taking connections) is
    /// taken for gone: a proved request is then refused with the reason
    /// ("not accepting connections, try again"), before anything is made
    /// for it, instead of being handed a connection nobody serves. The
    /// listener's own thread would complete the handshake either way; this
    /// is what keeps a peer from being told it is connected to an
    /// application that is not there. A blocking `accept` counts as
    /// looking for as long as it waits. 0: never refused for it.
    pub accept_stall_ms: u64,
}

impl Default for OrdersConfig {
    fn default() -> Self {
        Self {
            ring_size: 1 << 20,
            max_payload: 16 * 1024,
            token: String::new(),
            send_queue_depth: 512,
            max_inline: crate::rdma_settings::DEFAULT_MAX_INLINE,
            signal_every: 64,
            max_write_bytes: 0,
            rc: RcOptions::default(),
            connect_timeout_ms: 5000,
            max_peer_ring_size: 16 << 20,
            max_pending_handshakes: 8,
            max_connections_per_peer: 16,
            max_pending_per_peer: 2,
            cookie_when_pending: 4,
            request_max_age_ms: 30_000,
            fanin_slots: 0,
            accept_stall_ms: 2000,
        }
    }
}

impl OrdersConfig {
    /// Registered (pinned) bytes one connection holds at least: our ring
    /// and a staging area for the peer's, counted as large as ours (it is
    /// the peer's size, up to `max_peer_ring_size`). For the memlock check
    /// at start-up ([`RdmaSettings::prepare_process`](crate::rdma_settings::RdmaSettings::prepare_process)).
    pub fn pinned_bytes_per_connection(&self) -> u64 {
        2 * self.ring_size as u64
    }

    /// The listener's caps on handshakes in progress.
    pub fn pending_caps(&self) -> crate::admission::PendingCaps {
        crate::admission::PendingCaps {
            per_address: self.max_pending_per_peer,
            total: self.max_pending_handshakes,
        }
    }

    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !self.ring_size.is_power_of_two() || self.ring_size < 4096 {
            return Err(format!(
                "ring_size: {} is not a power of two >= 4096",
                self.ring_size
            ));
        }
        if self.ring_size > 1 << 31 {
            return Err(format!("ring_size: {} exceeds 2 GiB", self.ring_size));
        }
        if frame_len(self.max_payload) * 4 > self.ring_size {
            return Err(format!(
                "max_payload: {} is more than a quarter of ring_size {} (a frame adds an 8-byte header and an 8-byte seal)",
                self.max_payload, self.ring_size
            ));
        }
        if self.send_queue_depth < 16 {
            return Err("send_queue_depth: must be at least 16".into());
        }
        if self.signal_every == 0 || self.signal_every * 2 > self.send_queue_depth {
            return Err("signal_every: must be between 1 and half of send_queue_depth".into());
        }
        if self.rc.timeout > 31 || self.rc.retry_count > 7 || self.rc.rnr_retry > 7 {
            return Err("rc: timeout <= 31, retry_count <= 7, rnr_retry <= 7".into());
        }
        if (self.max_inline as usize) < PROOF_LEN {
            return Err(format!(
                "max_inline: must be at least {PROOF_LEN} (the handshake proof is sent inline)"
            ));
        }
        if !self.max_peer_ring_size.is_power_of_two()
            || self.max_peer_ring_size < self.ring_size
            || self.max_peer_ring_size > 1 << 31
        {
            return Err(format!(
                "max_peer_ring_size: {} is not a power of two between ring_size ({}) and 2 GiB",
                self.max_peer_ring_size, self.ring_size
            ));
        }
        if self.max_pending_handshakes < 2 || self.max_pending_handshakes > 1024 {
            return Err("max_pending_handshakes: must be between 2 and 1024".into());
        }
        self.pending_caps()
            .validate()
            .map_err(|e| format!("max_pending_per_peer: {e} (max_pending_handshakes)"))?;
        if self.cookie_when_pending >= self.max_pending_handshakes {
            return Err(format!(
                "cookie_when_pending: {} must be less than max_pending_handshakes ({}): a cookie is demanded before the listener is full",
                self.cookie_when_pending, self.max_pending_handshakes
            ));
        }
        if self.request_max_age_ms < 1000 {
            return Err(format!(
                "request_max_age_ms: {} is below 1000: the hosts' clocks must agree within it, and a request must get there in it",
                self.request_max_age_ms
            ));
        }
        if self.fanin_slots > 1 << 16 {
            return Err(format!("fanin_slots: {} is above 65536", self.fanin_slots));
        }
        if self.max_connections_per_peer == 0 {
            return Err("max_connections_per_peer: must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_gid_index_is_a_config_key() {
        let c: OrdersConfig = toml::from_str("[rc]\ngid_index = 3\n").unwrap();
        assert_eq!(c.rc.gid_index, Some(3));
        assert_eq!(OrdersConfig::default().rc.gid_index, None);
        assert!(toml::from_str::<OrdersConfig>("[rc]\ngid_index = 300\n").is_err());
    }

    #[test]
    fn traffic_class_comes_from_the_rdma_table_only() {
        // Parsed RC options keep the default class (a skipped key takes the
        // container's default, not 0) and refuse the key itself.
        let c: OrdersConfig = toml::from_str("[rc]\ntimeout = 12\n").unwrap();
        assert_eq!(
            c.rc.traffic_class,
            crate::rdma_settings::DEFAULT_TRAFFIC_CLASS
        );
        assert!(toml::from_str::<OrdersConfig>("[rc]\ntraffic_class = 1\n").is_err());
        let mut c = c;
        let rdma: crate::rdma_settings::RdmaSettings = toml::from_str::<toml::Table>(
            "[rdma]\ntraffic_class = 138\nservice_level = 2\nmax_inline = 64\nack_timeout = 9\n",
        )
        .map(|t| crate::rdma_settings::RdmaSettings::from_table(&t).unwrap())
        .unwrap();
        rdma.apply_to_orders(&mut c);
        assert_eq!((c.rc.traffic_class, c.rc.service_level), (138, 2));
        assert_eq!((c.max_inline, c.rc.timeout), (64, 9));
        c.validate().unwrap();
    }

    #[test]
    fn limits_have_safe_defaults_and_are_validated() {
        let c = OrdersConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.max_peer_ring_size, 16 << 20);
        let bad = |f: fn(&mut OrdersConfig), key: &str| {
            let mut c = OrdersConfig::default();
            f(&mut c);
            let e = c.validate().unwrap_err();
            assert!(e.starts_with(key), "{e}");
        };
        bad(|c| c.max_peer_ring_size = 3 << 20, "max_peer_ring_size");
        bad(|c| c.max_peer_ring_size = 1 << 19, "max_peer_ring_size");
        bad(|c| c.max_peer_ring_size = 1 << 32, "max_peer_ring_size");
        bad(|c| c.max_pending_handshakes = 0, "max_pending_handshakes");
        bad(|c| c.max_pending_handshakes = 1, "max_pending_handshakes");
        bad(|c| c.max_pending_per_peer = 0, "max_pending_per_peer");
        bad(|c| c.max_pending_per_peer = 8, "max_pending_per_peer");
        assert_eq!(c.max_pending_per_peer, 2);
        bad(|c| c.cookie_when_pending = 8, "cookie_when_pending");
        assert_eq!(c.cookie_when_pending, 4);
        bad(|c| c.request_max_age_ms = 999, "request_max_age_ms");
        assert_eq!(c.request_max_age_ms, 30_000);
        bad(
            |c| c.max_connections_per_peer = 0,
            "max_connections_per_peer",
        );
        bad(|c| c.max_inline = 16, "max_inline");
    }
}
