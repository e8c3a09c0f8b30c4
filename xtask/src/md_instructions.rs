//! `cargo xtask bench md-instructions`: user-space instructions per one-way
//! message of the market-data path against `ib_send_lat -c UD -g`, counted
//! by callgrind in one soft-RoCE guest, the way `rc-instructions` counts the
//! orders path (same script and accounting: see [`crate::rc_instructions`]).
//!
//! rocebus's client is `rocebus-bench md-ping`, md-latency's ping-pong with
//! nothing else: it publishes on one group and polls its subscriber of the
//! other (and its publisher on the turns that delivered nothing) until the
//! echo's handler ran. Its echo is md-latency's, a second process it starts
//! itself, which valgrind runs natively. perftest ping-pongs over two
//! multicast groups, as md-latency's reference does, with the groups held
//! joined at the IP level (`with-groups`). rocebus's instructions are
//! broken down by part of the market-data path
//! (`rocebus-bench callgrind-account --parts md`).

use crate::rc_instructions::Counted;

/// `md-instructions`.
pub(crate) const MD: Counted = Counted {
    name: "md-instructions",
    ours_echo: "",
    ours_client: "md-ping",
    perftest: "ib_send_lat",
    perftest_extra: "-c UD -g",
    perftest_server: "-M 0:0:0:0:0:0:0:0:0:0:255:255:239:9:4:1",
    perftest_client: "-M 0:0:0:0:0:0:0:0:0:0:255:255:239:9:4:2",
    ip_groups: "239.9.4.1,239.9.4.2",
    parts: "md",
    goal: 1.25,
};
