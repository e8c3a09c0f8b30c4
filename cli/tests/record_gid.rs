//! `rocebus stat` names the GID `rocebus record` receives on (issue 43), on a real RDMA
//! device (soft-RoCE in the project's guest; `cargo xtask test` runs it, a plain `cargo test`
//! reports it ignored): the recorder's `--local` is an address added for the test (so its
//! GID is not the device's first IPv4 entry) and the market-data file's `[rdma] gid_index`
//! names that entry; while it waits for its publisher, `rocebus stat --once` and `--json`
//! must show the index, GID, type, netdev, device, port and MTU that sysfs and `ibv_devinfo`
//! give for it, and its log the same.

#[path = "../../core/tests/support/gid_stat.rs"]
mod gid_stat;

use std::path::Path;
use std::process::Command;

use gid_stat::{assert_stat_names, guest_addr, wait_for_label, KernelGid, SecondAddress, Service};

/// A bare market-data file with one channel and `[rdma] gid_index`.
fn md_config(gid_index: u32) -> String {
    format!(
        "max_datagram_payload = 1024\nhistory_depth = 1024\nheartbeat_interval_ns = 1000000\n\
         [rdma]\ngid_index = {gid_index}\n\
         [[channels]]\nid = 1\nname = \"gid\"\nline_a = \"239.9.9.46\"\nport = 27046\n"
    )
}

#[test]
#[ignore = "rdma: runs rocebus record on an RDMA device and reads its GID with rocebus stat"]
fn rdma_record_stat_names_the_configured_gid() {
    let ip = guest_addr();
    let second = SecondAddress::add(ip, 145);
    let want = KernelGid::of(second.ip());
    assert_ne!(
        want.index,
        KernelGid::of(ip).index,
        "the test needs an entry other than the first"
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("md.toml");
    std::fs::write(&cfg, md_config(want.index)).unwrap();
    let counters = dir.path().join("counters");
    let file = counters.join("record.counters");
    let rocebus = Path::new(env!("CARGO_BIN_EXE_rocebus"));
    let mut cmd = Command::new(rocebus);
    cmd.arg("record")
        .arg("--config")
        .arg(&cfg)
        // Nobody publishes: the recorder waits, its counters up.
        .args(["--local", &second.ip().to_string(), "--publisher"])
        .arg(ip.to_string())
        .args(["--duration", "120", "-o"])
        .arg(dir.path().join("out.dbn"))
        .arg("--counters")
        .arg(&file)
        // Its own default: the GID line is logged without RUST_LOG.
        .env_remove("RUST_LOG");
    let rec = Service::spawn(cmd, dir.path().join("record.log"));
    wait_for_label(&file, "rdma.gid_index", &rec.log);
    assert_stat_names(rocebus, &counters, "record", &want);
    rec.assert_logged("recorder GID", &want);
}
