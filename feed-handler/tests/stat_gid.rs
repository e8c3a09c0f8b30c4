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
use std::process::Command;

use gid_stat::{guest_addr, second_address_gid, sibling_bin, Service};

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
    let exe = env!("CARGO_BIN_EXE_feed-handler");
    let (second, want) = second_address_gid(144);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("fh.toml");
    std::fs::write(&cfg, config(second.ip(), want.index)).unwrap();
    let file = dir.path().join("counters/feed-handler.counters");
    let mut cmd = Command::new(exe);
    cmd.arg("run")
        .arg("--config")
        .arg(&cfg)
        .arg("--counters")
        .arg(&file)
        // Its log's default is errors only.
        .env("RUST_LOG", "info");
    let fh = Service::spawn(cmd, dir.path().join("fh.log"));
    fh.assert_reports(
        &sibling_bin(exe, "rocebus"),
        &file,
        "feed-handler",
        "bus GID",
        &want,
    );
}

/// A feed handler whose `[service] core` names a core it cannot be pinned to stops with an
/// error naming it (issue 42) instead of running unpinned. Without the check it would start
/// and wait for its feed (the test would time out waiting for it to exit).
#[test]
#[ignore = "rdma: runs the feed handler on an RDMA device with a core it cannot pin to"]
fn rdma_feed_handler_with_a_core_it_cannot_pin_to_exits_with_an_error() {
    let ip = guest_addr();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("fh.toml");
    let text = format!(
        "[feed]\ngroup = \"239.9.9.46:27046\"\ninterface = \"{ip}\"\n\
         [publish]\nlocal_ip = \"{ip}\"\n\
         [service]\nidle = {{ kind = \"yield\" }}\ncore = 100000\n\
         [market_data]\nmax_datagram_payload = 1024\nhistory_depth = 1024\nheartbeat_interval_ns = 1000000\n\
         [[market_data.channels]]\nid = 1\nname = \"pin\"\nline_a = \"239.9.9.47\"\nport = 27047\n"
    );
    std::fs::write(&cfg, text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_feed-handler"))
        .arg("run")
        .arg("--config")
        .arg(&cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the feed handler still runs 60 s after starting with core = 100000");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "exited {status:?}: {stderr}");
    assert!(
        stderr.contains("core 100000"),
        "the error does not name the core: {stderr}"
    );
}
