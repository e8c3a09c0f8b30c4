//! `rocebus doctor` over fake `/sys` and `/proc` trees laid out as real mlx5 (ConnectX)
//! and soft-RoCE (rxe) hosts show them, with fake `mlnx_qos`/`dcb` scripts printing what
//! the real tools print.

use super::checks::{self, roce_mtu};
use super::host::{cmdline_cpus, format_cpulist, parse_cpulist, parse_memlock};
use super::qos::{parse_dcb, parse_mlnx_qos};
use super::*;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        Tree { dir }
    }

    /// Writes `text` at `rel` (`sys/...` or `proc/...`).
    fn write(&self, rel: &str, text: &str) {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("{text}\n")).unwrap();
    }

    fn remove(&self, rel: &str) {
        let p = self.dir.path().join(rel);
        if p.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }

    /// A fake tool on the host's tool path: a script printing `out`, exiting `code`
    /// (stderr gets `out` when it fails, as dcb does).
    fn tool(&self, name: &str, out: &str, code: i32) {
        let p = self.dir.path().join("bin").join(name);
        let redirect = if code == 0 { "" } else { " >&2" };
        std::fs::write(
            &p,
            format!("#!/bin/sh\ncat{redirect} <<'EOF'\n{out}\nEOF\nexit {code}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn host(&self) -> Host {
        Host {
            sys: self.dir.path().join("sys"),
            proc: self.dir.path().join("proc"),
            tool_path: Some(self.dir.path().join("bin").into_os_string()),
        }
    }
}

/// A GID as sysfs prints it (eight groups of four hex digits).
fn gid_text(ip: &str) -> String {
    let a: std::net::Ipv6Addr = ip.parse().unwrap();
    a.segments()
        .iter()
        .map(|s| format!("{s:04x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn gids(t: &Tree, dev: &str, netdev: &str, entries: &[(&str, &str)]) {
    let base = format!("sys/class/infiniband/{dev}/ports/1");
    for (i, (gid, ty)) in entries.iter().enumerate() {
        t.write(&format!("{base}/gids/{i}"), &gid_text(gid));
        t.write(&format!("{base}/gid_attrs/types/{i}"), ty);
        t.write(&format!("{base}/gid_attrs/ndevs/{i}"), netdev);
    }
    // Unused slots: zero GIDs; their attribute files fail to read on real kernels (absent here).
    for i in entries.len()..entries.len() + 4 {
        t.write(&format!("{base}/gids/{i}"), &gid_text("::"));
    }
}

const MLNX_QOS: &str = "DCBX mode: OS controlled
Priority trust state: dscp
dscp2prio mapping:
        prio:0 dscp:07,06,05,04,03,02,01,00,
        prio:1 dscp:15,14,13,12,11,10,09,08,
        prio:2 dscp:23,22,21,20,19,18,17,16,
        prio:3 dscp:31,30,29,28,27,26,25,24,
        prio:4 dscp:39,38,37,36,35,34,33,32,
        prio:5 dscp:47,46,45,44,43,42,41,40,
        prio:6 dscp:55,54,53,52,51,50,49,48,
        prio:7 dscp:63,62,61,60,59,58,57,56,
default priority:
Receive buffer size (bytes): 130944,130944,0,0,0,0,0,0,
Cable len: 7
PFC configuration:
        priority    0   1   2   3   4   5   6   7
        enabled     0   0   0   1   0   0   0   0
        buffer      0   0   0   1   0   0   0   0
tc: 0 ratelimit: unlimited, tsa: vendor
         priority:  1
tc: 3 ratelimit: unlimited, tsa: vendor
         priority:  3";

/// A dual-socket ConnectX-6 Dx host set up as docs/deploy.md says: the NIC on node 0,
/// cores 2-7 isolated and tickless, PFC on priority 3 with DSCP trust, DCQCN on.
fn mlx5() -> Tree {
    let t = Tree::new();
    let ib = "sys/class/infiniband/mlx5_0";
    t.write(&format!("{ib}/fw_ver"), "22.36.1010");
    t.write(&format!("{ib}/node_type"), "1: CA");
    t.write(&format!("{ib}/device/numa_node"), "0");
    for irq in [141, 142, 143, 144] {
        t.write(&format!("{ib}/device/msi_irqs/{irq}"), "msix");
    }
    t.write(&format!("{ib}/ports/1/state"), "4: ACTIVE");
    t.write(&format!("{ib}/ports/1/phys_state"), "5: LinkUp");
    t.write(&format!("{ib}/ports/1/link_layer"), "Ethernet");
    // Every address twice, v1 then v2: what mlx5 lists.
    gids(
        &t,
        "mlx5_0",
        "ens1f0np0",
        &[
            ("fe80::e42:a1ff:fe2b:3c4d", "IB/RoCE v1"),
            ("fe80::e42:a1ff:fe2b:3c4d", "RoCE v2"),
            ("::ffff:10.0.0.5", "IB/RoCE v1"),
            ("::ffff:10.0.0.5", "RoCE v2"),
        ],
    );
    let net = "sys/class/net/ens1f0np0";
    t.write(&format!("{net}/mtu"), "9000");
    for p in 0..8 {
        t.write(&format!("{net}/ecn/roce_np/enable/{p}"), "1");
        t.write(&format!("{net}/ecn/roce_rp/enable/{p}"), "1");
    }
    let cpu = "sys/devices/system/cpu";
    t.write(&format!("{cpu}/online"), "0-15");
    t.write(&format!("{cpu}/isolated"), "2-7");
    t.write(&format!("{cpu}/nohz_full"), "2-7");
    for c in 0..16 {
        t.write(
            &format!("{cpu}/cpu{c}/cpufreq/scaling_governor"),
            "performance",
        );
    }
    t.write("sys/devices/system/node/node0/cpulist", "0-7");
    t.write("sys/devices/system/node/node1/cpulist", "8-15");
    t.write(
        "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
        "64",
    );
    t.write(
        "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
        "64",
    );
    t.write(
        "proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units     \n\
         Max open files            1024                 524288               files     \n\
         Max locked memory         unlimited            unlimited            bytes     ",
    );
    t.write(
        "proc/cmdline",
        "BOOT_IMAGE=/vmlinuz root=/dev/sda1 isolcpus=managed_irq,domain,2-7 nohz_full=2-7 rcu_nocbs=2-7",
    );
    for irq in [141, 142, 143, 144] {
        t.write(&format!("proc/irq/{irq}/smp_affinity_list"), "0-1");
    }
    t.tool("mlnx_qos", MLNX_QOS, 0);
    t
}

/// A soft-RoCE guest as `cargo xtask vm` boots it: rxe0 over eth0, no bus device, no
/// cpufreq, no ECN directory, no huge pages, the default memlock.
fn rxe() -> Tree {
    let t = Tree::new();
    let ib = "sys/class/infiniband/rxe0";
    t.write(&format!("{ib}/parent"), "eth0");
    t.write(&format!("{ib}/node_type"), "1: CA");
    t.write(&format!("{ib}/ports/1/state"), "4: ACTIVE");
    t.write(&format!("{ib}/ports/1/phys_state"), "5: LinkUp");
    t.write(&format!("{ib}/ports/1/link_layer"), "Ethernet");
    gids(
        &t,
        "rxe0",
        "eth0",
        &[
            ("fe80::5054:ff:fe12:3401", "RoCE v2"),
            ("::ffff:198.18.0.1", "RoCE v2"),
        ],
    );
    t.write("sys/class/net/eth0/mtu", "1500");
    t.write("sys/devices/system/cpu/online", "0-1");
    t.write("sys/devices/system/cpu/isolated", "");
    t.write("sys/devices/system/cpu/nohz_full", "(null)");
    t.write("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0");
    t.write(
        "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
        "0",
    );
    t.write(
        "proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units     \n\
         Max locked memory         8388608              8388608              bytes     ",
    );
    t.write("proc/cmdline", "console=ttyS0 init=/init");
    t
}

/// A config as the services write them: one pinned core, one bound address, a ring, a
/// traffic class (DSCP 26, ECN-capable: 106, what UCX uses on RoCE v2).
fn config(core: usize, listen: &str, ring: u64, tc: Option<u8>) -> Needs {
    let mut text = format!(
        "[service]\ncore = {core}\nlisten = \"{listen}\"\n[service.orders]\nring_size = {ring}\n"
    );
    if let Some(tc) = tc {
        text.push_str(&format!("[rdma]\ntraffic_class = {tc}\n"));
    }
    let mut n = Needs::default();
    n.add("gw.toml", &toml::from_str(&text).unwrap());
    n
}

fn gw() -> Needs {
    config(3, "10.0.0.5:7470", 1 << 20, Some(106))
}

fn statuses<'a>(f: &'a [Finding], check: &str) -> Vec<(&'a str, Status)> {
    f.iter()
        .filter(|x| x.check == check)
        .map(|x| (x.subject.as_str(), x.status))
        .collect()
}

fn only<'a>(f: &'a [Finding], check: &str) -> &'a Finding {
    let v: Vec<&Finding> = f.iter().filter(|x| x.check == check).collect();
    assert_eq!(v.len(), 1, "one {check} finding expected: {f:#?}");
    v[0]
}

