//! Guest-side helpers for the tests that check what a service reports about
//! its GID (issue 43), shared by the test crates that include this file
//! (`#[path]`): a second address on the RDMA device's netdev, the GID table
//! entry the kernel gave it read straight from sysfs and `ibv_devinfo` (not
//! through rocebus's GID code, which is what the tests check), and the
//! `rdma.*` lines `rocebus stat --once` and `--json` print for a component.
// Each test crate that includes this file uses part of it.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A second IPv4 address on the RDMA device's netdev (the guest's eth0), for
/// a peer that must come from another address than the test's own, or a
/// service bound to an address whose GID is not the first; removed on drop.
/// Panics where it cannot be added: the test needs it.
pub struct SecondAddress(pub Ipv4Addr);

impl SecondAddress {
    /// `near`'s address plus `offset` in the last byte.
    pub fn add(near: IpAddr, offset: u8) -> SecondAddress {
        let IpAddr::V4(v4) = near else {
            panic!("an IPv4 address: {near}")
        };
        let o = v4.octets();
        let a = Ipv4Addr::new(o[0], o[1], o[2], o[3].wrapping_add(offset));
        let out = Command::new("ip")
            .args(["addr", "add", &format!("{a}/24"), "dev", "eth0"])
            .output()
            .expect("run ip (iproute2)");
        assert!(
            out.status.success(),
            "ip addr add {a}/24 dev eth0: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // rxe adds the address's GID asynchronously.
        let t = Instant::now();
        while sysfs_gid_index("rxe0", 1, a).is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "rxe0 never got a GID for {a}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        SecondAddress(a)
    }

    /// The address.
    pub fn ip(&self) -> IpAddr {
        IpAddr::V4(self.0)
    }
}

impl Drop for SecondAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["addr", "del", &format!("{}/24", self.0), "dev", "eth0"])
            .output();
    }
}

fn port_dir(device: &str, port: u8) -> PathBuf {
    Path::new("/sys/class/infiniband")
        .join(device)
        .join("ports")
        .join(port.to_string())
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The index of the entry of `device` port `port` holding `addr` (IPv4-mapped).
fn sysfs_gid_index(device: &str, port: u8, addr: Ipv4Addr) -> Option<u32> {
    let want = addr.to_ipv6_mapped();
    std::fs::read_dir(port_dir(device, port).join("gids"))
        .ok()?
        .flatten()
        .find_map(|e| {
            let gid: Ipv6Addr = read_trimmed(&e.path())?.parse().ok()?;
            let index = e.file_name().to_str()?.parse().ok()?;
            (gid == want).then_some(index)
        })
}

/// A GID table entry as the kernel shows it, with its port's active MTU:
/// what `rocebus stat` must name for a service bound to its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelGid {
    /// Device (`rxe0`).
    pub device: String,
    /// Port.
    pub port: u8,
    /// Index in the port's GID table.
    pub index: u32,
    /// The GID.
    pub gid: Ipv6Addr,
    /// `gid_attrs/types/N` (`RoCE v2`).
    pub gid_type: String,
    /// `gid_attrs/ndevs/N` (`eth0`).
    pub netdev: String,
    /// The port's active MTU as `ibv_devinfo` prints it.
    pub active_mtu: u32,
}

impl KernelGid {
    /// The entry of rxe0 port 1 holding `addr`.
    pub fn of(addr: IpAddr) -> KernelGid {
        let IpAddr::V4(v4) = addr else {
            panic!("an IPv4 address: {addr}")
        };
        let (device, port) = ("rxe0", 1);
        let index = sysfs_gid_index(device, port, v4)
            .unwrap_or_else(|| panic!("{device} port {port} has no GID for {addr}"));
        let dir = port_dir(device, port).join("gid_attrs");
        let attr = |what: &str| {
            read_trimmed(&dir.join(what).join(index.to_string()))
                .unwrap_or_else(|| panic!("{device} gid_attrs/{what}/{index} unreadable"))
        };
        KernelGid {
            device: device.into(),
            port,
            index,
            gid: v4.to_ipv6_mapped(),
            gid_type: attr("types"),
            netdev: attr("ndevs"),
            active_mtu: devinfo_active_mtu(device, port),
        }
    }

    /// The `rocebus stat` lines (label, value) that name this entry.
    pub fn stat_lines(&self) -> [(String, u64); 3] {
        [
            ("rdma.gid_index".into(), self.index.into()),
            (
                format!(
                    "rdma.gid {} {} {} {} port {}",
                    self.gid, self.gid_type, self.netdev, self.device, self.port
                ),
                self.index.into(),
            ),
            ("rdma.active_mtu".into(), self.active_mtu.into()),
        ]
    }
}

