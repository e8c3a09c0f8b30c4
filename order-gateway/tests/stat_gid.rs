//! `rocebus stat` names the GID each side of the orders path was configured with (issue 43),
//! on a real RDMA device (soft-RoCE in the project's guest; `cargo xtask test` runs these,
//! a plain `cargo test` reports them ignored). Each service is bound to an address added for
//! the test, so its GID is not the device's first IPv4 entry (the old, wrong guess), with
//! `[rdma] gid_index` naming that entry; what `rocebus stat --once` and `--json` must show
//! (index, GID, type, netdev, device, port, MTU) is read from sysfs and `ibv_devinfo`.
//!
//! - the real `order-gateway run --venue sim` binary: the GID of its engine listener;
//! - an engine (the engine crate's session, as the demo's `sample-engine` uses it) connected
//!   from a third address: the GID its connection to the gateway sends from, as its queue
//!   pair names it.

mod common;
#[path = "../../core/tests/support/gid_stat.rs"]
mod gid_stat;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{free_port, local_ip, scratch, ACCOUNT, ENGINE, ENGINE_TOKEN};
use gid_stat::{assert_stat_names, wait_for_label, KernelGid, SecondAddress, Service};
use order_gateway::client::{Client, EngineSession, LogonProgress};
use rocebus::counters::{counters_path, CountersFile};
use rocebus::orders::OrdersConfig;

/// A 128-bit key (`rocebus keygen --bits 128`): the binary refuses guessable tokens.
const ORDERS_TOKEN: &str = "5b0e2c7a9d14f3862a7c0e5b9f1d3a48";

/// The `rocebus` binary, built next to this package's binaries (`cargo xtask test` builds
/// every workspace binary first).
fn rocebus_bin() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_order-gateway")).with_file_name("rocebus");
    assert!(
        p.exists(),
        "{} missing: build the workspace's binaries first (`cargo build --workspace --bins`)",
        p.display()
    );
    p
}

/// A gateway with the venue simulator, no market data, listening on `listen` from the GID
/// table entry `gid_index`.
fn gateway_toml(listen: SocketAddr, dir: &Path, gid_index: u32) -> String {
    format!(
        r#"
[service]
listen = "{listen}"
idle = {{ kind = "backoff", max_spins = 1000, max_yields = 100, max_park_us = 50 }}
reconnect_secs = 1
control_socket = "{dir}/gw.control"
counters = true
[service.orders]
token = "{ORDERS_TOKEN}"
ring_size = 65536
max_payload = 1024
[rdma]
gid_index = {gid_index}
[fix]
venue_addr = "sim"
sender_comp_id = "GW"
target_comp_id = "VENUE"
heartbeat_secs = 30
[journal]
path = "{dir}/gw.journal"
fsync = "never"
[risk]
reference_max_age_ms = 60000
throttle_interval_ms = 1000
[[risk.accounts]]
id = {ACCOUNT}
max_order_qty = 100000
max_order_notional = 100000000
credit_limit = 1000000000000
max_position = 1000000000
max_open_orders = 100000
max_orders_per_interval = 100000
collar_bps = 500
[[risk.engines]]
id = {ENGINE}
accounts = [{ACCOUNT}]
token = "{ENGINE_TOKEN}"
"#,
        dir = dir.display()
    )
}

/// Starts `order-gateway run --venue sim` listening on `listen` from the entry of `gid`,
/// its counters in `dir/counters`, and waits for its `rdma.gid_index` line.
fn start_gateway(dir: &Path, listen: SocketAddr, gid: &KernelGid) -> (Service, PathBuf) {
    let config = dir.join("gw.toml");
    std::fs::write(&config, gateway_toml(listen, dir, gid.index)).unwrap();
    let counters = dir.join("counters");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_order-gateway"));
    cmd.args(["run", "--venue", "sim", "--config"])
        .arg(&config)
        .env("ROCEBUS_DIR", &counters)
        // Its own default (info) logs the GID.
        .env_remove("RUST_LOG");
    let gw = Service::spawn(cmd, dir.join("gw.log"));
    wait_for_label(
        &counters_path(&counters, "order-gateway"),
        "rdma.gid_index",
        &gw.log,
    );
    (gw, counters)
}

#[test]
#[ignore = "rdma: runs order-gateway on an RDMA device and reads its GID with rocebus stat"]
fn rdma_gateway_stat_names_the_listener_gid() {
    let ip = local_ip();
    let second = SecondAddress::add(ip, 141);
    let want = KernelGid::of(second.ip());
    let first = KernelGid::of(ip);
    assert_ne!(
        want.index, first.index,
        "the test needs an entry other than the first"
    );
    let dir = scratch("stat-gid-gw");
    let listen = SocketAddr::new(second.ip(), free_port());
    let (gw, counters) = start_gateway(&dir, listen, &want);
    assert_stat_names(&rocebus_bin(), &counters, "order-gateway", &want);
    // The start-up log names the same entry.
    gw.assert_logged("engine listener GID", &want);
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "rdma: connects an engine to order-gateway on an RDMA device and reads its GID with rocebus stat"]
fn rdma_engine_stat_names_its_gateway_connection_gid() {
    let ip = local_ip();
    let gw_addr = SecondAddress::add(ip, 142);
    let engine_addr = SecondAddress::add(ip, 143);
    let gw_gid = KernelGid::of(gw_addr.ip());
    let want = KernelGid::of(engine_addr.ip());
    assert_ne!(want.index, gw_gid.index);
    assert_ne!(want.index, KernelGid::of(ip).index);
    let dir = scratch("stat-gid-engine");
    let listen = SocketAddr::new(gw_addr.ip(), free_port());
    let (gw, _) = start_gateway(&dir, listen, &gw_gid);

    // The engine's side, configured as an engine's [rdma] table would: gid_index of its
    // own address.
    let mut cfg = OrdersConfig {
        ring_size: 65536,
        max_payload: 1024,
        token: ORDERS_TOKEN.into(),
        ..OrdersConfig::default()
    };
    cfg.rc.gid_index = Some(u8::try_from(want.index).unwrap());
    let mut logon = EngineSession::start(
        listen,
        engine_addr.ip(),
        &cfg,
        ENGINE,
        ENGINE_TOKEN,
        Client::new(1),
    )
    .expect("engine logon starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let session = loop {
        match logon.poll().expect("engine logon") {
            LogonProgress::Done(s) => break s,
            LogonProgress::Pending(p) => logon = p,
        }
        assert!(Instant::now() < deadline, "engine logon timed out");
        std::thread::sleep(Duration::from_millis(1));
    };
    let engine_counters = dir.join("engine-counters");
    let file = CountersFile::create(counters_path(&engine_counters, "engine"), 16).unwrap();
    let _rdma = session.export_rdma(&file, &cfg.rc).unwrap();
    let shown = assert_stat_names(&rocebus_bin(), &engine_counters, "engine", &want);
    // Its own entry, not the gateway's.
    assert!(!shown.contains(&gw_gid.gid.to_string()), "{shown}");
    drop(session);
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}