#[test]
fn healthy_mlx5_host_passes_every_check() {
    let t = mlx5();
    let f = checks::all(&t.host(), &gw());
    let not_pass: Vec<_> = f.iter().filter(|x| x.status != Status::Pass).collect();
    assert!(not_pass.is_empty(), "{not_pass:#?}");
    let names: Vec<&str> = f.iter().map(|x| x.check).collect();
    for c in [
        "rdma_device",
        "port_state",
        "gid_table",
        "config_address",
        "mtu",
        "memlock",
        "hugepages",
        "isolated_cores",
        "cpu_governor",
        "numa",
        "irq_affinity",
        "pfc",
        "ecn",
    ] {
        assert!(names.contains(&c), "{c} missing: {names:?}");
    }
}

#[test]
fn gid_table_names_mlx5s_v2_twin_and_the_config_address_index() {
    let t = mlx5();
    let f = checks::all(&t.host(), &gw());
    let g = only(&f, "gid_table");
    assert!(g.detail.contains("index 3 (10.0.0.5)"), "{}", g.detail);
    assert!(
        g.detail.contains("RoCE v1 (not routable) at 2"),
        "{}",
        g.detail
    );
    let a = only(&f, "config_address");
    assert_eq!(a.status, Status::Pass);
    assert!(
        a.detail
            .contains("mlx5_0 port 1 gid_index 3 RoCE v2 on ens1f0np0"),
        "{}",
        a.detail
    );
}

