//! The RDMA device's own counters, read from sysfs, shown by `rocebus stat` beside ours.
//!
//! Linux exposes them per device and port as one decimal number per file under
//! `/sys/class/infiniband/DEV/ports/PORT/counters/` (the standard port counters) and
//! `.../hw_counters/` (driver-specific, e.g. soft-RoCE's `rcvd_pkts`, `duplicate_request`).
//! This module only reads files; a missing tree means no device, and a file that cannot be
//! read or parsed is skipped (some are write-only or return errors on some drivers).

use std::path::Path;

/// Where Linux puts RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// The two counter folders of a port.
pub const GROUPS: [&str; 2] = ["counters", "hw_counters"];

/// One hardware counter value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HwCounter {
    /// Device name, e.g. `rxe0` or `mlx5_0`.
    pub device: String,
    /// Port number as named in sysfs.
    pub port: String,
    /// `counters` or `hw_counters`.
    pub group: &'static str,
    /// Counter name (the file name).
    pub name: String,
    /// Value.
    pub value: u64,
}

/// Sorted names of the entries of `dir`; empty if it cannot be read.
fn names(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<String> = rd
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    out.sort();
    out
}

/// Reads every device, port and counter under `root` (normally [`SYSFS_ROOT`]), sorted by
/// device, port, group and name. Returns an empty list when `root` does not exist.
pub fn read_hw_counters(root: &Path) -> Vec<HwCounter> {
    let mut out = Vec::new();
    for device in names(root) {
        let ports = root.join(&device).join("ports");
        for port in names(&ports) {
            for group in GROUPS {
                let dir = ports.join(&port).join(group);
                for name in names(&dir) {
                    let Ok(text) = std::fs::read_to_string(dir.join(&name)) else {
                        continue;
                    };
                    let Ok(value) = text.trim().parse::<u64>() else {
                        continue;
                    };
                    out.push(HwCounter {
                        device: device.clone(),
                        port: port.clone(),
                        group,
                        name,
                        value,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_sysfs_shaped_tree() {
        let root = tempfile::tempdir().unwrap();
        let port = root.path().join("rxe0/ports/1");
        std::fs::create_dir_all(port.join("counters")).unwrap();
        std::fs::create_dir_all(port.join("hw_counters")).unwrap();
        std::fs::write(port.join("counters/port_xmit_packets"), "17\n").unwrap();
        std::fs::write(port.join("hw_counters/rcvd_pkts"), "42\n").unwrap();
        std::fs::write(port.join("hw_counters/garbage"), "n/a\n").unwrap();
        let got = read_hw_counters(root.path());
        let got: Vec<_> = got
            .iter()
            .map(|c| {
                (
                    c.device.as_str(),
                    c.port.as_str(),
                    c.group,
                    c.name.as_str(),
                    c.value,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("rxe0", "1", "counters", "port_xmit_packets", 17),
                ("rxe0", "1", "hw_counters", "rcvd_pkts", 42),
            ]
        );
    }

    #[test]
    fn missing_root_means_no_counters() {
        let root = tempfile::tempdir().unwrap();
        assert!(read_hw_counters(&root.path().join("absent")).is_empty());
    }
}
