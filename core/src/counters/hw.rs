//! The RDMA device's own counters, read from sysfs, shown by `rocebus stat` beside ours.
//!
//! Linux exposes them per device and port as one decimal number per file under
//! `/sys/class/infiniband/DEV/ports/PORT/counters/` (the standard port counters) and
//! `.../hw_counters/` (driver-specific, e.g. soft-RoCE's `rcvd_pkts`, `duplicate_request`).
//! This module only reads files; a missing tree means no device, and a file that cannot be
//! read or parsed is skipped (some are write-only or return errors on some drivers).

use std::path::Path;

use super::stat::escape_label_value as label;

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

/// The Prometheus metric all NIC counters share, one series per device, port, group and
/// counter (`rocebus_nic_total{device="rxe0",port="1",group="hw_counters",
/// counter="rcvd_seq_err"}`): one name with labels rather than one name per file, so a
/// query or alert works across drivers (`sum by (counter)`, `rate(...)`) and a counter a
/// new driver adds appears without a code change.
pub const NIC_METRIC: &str = "rocebus_nic_total";

/// Files under the counter folders that are settings, not counts: left out of the metrics.
/// mlx5's `hw_counters/lifespan` is how long, in ms, the driver caches the values.
pub const NOT_COUNTERS: [&str; 1] = ["lifespan"];

/// Renders `counters` (as [`read_hw_counters`] returns them) in the Prometheus text
/// exposition format: one `# HELP`/`# TYPE` for [`NIC_METRIC`], then one sample per
/// counter with the labels `device`, `port`, `group` (`counters` or `hw_counters`) and
/// `counter` (the sysfs file name, unchanged). Pure: no I/O. Empty input gives an empty
/// string (no device: no metric).
pub fn render_nic_prometheus(counters: &[HwCounter]) -> String {
    let mut out = String::new();
    for c in counters
        .iter()
        .filter(|c| !NOT_COUNTERS.contains(&c.name.as_str()))
    {
        if out.is_empty() {
            out.push_str(&format!(
                "# HELP {NIC_METRIC} RDMA NIC counter, from \
                 /sys/class/infiniband/DEVICE/ports/PORT/GROUP/COUNTER\n\
                 # TYPE {NIC_METRIC} counter\n"
            ));
        }
        out.push_str(&format!(
            "{NIC_METRIC}{{device=\"{}\",port=\"{}\",group=\"{}\",counter=\"{}\"}} {}\n",
            label(&c.device),
            label(&c.port),
            c.group,
            label(&c.name),
            c.value
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An mlx5 port's counter folders as a ConnectX-6 shows them (a few of each).
    fn mlx5_tree(root: &Path) {
        let port = root.join("mlx5_0/ports/1");
        std::fs::create_dir_all(port.join("counters")).unwrap();
        std::fs::create_dir_all(port.join("hw_counters")).unwrap();
        for (f, v) in [("port_rcv_packets", "1000"), ("port_xmit_discards", "0")] {
            std::fs::write(port.join("counters").join(f), format!("{v}\n")).unwrap();
        }
        for (f, v) in [
            ("np_cnp_sent", "7"),
            ("rp_cnp_handled", "5"),
            ("np_ecn_marked_roce_packets", "9"),
            ("out_of_sequence", "3"),
            ("packet_seq_err", "2"),
            ("lifespan", "10"),
        ] {
            std::fs::write(port.join("hw_counters").join(f), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn nic_counters_render_as_one_labelled_metric() {
        let root = tempfile::tempdir().unwrap();
        mlx5_tree(root.path());
        let rxe = root.path().join("rxe0/ports/1/hw_counters");
        std::fs::create_dir_all(&rxe).unwrap();
        std::fs::write(rxe.join("rcvd_seq_err"), "4\n").unwrap();
        std::fs::write(rxe.join("retry_exceeded_err"), "1\n").unwrap();
        let page = render_nic_prometheus(&read_hw_counters(root.path()));
        let want = "\
# HELP rocebus_nic_total RDMA NIC counter, from /sys/class/infiniband/DEVICE/ports/PORT/GROUP/COUNTER
# TYPE rocebus_nic_total counter
rocebus_nic_total{device=\"mlx5_0\",port=\"1\",group=\"counters\",counter=\"port_rcv_packets\"} 1000
rocebus_nic_total{device=\"mlx5_0\",port=\"1\",group=\"counters\",counter=\"port_xmit_discards\"} 0
rocebus_nic_total{device=\"mlx5_0\",port=\"1\",group=\"hw_counters\",counter=\"np_cnp_sent\"} 7
rocebus_nic_total{device=\"mlx5_0\",port=\"1\",group=\"hw_counters\",counter=\"np_ecn_marked_roce_packets\"} 9
rocebus_nic_total{device=\"mlx5_0\",port=\"1\",group=\"hw_counters\",counter=\"out_of_sequence\"} 3
rocebus_nic_total{device=\"mlx5_0\",port=\"1\",group=\"hw_counters\",counter=\"packet_seq_err\"} 2
rocebus_nic_total{device=\"mlx5_0\",port=\"1\",group=\"hw_counters\",counter=\"rp_cnp_handled\"} 5
rocebus_nic_total{device=\"rxe0\",port=\"1\",group=\"hw_counters\",counter=\"rcvd_seq_err\"} 4
rocebus_nic_total{device=\"rxe0\",port=\"1\",group=\"hw_counters\",counter=\"retry_exceeded_err\"} 1
";
        assert_eq!(page, want);
        assert_eq!(render_nic_prometheus(&[]), "");
    }

    #[test]
    fn nic_counter_label_values_are_escaped() {
        let c = HwCounter {
            device: "we\"ird\\".into(),
            port: "1".into(),
            group: "hw_counters",
            name: "a\nb".into(),
            value: 1,
        };
        let page = render_nic_prometheus(&[c]);
        assert!(
            page.contains(
                "device=\"we\\\"ird\\\\\",port=\"1\",group=\"hw_counters\",counter=\"a\\nb\"} 1\n"
            ),
            "{page}"
        );
    }

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