#[test]
fn gid_table_with_only_roce_v1_fails() {
    let t = mlx5();
    for i in [1, 3] {
        t.remove(&format!("sys/class/infiniband/mlx5_0/ports/1/gids/{i}"));
    }
    let f = checks::all(&t.host(), &gw());
    assert_eq!(only(&f, "gid_table").status, Status::Fail);
    // The address now only has a v1 entry: the service would send RoCE v1.
    assert_eq!(only(&f, "config_address").status, Status::Fail);
}

#[test]
fn config_address_without_a_gid_fails() {
    let t = mlx5();
    let n = config(3, "10.0.0.9:7470", 1 << 20, None);
    let a = checks::all(&t.host(), &n);
    let a = only(&a, "config_address");
    assert_eq!(a.status, Status::Fail);
    assert!(
        a.detail.contains("10.0.0.9 (gw.toml: service.listen)"),
        "{}",
        a.detail
    );
}

#[test]
fn rdma_device_missing_fails() {
    let t = Tree::new();
    let f = checks::all(&t.host(), &Needs::default());
    assert_eq!(statuses(&f, "rdma_device"), [("host", Status::Fail)]);
}

#[test]
fn port_state_down_fails() {
    let t = mlx5();
    t.write("sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN");
    t.write(
        "sys/class/infiniband/mlx5_0/ports/1/phys_state",
        "3: Disabled",
    );
    let f = checks::all(&t.host(), &gw());
    let p = only(&f, "port_state");
    assert_eq!(p.status, Status::Fail);
    assert!(p
        .fix
        .as_deref()
        .unwrap()
        .contains("ip link set ens1f0np0 up"));
}

