//! `rocebus stat` names the GID the feed handler's bus sends from (issue 43), on a real RDMA
//! device (soft-RoCE in the project's guest; `cargo xtask test` runs it, a plain `cargo test`
//! reports it ignored): the real `feed-handler run` binary publishes from an address added
//! for the test (so its GID is not the device's first IPv4 entry) with `[rdma] gid_index`
//! naming that entry; `rocebus stat --once` and `--json` must show the index, GID, type,
//! netdev, device, port and MTU that sysfs and `ibv_devinfo` give for it, and the start-up
//! log the same.

#[path = "../../core/tests/support/gid_stat.rs"]
mod gid_stat;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use gid_stat::{assert_stat_names, guest_addr, wait_for_label, KernelGid, SecondAddress, Service};

/// The `rocebus` binary, built next to the feed handler (`cargo xtask test` builds every
/// workspace binary first).
fn rocebus_bin() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_feed-handler")).with_file_name("rocebus");
    assert!(
        p.exists(),
        "{} missing: build the workspace's binaries first (`cargo build --workspace --bins`)",
        p.display()
    );
    p
}

/// A feed handler waiting for a UDP feed that never comes, publishing one channel from `ip`
/// and the GID table entry `gid_index`.
fn config(ip: IpAddr, gid_index: u32) -> String {
    format!(
        "[feed]\ngroup = \"239.9.9.44:27044\"\ninterface = \"{ip}\"\n\
         [publish]\nlocal_ip = \"{ip}\"\n\
         [service]\nidle = {{ kind = \"yield\" }}\n\
         [rdma]\ngid_index = {gid_index}\n\
         [market_data]\nmax_datagram_payload = 1024\nhistory_depth = 1024\nheartbeat_interval_ns = 1000000\n\
         [[market_data.channels]]\nid = 1\nname = \"gid\"\nline_a = \"239.9.9.45\"\nport = 27045\n"
    )
}

#[test]
#[ignore = "rdma: runs the feed handler on an RDMA device and reads its GID with rocebus stat"]
fn rdma_feed_handler_stat_names_the_bus_gid() {
    let ip = guest_addr();
    let second = SecondAddress::add(ip, 144);
    let want = KernelGid::of(second.ip());
    assert_ne!(
        want.index,
        KernelGid::of(ip).index,
        "the test needs an entry other than the first"
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("fh.toml");
    std::fs::write(&cfg, config(second.ip(), want.index)).unwrap();
    let counters = dir.path().join("counters");
    let file = counters.join("feed-handler.counters");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_feed-handler"));
    cmd.arg("run")
        .arg("--config")
        .arg(&cfg)
        .arg("--counters")
        .arg(&file)
        // Its log's default is errors only.
        .env("RUST_LOG", "info");
    let fh = Service::spawn(cmd, dir.path().join("fh.log"));
    wait_for_label(&file, "rdma.gid_index", &fh.log);
    assert_stat_names(&rocebus_bin(), &counters, "feed-handler", &want);
    fh.assert_logged("bus GID", &want);
}
