//! `rocebus stat` names the GID `rocebus record` receives on (issue 43), on a real RDMA
//! device (soft-RoCE in the project's guest; `cargo xtask test` runs it, a plain `cargo test`
//! reports it ignored): the recorder's `--local` is an address added for the test (so its
//! GID is not the device's first IPv4 entry) and the market-data file's `[rdma] gid_index`
//! names that entry; while it waits for its publisher, `rocebus stat --once` and `--json`
//! must show the index, GID, type, netdev, device, port and MTU that sysfs and `ibv_devinfo`
//! give for it, and its log (by default, without `RUST_LOG`) the same.

#[path = "../../core/tests/support/gid_stat.rs"]
mod gid_stat;

use std::path::Path;
use std::process::Command;

use gid_stat::{guest_addr, second_address_gid, Service};

#[test]
#[ignore = "rdma: runs rocebus record on an RDMA device and reads its GID with rocebus stat"]
fn rdma_record_stat_names_the_configured_gid() {
    let (second, want) = second_address_gid(145);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("md.toml");
    // A bare market-data file: one channel, and the entry to receive on.
    let md = format!(
        "max_datagram_payload = 1024\nhistory_depth = 1024\nheartbeat_interval_ns = 1000000\n\
         [rdma]\ngid_index = {}\n\
         [[channels]]\nid = 1\nname = \"gid\"\nline_a = \"239.9.9.46\"\nport = 27046\n",
        want.index
    );
    std::fs::write(&cfg, md).unwrap();
    let file = dir.path().join("counters/record.counters");
    let rocebus = Path::new(env!("CARGO_BIN_EXE_rocebus"));
    let mut cmd = Command::new(rocebus);
    cmd.arg("record")
        .arg("--config")
        .arg(&cfg)
        // Nobody publishes: the recorder waits, its counters up.
        .args(["--local", &second.ip().to_string(), "--publisher"])
        .arg(guest_addr().to_string())
        .args(["--duration", "120", "-o"])
        .arg(dir.path().join("out.dbn"))
        .arg("--counters")
        .arg(&file)
        .env_remove("RUST_LOG");
    let rec = Service::spawn(cmd, dir.path().join("record.log"));
    rec.assert_reports(rocebus, &file, "record", "recorder GID", &want);
}