#[test]
fn rxe_host_is_reported_honestly() {
    let t = rxe();
    let f = checks::all(&t.host(), &Needs::default());
    let d = only(&f, "rdma_device");
    assert_eq!(d.status, Status::Pass);
    assert!(
        d.detail.contains("software device over eth0"),
        "{}",
        d.detail
    );
    assert_eq!(statuses(&f, "port_state"), [("rxe0/1", Status::Pass)]);
    let g = only(&f, "gid_table");
    assert_eq!(g.status, Status::Pass);
    assert!(g.detail.contains("index 1 (198.18.0.1)"), "{}", g.detail);
    assert!(!g.detail.contains("RoCE v1"), "{}", g.detail);
    // What rxe cannot tell is a warning, never a failure.
    for c in [
        "mtu",
        "memlock",
        "hugepages",
        "isolated_cores",
        "cpu_governor",
    ] {
        assert_eq!(only(&f, c).status, Status::Warn, "{c}: {f:#?}");
    }
    for c in ["numa", "irq_affinity", "pfc", "ecn"] {
        let x = only(&f, c);
        assert_eq!(x.status, Status::Warn, "{c}: {x:#?}");
    }
    assert!(only(&f, "mtu").detail.contains("RoCE MTU 1024"));
    assert!(only(&f, "pfc")
        .detail
        .contains("mlnx_qos not installed; dcb not installed"));
    assert!(f.iter().all(|x| x.status != Status::Fail), "{f:#?}");
}

#[test]
fn pfc_tool_that_cannot_read_the_port_is_a_warning() {
    let t = rxe();
    // What iproute2's dcb answers on virtio-net (seen on this project's guests).
    t.tool("dcb", "Attribute read: Operation not supported", 1);
    let f = checks::all(&t.host(), &Needs::default());
    let p = only(&f, "pfc");
    assert_eq!(p.status, Status::Warn);
    assert!(
        p.detail
            .contains("dcb: Attribute read: Operation not supported"),
        "{}",
        p.detail
    );
}

#[test]
fn mtu_maps_netdev_mtu_to_roce_mtu() {
    assert_eq!(roce_mtu(9000), Some(4096));
    assert_eq!(roce_mtu(4200), Some(4096));
    assert_eq!(roce_mtu(4183), Some(2048));
    assert_eq!(roce_mtu(1500), Some(1024));
    assert_eq!(roce_mtu(300), None);
    let t = mlx5();
    t.write("sys/class/net/ens1f0np0/mtu", "1500");
    let f = checks::all(&t.host(), &gw());
    assert_eq!(only(&f, "mtu").status, Status::Warn);
}

#[test]
fn memlock_below_the_rings_fails() {
    let t = mlx5();
    t.write(
        "proc/self/limits",
        "Max locked memory         8388608              8388608              bytes",
    );
    let f = checks::all(&t.host(), &config(3, "10.0.0.5:1", 16 << 20, None));
    let m = only(&f, "memlock");
    assert_eq!(m.status, Status::Fail);
    assert!(m.detail.contains("at least 16777216 bytes"), "{}", m.detail);
    // The same limit with a small ring: it fits, but leaves no room (warn).
    let f = checks::all(&t.host(), &config(3, "10.0.0.5:1", 1 << 20, None));
    assert_eq!(only(&f, "memlock").status, Status::Warn);
}

#[test]
fn hugepages_none_or_too_few_free_warns() {
    let t = mlx5();
    let h = "sys/kernel/mm/hugepages/hugepages-2048kB";
    t.write(&format!("{h}/free_hugepages"), "1");
    let f = checks::all(&t.host(), &config(3, "10.0.0.5:1", 16 << 20, None));
    let x = only(&f, "hugepages");
    assert_eq!(x.status, Status::Warn);
    assert!(
        x.fix.as_deref().unwrap().contains("vm.nr_hugepages=71"),
        "{x:?}"
    );
    t.write(&format!("{h}/nr_hugepages"), "0");
    let f = checks::all(&t.host(), &gw());
    assert_eq!(only(&f, "hugepages").status, Status::Warn);
}