/// `active_mtu` of `device` port `port` from `ibv_devinfo` (rdma-core's own
/// tool, so the figure does not come from the code under test).
fn devinfo_active_mtu(device: &str, port: u8) -> u32 {
    let out = Command::new("ibv_devinfo")
        .args(["-d", device, "-i", &port.to_string()])
        .output()
        .expect("run ibv_devinfo (ibverbs-utils)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("active_mtu:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no active_mtu in ibv_devinfo's output:\n{text}"))
}

/// Waits up to 60 s for the counters file `path` to hold `label`; on
/// timeout panics with the service's log `log`.
pub fn wait_for_label(path: &Path, label: &str, log: &Path) {
    let t = Instant::now();
    loop {
        let found = rocebus::counters::CountersReader::open(path)
            .is_ok_and(|r| r.iter().any(|e| e.label.as_str() == label));
        if found {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no {label:?} in {} after 60 s; log:\n{}",
            path.display(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks that `rocebus stat --once` and `rocebus stat --json` (the binary
/// `rocebus`) show, for the component `component` of the counters directory
/// `dir`, the GID index, the GID with its type, netdev, device and port, and
/// the MTU of `want`. Returns the `--once` text.
pub fn assert_stat_names(rocebus: &Path, dir: &Path, component: &str, want: &KernelGid) -> String {
    let run = |format: &str| {
        let out = Command::new(rocebus)
            .args(["stat", format, "--dir"])
            .arg(dir)
            .arg(component)
            .output()
            .expect("run rocebus stat");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "rocebus stat {format} {component}: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let once = run("--once");
    for (label, value) in want.stat_lines() {
        // `  ID  LABEL (gauge)  VALUE  -`
        let shown = once.lines().find_map(|l| {
            let (id, rest) = l.trim_start().split_once(' ')?;
            id.parse::<u32>().ok()?;
            let rest = rest
                .trim_start()
                .strip_prefix(&format!("{label} (gauge) "))?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        });
        assert_eq!(
            shown,
            Some(value),
            "rocebus stat --once: {label:?} of {component} should be {value}:\n{once}"
        );
    }
    let json: serde_json::Value =
        serde_json::from_str(&run("--json")).expect("rocebus stat --json prints JSON");
    let comp = json["components"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["component"] == component))
        .unwrap_or_else(|| panic!("no component {component} in {json}"));
    for (label, value) in want.stat_lines() {
        let shown = comp["counters"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["label"] == label.as_str()))
            .map(|c| (c["kind"].clone(), c["value"].as_u64()));
        assert_eq!(
            shown,
            Some((serde_json::json!("gauge"), Some(value))),
            "rocebus stat --json: {label:?} of {component} should be a gauge of {value}:\n{comp}"
        );
    }
    once
}

/// A second address on the guest's RDMA netdev (`guest_addr()` plus `offset`) and its GID
/// table entry, checked to be another entry than the guest address's (the device's first
/// IPv4 entry, which the old guess took: a service reporting that would not be caught).
pub fn second_address_gid(offset: u8) -> (SecondAddress, KernelGid) {
    let ip = guest_addr();
    let second = SecondAddress::add(ip, offset);
    let want = KernelGid::of(second.ip());
    assert_ne!(
        want.index,
        KernelGid::of(ip).index,
        "the test needs another entry than the first"
    );
    (second, want)
}

/// The workspace binary `name` next to the test's binary `exe` (an
/// `env!("CARGO_BIN_EXE_...")`); `cargo xtask test` builds every workspace binary first.
pub fn sibling_bin(exe: &str, name: &str) -> PathBuf {
    let p = Path::new(exe).with_file_name(name);
    assert!(
        p.exists(),
        "{} missing: build the workspace's binaries first (`cargo build --workspace --bins`)",
        p.display()
    );
    p
}

/// The guest's address: `ROCEBUS_GUEST_ADDR` (set by `cargo xtask test`), else the IPv4
/// address of rxe0 port 1's entry 1 (the first IPv4 entry on soft-RoCE).
pub fn guest_addr() -> IpAddr {
    if let Some(a) = std::env::var("ROCEBUS_GUEST_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
    {
        return a;
    }
    read_trimmed(&port_dir("rxe0", 1).join("gids/1"))
        .and_then(|g| g.parse::<Ipv6Addr>().ok()?.to_ipv4_mapped())
        .map(IpAddr::V4)
        .expect("ROCEBUS_GUEST_ADDR unset and rxe0 has no IPv4 GID at index 1")
}

/// A process killed (and reaped) when the test ends, however it ends, with the file its
/// stderr goes to.
pub struct Service {
    /// The process.
    pub child: std::process::Child,
    /// Its stderr.
    pub log: PathBuf,
}

impl Service {
    /// Runs `cmd` with its stderr in `log`.
    pub fn spawn(mut cmd: Command, log: PathBuf) -> Service {
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the log"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        Service { child, log }
    }

    /// The line of its log that contains `what` (e.g. `bus GID`), checked to name `want`'s
    /// index, GID, type, netdev and MTU.
    pub fn assert_logged(&self, what: &str, want: &KernelGid) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let line = log
            .lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} line in the log:\n{log}"));
        for part in [
            format!("gid_index {}", want.index),
            format!("gid {} {}", want.gid, want.gid_type),
            format!("netdev {}", want.netdev),
            format!("active_mtu={}", want.active_mtu),
        ] {
            assert!(line.contains(&part), "{part:?} missing from {line:?}");
        }
    }
}

impl Service {
    /// Waits for the counters file `file` (component `component` of its directory) to
    /// carry the GID lines, then checks that `rocebus stat --once` and `--json` (`rocebus`)
    /// and the log line containing `what` name `want`. Returns the `--once` text.
    pub fn assert_reports(
        &self,
        rocebus: &Path,
        file: &Path,
        component: &str,
        what: &str,
        want: &KernelGid,
    ) -> String {
        wait_for_label(file, "rdma.gid_index", &self.log);
        let dir = file.parent().expect("a counters file in a directory");
        let shown = assert_stat_names(rocebus, dir, component, want);
        self.assert_logged(what, want);
        shown
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