#[test]
fn isolated_cores_checks_each_pinned_core() {
    let t = mlx5();
    // Not isolated: core 9.
    let f = checks::all(&t.host(), &config(9, "10.0.0.5:1", 1, None));
    assert_eq!(statuses(&f, "isolated_cores"), [("core 9", Status::Warn)]);
    // Offline: core 20.
    let f = checks::all(&t.host(), &config(20, "10.0.0.5:1", 1, None));
    assert_eq!(statuses(&f, "isolated_cores"), [("core 20", Status::Fail)]);
    // Two configs pin core 3.
    let mut n = gw();
    n.add("fh.toml", &toml::from_str("[service]\ncore = 3\n").unwrap());
    let f = checks::all(&t.host(), &n);
    let x = only(&f, "isolated_cores");
    assert_eq!(x.status, Status::Fail);
    assert!(
        x.detail
            .contains("gw.toml: service.core, fh.toml: service.core"),
        "{}",
        x.detail
    );
    // Isolated but ticking.
    t.write("sys/devices/system/cpu/nohz_full", "(null)");
    t.write("proc/cmdline", "isolcpus=2-7");
    let f = checks::all(&t.host(), &gw());
    assert_eq!(statuses(&f, "isolated_cores"), [("core 3", Status::Warn)]);
    // No pinned core at all.
    let f = checks::all(&t.host(), &Needs::default());
    assert_eq!(
        statuses(&f, "isolated_cores"),
        [("pinned cores", Status::Warn)]
    );
}

#[test]
fn isolated_cores_read_from_the_command_line_alone() {
    let t = mlx5();
    t.remove("sys/devices/system/cpu/isolated");
    t.remove("sys/devices/system/cpu/nohz_full");
    let f = checks::all(&t.host(), &gw());
    assert_eq!(statuses(&f, "isolated_cores"), [("core 3", Status::Pass)]);
    t.write("proc/cmdline", "quiet");
    let f = checks::all(&t.host(), &gw());
    assert_eq!(statuses(&f, "isolated_cores"), [("core 3", Status::Warn)]);
}

#[test]
fn cpu_governor_other_than_performance_warns() {
    let t = mlx5();
    t.write(
        "sys/devices/system/cpu/cpu3/cpufreq/scaling_governor",
        "powersave",
    );
    let f = checks::all(&t.host(), &gw());
    let g = only(&f, "cpu_governor");
    assert_eq!((g.subject.as_str(), g.status), ("cores 3", Status::Warn));
    assert!(g.fix.as_deref().unwrap().contains("cpupower -c 3"));
}

#[test]
fn numa_core_on_the_other_node_warns() {
    let t = mlx5();
    // Core 10 is isolated too, but on node 1; the NIC is on node 0.
    t.write("sys/devices/system/cpu/isolated", "2-7,10");
    t.write("sys/devices/system/cpu/nohz_full", "2-7,10");
    let f = checks::all(&t.host(), &config(10, "10.0.0.5:1", 1, None));
    let n = only(&f, "numa");
    assert_eq!(n.status, Status::Warn);
    assert!(n.fix.as_deref().unwrap().contains("node 0: 0-7"), "{n:?}");
    assert_eq!(only(&f, "isolated_cores").status, Status::Pass);
}

#[test]
fn irq_affinity_on_a_pinned_core_warns() {
    let t = mlx5();
    t.write("proc/irq/143/smp_affinity_list", "3");
    let f = checks::all(&t.host(), &gw());
    let i = only(&f, "irq_affinity");
    assert_eq!(i.status, Status::Warn);
    assert!(i.detail.contains("143->3"), "{}", i.detail);
    // Off the NIC's node.
    t.write("proc/irq/143/smp_affinity_list", "12");
    let f = checks::all(&t.host(), &gw());
    let i = only(&f, "irq_affinity");
    assert_eq!(i.status, Status::Warn);
    assert!(
        i.detail.contains("off the NIC's node: 143->12"),
        "{}",
        i.detail
    );
}

#[test]
fn pfc_off_on_the_configured_priority_fails() {
    let t = mlx5();
    // traffic_class 8 is DSCP 2: priority 0, which has no PFC.
    let f = checks::all(&t.host(), &config(3, "10.0.0.5:1", 1, Some(8)));
    let p = only(&f, "pfc");
    assert_eq!(p.status, Status::Fail);
    assert!(p.detail.contains("DSCP 2 -> priority 0"), "{}", p.detail);
    let f = checks::all(&t.host(), &gw());
    assert!(only(&f, "pfc")
        .detail
        .contains("DSCP 26 -> priority 3, lossless"));
}

#[test]
fn pfc_off_everywhere_or_pcp_trust_warns() {
    let t = mlx5();
    t.tool(
        "mlnx_qos",
        &MLNX_QOS.replace("enabled     0   0   0   1", "enabled     0   0   0   0"),
        0,
    );
    let f = checks::all(&t.host(), &gw());
    assert_eq!(only(&f, "pfc").status, Status::Warn);
    t.tool(
        "mlnx_qos",
        &MLNX_QOS.replace("trust state: dscp", "trust state: pcp"),
        0,
    );
    let f = checks::all(&t.host(), &config(3, "10.0.0.5:1", 1, None));
    let p = only(&f, "pfc");
    assert_eq!(p.status, Status::Warn);
    assert!(p.fix.as_deref().unwrap().contains("--trust dscp"));
}

#[test]
fn pfc_read_with_dcb_when_mlnx_qos_is_absent() {
    let t = mlx5();
    t.remove("bin/mlnx_qos");
    // One script answers both `dcb pfc show` and `dcb app show`.
    t.tool(
        "dcb",
        "pfc-cap 8 macsec-bypass off delay 0\nprio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off\ndscp-prio 26:3 48:6",
        0,
    );
    let f = checks::all(&t.host(), &gw());
    let p = only(&f, "pfc");
    assert_eq!(p.status, Status::Pass, "{p:?}");
    assert!(
        p.detail.starts_with("dcb: PFC on priorities 3, trust dscp"),
        "{}",
        p.detail
    );
}

#[test]
fn ecn_off_on_the_configured_priority_warns() {
    let t = mlx5();
    t.write("sys/class/net/ens1f0np0/ecn/roce_rp/enable/3", "0");
    let f = checks::all(&t.host(), &gw());
    let e = only(&f, "ecn");
    assert_eq!(e.status, Status::Warn);
    assert!(
        e.detail.contains("priority 3, without DCQCN"),
        "{}",
        e.detail
    );
}

#[test]
fn parsers_read_kernel_and_tool_formats() {
    assert_eq!(
        parse_cpulist("0-3,8,10-11"),
        Some(vec![0, 1, 2, 3, 8, 10, 11])
    );
    assert_eq!(parse_cpulist("(null)"), Some(vec![]));
    assert_eq!(parse_cpulist("x"), None);
    assert_eq!(format_cpulist(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    assert_eq!(
        cmdline_cpus("a isolcpus=nohz,domain,managed_irq,2-3,6 b", "isolcpus"),
        Some(vec![2, 3, 6])
    );
    assert_eq!(cmdline_cpus("nohz_full=1", "isolcpus"), None);
    assert_eq!(
        parse_memlock("Max locked memory         65536                65536                bytes"),
        Some(Some(65536))
    );
    let q = parse_mlnx_qos(MLNX_QOS).unwrap();
    assert_eq!(q.pfc, [3]);
    assert_eq!(q.trust.as_deref(), Some("dscp"));
    assert_eq!(q.priority_of(26), 3);
    assert_eq!(q.priority_of(48), 6);
    assert!(parse_mlnx_qos("garbage").is_none());
    let d = parse_dcb("prio-pfc 0:on 1:off 3:on", Some("dscp-prio 10:5")).unwrap();
    assert_eq!((d.pfc.clone(), d.priority_of(10)), (vec![0, 3], 5));
    assert!(parse_dcb("Attribute read: Operation not supported", None).is_none());
}

#[test]
fn needs_from_the_shipped_configs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let n = Needs::read(&[root.join("order-gateway.toml")]).unwrap();
    let addrs: Vec<String> = n.addrs.iter().map(|a| a.value.to_string()).collect();
    assert_eq!(addrs, ["198.18.0.1"]);
    // ring_size 1 MiB + max_peer_ring_size 16 MiB.
    assert_eq!(n.ring_bytes, 17 << 20);
    let err = Needs::read(&[root.join("absent.toml")]).unwrap_err();
    assert!(format!("{err:#}").contains("cannot read config"), "{err:#}");
}

#[test]
fn text_and_json_reports() {
    let t = rxe();
    let f = checks::all(&t.host(), &Needs::default());
    let text = render_text(&f);
    assert!(text.starts_with("rocebus doctor: "), "{text}");
    assert!(
        text.contains("PASS port_state     rxe0/1: state \"4: ACTIVE\""),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&render_json(&f)).unwrap();
    assert_eq!(v["fail"], 0);
    assert_eq!(v["checks"][0]["check"], "rdma_device");
    assert_eq!(v["checks"][0]["status"], "pass");
}
