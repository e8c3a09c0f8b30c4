//! The checks of `rocebus doctor`, one function each, over a [`Host`] and the configs'
//! [`Needs`]. Each returns findings; none changes the host. The status rules: `fail` is
//! what stops rocebus from working as configured (no device, port down, an address with
//! no RoCE v2 GID, memlock below the rings, a pinned core offline or shared, a configured
//! traffic class outside the PFC priority); `warn` is what costs latency or loses packets
//! under load, and what cannot be checked here.

use std::collections::BTreeMap;

use rocebus::verbs::{gid_matches_ip, GidTable, GidType};

use super::host::{cmdline_cpus, format_cpulist, parse_cpulist, parse_memlock, Host, ToolOutput};
use super::needs::Needs;
use super::qos::{parse_dcb, parse_mlnx_qos, Qos};
use super::{Finding, Status};

/// One port of an RDMA device.
#[derive(Debug, Clone)]
pub struct Port {
    /// Device name.
    pub device: String,
    /// Port number.
    pub port: u8,
    /// Its GID table (empty if unreadable: the gid_table check says why).
    pub gids: Option<GidTable>,
    /// Network interfaces its GIDs belong to.
    pub netdevs: Vec<String>,
}

/// The RDMA devices of the host and their ports.
#[derive(Debug, Clone, Default)]
pub struct Devices {
    /// Device names.
    pub names: Vec<String>,
    /// Ports, in device and port order.
    pub ports: Vec<Port>,
}

const IB: &str = "class/infiniband";
const MIB: u64 = 1 << 20;

/// Finds the devices and reads each port's GID table.
pub fn devices(host: &Host) -> Devices {
    let names = host.sys_list(IB);
    let mut ports = Vec::new();
    for d in &names {
        for p in host.sys_list(format!("{IB}/{d}/ports")) {
            let Ok(port) = p.parse::<u8>() else { continue };
            let gids = GidTable::read_sysfs(&host.sys, d, port).ok();
            let mut netdevs: Vec<String> = gids
                .iter()
                .flat_map(|t| t.entries.iter().filter_map(|e| e.netdev.clone()))
                .collect();
            netdevs.sort();
            netdevs.dedup();
            ports.push(Port {
                device: d.clone(),
                port,
                gids,
                netdevs,
            });
        }
    }
    Devices { names, ports }
}

fn finding(check: &'static str, subject: impl Into<String>, status: Status) -> Finding {
    Finding {
        check,
        subject: subject.into(),
        status,
        detail: String::new(),
        fix: None,
    }
}

impl Finding {
    fn detail(mut self, d: impl Into<String>) -> Finding {
        self.detail = d.into();
        self
    }

    fn fix(mut self, f: impl Into<String>) -> Finding {
        self.fix = Some(f.into());
        self
    }
}

/// Whether the device is software (soft-RoCE, siw): no bus device of its own.
fn is_software(host: &Host, device: &str) -> bool {
    !host.sys_exists(format!("{IB}/{device}/device"))
}

/// `rdma_device`: at least one RDMA device.
pub fn rdma_device(host: &Host, devs: &Devices) -> Vec<Finding> {
    if devs.names.is_empty() {
        return vec![finding("rdma_device", "host", Status::Fail)
            .detail(format!(
                "no RDMA device under {}",
                host.sys.join(IB).display()
            ))
            .fix(
                "load the NIC's RDMA driver (mlx5_ib for ConnectX), or for soft-RoCE: \
                 rdma link add rxe0 type rxe netdev IF",
            )];
    }
    devs.names
        .iter()
        .map(|d| {
            let kind = if is_software(host, d) {
                let parent = host
                    .sys_text(format!("{IB}/{d}/parent"))
                    .map_or_else(String::new, |p| format!(" over {p}"));
                format!("software device{parent} (soft-RoCE or siw: functional, not for timing)")
            } else {
                let fw = host
                    .sys_text(format!("{IB}/{d}/fw_ver"))
                    .map_or_else(String::new, |f| format!(", firmware {f}"));
                format!("hardware device{fw}")
            };
            finding("rdma_device", d.clone(), Status::Pass).detail(kind)
        })
        .collect()
}

/// `port_state`: every port ACTIVE, link up, Ethernet.
pub fn port_state(host: &Host, devs: &Devices) -> Vec<Finding> {
    devs.ports
        .iter()
        .map(|p| {
            let base = format!("{IB}/{}/ports/{}", p.device, p.port);
            let subject = format!("{}/{}", p.device, p.port);
            let state = host.sys_text(format!("{base}/state")).unwrap_or_default();
            let phys = host
                .sys_text(format!("{base}/phys_state"))
                .unwrap_or_default();
            let layer = host
                .sys_text(format!("{base}/link_layer"))
                .unwrap_or_default();
            let detail = format!("state {state:?}, phys_state {phys:?}, link_layer {layer:?}");
            if !state.ends_with("ACTIVE") {
                finding("port_state", subject, Status::Fail)
                    .detail(detail)
                    .fix(format!(
                        "bring the link up (ip link set {} up), check the cable and the \
                         switch port; the port must be ACTIVE",
                        p.netdevs.first().map_or("IF", String::as_str)
                    ))
            } else if layer != "Ethernet" {
                finding("port_state", subject, Status::Warn)
                    .detail(detail)
                    .fix("rocebus runs on RoCE: use an Ethernet port (or set the port type to ETH)")
            } else {
                finding("port_state", subject, Status::Pass).detail(detail)
            }
        })
        .collect()
}

/// `gid_table`: each port has a RoCE v2 GID holding an IPv4 address; v1 twins are named.
pub fn gid_table(host: &Host, devs: &Devices) -> Vec<Finding> {
    devs.ports
        .iter()
        .map(|p| {
            let subject = format!("{}/{}", p.device, p.port);
            let Some(t) = &p.gids else {
                return finding("gid_table", subject, Status::Fail)
                    .detail(format!(
                        "cannot read {}",
                        host.sys
                            .join(format!("{IB}/{}/ports/{}/gids", p.device, p.port))
                            .display()
                    ))
                    .fix("the kernel's RDMA core exposes the GID table; is the driver loaded?");
            };
            let v2 = t
                .entries
                .iter()
                .find(|e| e.gid_type == GidType::RoceV2 && e.gid.ipv4().is_some());
            let v1: Vec<u32> = t
                .entries
                .iter()
                .filter(|e| e.gid_type == GidType::RoceV1 && e.gid.ipv4().is_some())
                .map(|e| e.index)
                .collect();
            let listing = t.listing();
            match v2 {
                None => finding("gid_table", subject, Status::Fail)
                    .detail(format!(
                        "no RoCE v2 GID with an IPv4 address; table: {listing}"
                    ))
                    .fix(format!(
                        "give {} an IPv4 address (ip addr add ADDR/LEN dev IF); RoCE v1 \
                         entries are not routable",
                        p.netdevs
                            .first()
                            .map_or("the port's interface", String::as_str)
                    )),
                Some(e) => {
                    let twins = if v1.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; RoCE v1 (not routable) at {}: rocebus selects v2 entries",
                            v1.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                        )
                    };
                    finding("gid_table", subject, Status::Pass).detail(format!(
                        "first RoCE v2 IPv4 GID: index {} ({}){twins}; table: {listing}",
                        e.index,
                        e.gid.ipv4().map(|a| a.to_string()).unwrap_or_default()
                    ))
                }
            }
        })
        .collect()
}

/// `config_address`: every address a config binds has a RoCE v2 GID on some port.
pub fn config_address(devs: &Devices, needs: &Needs) -> Vec<Finding> {
    needs
        .addrs
        .iter()
        .map(|a| {
            let subject = a.value.to_string();
            let hit = devs.ports.iter().find_map(|p| {
                let t = p.gids.as_ref()?;
                let e = t
                    .entries
                    .iter()
                    .find(|e| e.gid_type == GidType::RoceV2 && gid_matches_ip(e.gid, a.value))?;
                Some((p, e))
            });
            match hit {
                Some((p, e)) => finding("config_address", subject, Status::Pass).detail(format!(
                    "{} ({}): {} port {} gid_index {} RoCE v2{}",
                    a.value,
                    a.origin,
                    p.device,
                    p.port,
                    e.index,
                    e.netdev
                        .as_ref()
                        .map_or_else(String::new, |n| format!(" on {n}"))
                )),
                None => finding("config_address", subject, Status::Fail)
                    .detail(format!(
                        "{} ({}) has no RoCE v2 GID on any RDMA port",
                        a.value, a.origin
                    ))
                    .fix(
                        "add the address to the RDMA port's interface, or correct the config \
                         (the service cannot bind it)",
                    ),
            }
        })
        .collect()
}

/// The RoCE path MTU a netdev MTU allows (the kernel's `iboe_get_mtu`: the netdev MTU less
/// GRH, BTH, extended headers and ICRC, rounded down to an IB MTU).
pub fn roce_mtu(netdev_mtu: u32) -> Option<u32> {
    let room = netdev_mtu.checked_sub(88)?;
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|m| *m <= room)
}

/// `mtu`: the RoCE MTU of each port's interface.
pub fn mtu(host: &Host, devs: &Devices) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &devs.ports {
        for n in &p.netdevs {
            let subject = format!("{}/{} {n}", p.device, p.port);
            let Some(m) = host
                .sys_text(format!("class/net/{n}/mtu"))
                .and_then(|m| m.parse::<u32>().ok())
            else {
                out.push(
                    finding("mtu", subject, Status::Warn)
                        .detail(format!("cannot read the MTU of {n}")),
                );
                continue;
            };
            out.push(match roce_mtu(m) {
                Some(4096) => finding("mtu", subject, Status::Pass)
                    .detail(format!("netdev MTU {m}: RoCE MTU 4096")),
                Some(r) => finding("mtu", subject, Status::Warn)
                    .detail(format!(
                        "netdev MTU {m}: RoCE MTU {r}; messages above {r} B go as several \
                         packets (small orders and market data are unaffected)"
                    ))
                    .fix(format!(
                        "ip link set {n} mtu 9000 (and the same or more on every switch port \
                         on the path) for RoCE MTU 4096"
                    )),
                None => finding("mtu", subject, Status::Fail)
                    .detail(format!(
                        "netdev MTU {m} is below RoCE's smallest (256 + 88)"
                    ))
                    .fix(format!("ip link set {n} mtu 1500 or more")),
            });
        }
    }
    out
}

/// `memlock`: RLIMIT_MEMLOCK against the ring bytes the configs name.
pub fn memlock(host: &Host, needs: &Needs) -> Vec<Finding> {
    let fix = "raise it where the services start: `ulimit -l unlimited` in the shell, \
               LimitMEMLOCK=infinity in a systemd unit, `USER - memlock unlimited` in \
               /etc/security/limits.conf";
    let Some(limit) = host
        .proc_text("self/limits")
        .and_then(|t| parse_memlock(&t))
    else {
        return vec![
            finding("memlock", "RLIMIT_MEMLOCK", Status::Warn).detail(format!(
                "cannot read Max locked memory from {}",
                host.proc.join("self/limits").display()
            )),
        ];
    };
    let need = needs.ring_bytes;
    let need_text = if need == 0 {
        "the configs name no ring sizes".to_owned()
    } else {
        format!(
            "the configs' rings need at least {need} bytes ({} MiB)",
            need.div_ceil(MIB)
        )
    };
    let subject = "RLIMIT_MEMLOCK (this shell's)";
    match limit {
        None => {
            vec![finding("memlock", subject, Status::Pass).detail(format!("unlimited; {need_text}"))]
        }
        Some(l) if l < need => vec![finding("memlock", subject, Status::Fail)
            .detail(format!(
                "{l} bytes, but {need_text}: registering them fails at start"
            ))
            .fix(fix)],
        Some(l) if l < 64 * MIB => vec![finding("memlock", subject, Status::Warn)
            .detail(format!(
                "{l} bytes ({need_text}); queue pairs and staging memory come on top of rings"
            ))
            .fix(fix)],
        Some(l) => {
            vec![finding("memlock", subject, Status::Pass).detail(format!("{l} bytes; {need_text}"))]
        }
    }
}

/// `hugepages`: 2 MiB pages reserved and free for the configs' rings.
pub fn hugepages(host: &Host, needs: &Needs) -> Vec<Finding> {
    let dir = "kernel/mm/hugepages/hugepages-2048kB";
    let subject = "2 MiB huge pages";
    let (Some(total), Some(free)) = (
        host.sys_text(format!("{dir}/nr_hugepages"))
            .and_then(|v| v.parse::<u64>().ok()),
        host.sys_text(format!("{dir}/free_hugepages"))
            .and_then(|v| v.parse::<u64>().ok()),
    ) else {
        return vec![finding("hugepages", subject, Status::Warn)
            .detail("the kernel exposes no 2 MiB huge pages: rings use 4 KiB pages")
            .fix("a kernel with CONFIG_HUGETLBFS, then sysctl -w vm.nr_hugepages=N")];
    };
    let want = needs.ring_bytes.div_ceil(2 * MIB).max(1);
    if total == 0 {
        return vec![finding("hugepages", subject, Status::Warn)
            .detail(
                "none reserved: ring memory is on 4 KiB pages, and the NIC's address \
                 translation cache misses more often",
            )
            .fix(format!(
                "sysctl -w vm.nr_hugepages={want} (vm.nr_hugepages in /etc/sysctl.d to keep it)"
            ))];
    }
    if free < want {
        return vec![finding("hugepages", subject, Status::Warn)
            .detail(format!(
                "{free} of {total} free, the configs' rings would take {want}"
            ))
            .fix(format!(
                "sysctl -w vm.nr_hugepages={}",
                total + (want - free)
            ))];
    }
    vec![finding("hugepages", subject, Status::Pass).detail(format!(
        "{free} of {total} free; the configs' rings take {want}"
    ))]
}

/// The host's CPU sets: online, isolated, nohz_full (sysfs first, else the command line).
struct Cpus {
    online: Option<Vec<usize>>,
    isolated: Vec<usize>,
    nohz: Vec<usize>,
}

fn cpus(host: &Host) -> Cpus {
    let cmdline = host.proc_text("cmdline").unwrap_or_default();
    let from = |file: &str, param: &str| {
        let mut v = host
            .sys_text(format!("devices/system/cpu/{file}"))
            .and_then(|t| parse_cpulist(&t))
            .unwrap_or_default();
        v.extend(cmdline_cpus(&cmdline, param).unwrap_or_default());
        v.sort_unstable();
        v.dedup();
        v
    };
    Cpus {
        online: host
            .sys_text("devices/system/cpu/online")
            .and_then(|t| parse_cpulist(&t)),
        isolated: from("isolated", "isolcpus"),
        nohz: from("nohz_full", "nohz_full"),
    }
}

/// `isolated_cores`: each pinned core online, pinned once, isolated and tickless.
pub fn isolated_cores(host: &Host, needs: &Needs) -> Vec<Finding> {
    let c = cpus(host);
    let summary = format!(
        "isolated {}, nohz_full {}",
        format_cpulist(&c.isolated),
        format_cpulist(&c.nohz)
    );
    if needs.pinned.is_empty() {
        return vec![finding("isolated_cores", "pinned cores", Status::Warn)
            .detail(format!(
                "the configs pin no thread ({summary}): the scheduler may move busy loops"
            ))
            .fix("set `core = N` in each service's [service] table, on isolated cores")];
    }
    let mut by_core: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for p in &needs.pinned {
        by_core.entry(p.value).or_default().push(&p.origin);
    }
    let mut out = Vec::new();
    for (core, origins) in by_core {
        let subject = format!("core {core}");
        let who = origins.join(", ");
        if c.online.as_ref().is_some_and(|o| !o.contains(&core)) {
            out.push(
                finding("isolated_cores", subject, Status::Fail)
                    .detail(format!(
                        "pinned by {who}, but not online (online: {})",
                        format_cpulist(c.online.as_deref().unwrap_or_default())
                    ))
                    .fix("pin to an online core"),
            );
        } else if origins.len() > 1 {
            out.push(
                finding("isolated_cores", subject, Status::Fail)
                    .detail(format!(
                        "pinned by {who}: two busy loops would share one core"
                    ))
                    .fix("give each pinned thread its own core"),
            );
        } else if !c.isolated.contains(&core) {
            out.push(
                finding("isolated_cores", subject, Status::Warn)
                    .detail(format!(
                        "pinned by {who}, not isolated ({summary}): other tasks run there"
                    ))
                    .fix(format!(
                        "boot with isolcpus={core} nohz_full={core} rcu_nocbs={core} \
                         (or a cpuset partition)"
                    )),
            );
        } else if !c.nohz.contains(&core) {
            out.push(
                finding("isolated_cores", subject, Status::Warn)
                    .detail(format!(
                        "pinned by {who}, isolated, but the timer tick still runs \
                         ({summary})"
                    ))
                    .fix(format!(
                        "add nohz_full={core} rcu_nocbs={core} to the boot line"
                    )),
            );
        } else {
            out.push(
                finding("isolated_cores", subject, Status::Pass)
                    .detail(format!("pinned by {who}; isolated and nohz_full")),
            );
        }
    }
    out
}

/// `cpu_governor`: the pinned cores (or every online one) run the `performance` governor.
pub fn cpu_governor(host: &Host, needs: &Needs) -> Vec<Finding> {
    let mut cores: Vec<usize> = needs.pinned.iter().map(|p| p.value).collect();
    if cores.is_empty() {
        cores = cpus(host).online.unwrap_or_default();
    }
    cores.sort_unstable();
    cores.dedup();
    let mut by_gov: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for c in &cores {
        let g = host
            .sys_text(format!(
                "devices/system/cpu/cpu{c}/cpufreq/scaling_governor"
            ))
            .unwrap_or_default();
        by_gov.entry(g).or_default().push(*c);
    }
    let mut out = Vec::new();
    for (gov, cs) in by_gov {
        let subject = format!("cores {}", format_cpulist(&cs));
        out.push(match gov.as_str() {
            "" => finding("cpu_governor", subject, Status::Warn).detail(
                "cpufreq not exposed (a virtual machine, or the BIOS owns frequency): cannot \
                 check; set the BIOS to maximum performance",
            ),
            "performance" => {
                finding("cpu_governor", subject, Status::Pass).detail("governor performance")
            }
            g => finding("cpu_governor", subject, Status::Warn)
                .detail(format!(
                    "governor {g}: the core slows down while it waits, then takes time to \
                     speed up"
                ))
                .fix(format!(
                    "cpupower -c {} frequency-set -g performance",
                    format_cpulist(&cs)
                )),
        });
    }
    out
}

/// The NUMA node of a port's NIC: the RDMA device's bus device, else its interface's.
fn nic_node(host: &Host, p: &Port) -> Option<i64> {
    let mut places = vec![format!("{IB}/{}/device/numa_node", p.device)];
    places.extend(
        p.netdevs
            .iter()
            .map(|n| format!("class/net/{n}/device/numa_node")),
    );
    places
        .iter()
        .find_map(|f| host.sys_text(f)?.parse::<i64>().ok())
}

fn node_cpus(host: &Host, node: i64) -> Option<Vec<usize>> {
    host.sys_text(format!("devices/system/node/node{node}/cpulist"))
        .and_then(|t| parse_cpulist(&t))
}

/// `numa`: the pinned cores are on the NIC's NUMA node.
pub fn numa(host: &Host, devs: &Devices, needs: &Needs) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &devs.ports {
        let subject = format!("{}/{}", p.device, p.port);
        let Some(node) = nic_node(host, p) else {
            out.push(
                finding("numa", subject, Status::Warn)
                    .detail("no NUMA node exposed for the NIC (a software device): cannot check"),
            );
            continue;
        };
        if node < 0 {
            out.push(
                finding("numa", subject, Status::Pass)
                    .detail("numa_node -1: one memory node (or the firmware does not say)"),
            );
            continue;
        }
        let Some(local) = node_cpus(host, node) else {
            out.push(
                finding("numa", subject, Status::Warn)
                    .detail(format!("NIC on node {node}, whose cpulist cannot be read")),
            );
            continue;
        };
        let far: Vec<usize> = needs
            .pinned
            .iter()
            .map(|f| f.value)
            .filter(|c| !local.contains(c))
            .collect();
        out.push(if far.is_empty() {
            finding("numa", subject, Status::Pass).detail(format!(
                "NIC on node {node} (cores {}); pinned cores local",
                format_cpulist(&local)
            ))
        } else {
            finding("numa", subject, Status::Warn)
                .detail(format!(
                    "NIC on node {node} (cores {}), pinned cores {} are on another node: \
                     every DMA and doorbell crosses the interconnect",
                    format_cpulist(&local),
                    format_cpulist(&far)
                ))
                .fix(format!(
                    "pin to cores of node {node}: {}",
                    format_cpulist(&local)
                ))
        });
    }
    out
}

/// `irq_affinity`: the NIC's interrupts stay off the pinned cores and on its node.
pub fn irq_affinity(host: &Host, devs: &Devices, needs: &Needs) -> Vec<Finding> {
    let pinned: Vec<usize> = needs.pinned.iter().map(|p| p.value).collect();
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for p in &devs.ports {
        if seen.contains(&p.device) {
            continue;
        }
        seen.push(p.device.clone());
        let mut dirs = vec![format!("{IB}/{}/device/msi_irqs", p.device)];
        dirs.extend(
            p.netdevs
                .iter()
                .map(|n| format!("class/net/{n}/device/msi_irqs")),
        );
        let Some(irqs) = dirs
            .iter()
            .map(|d| host.sys_list(d))
            .find(|v| !v.is_empty())
        else {
            out.push(
                finding("irq_affinity", p.device.clone(), Status::Warn)
                    .detail("no MSI interrupts found for the NIC: cannot check"),
            );
            continue;
        };
        let local = nic_node(host, p)
            .filter(|n| *n >= 0)
            .and_then(|n| node_cpus(host, n));
        let mut on_pinned = Vec::new();
        let mut off_node = Vec::new();
        for irq in &irqs {
            let Some(aff) = host
                .proc_text(format!("irq/{irq}/smp_affinity_list"))
                .and_then(|t| parse_cpulist(&t))
            else {
                continue;
            };
            if aff.iter().any(|c| pinned.contains(c)) {
                on_pinned.push(format!("{irq}->{}", format_cpulist(&aff)));
            } else if let Some(l) = &local {
                if aff.iter().any(|c| !l.contains(c)) {
                    off_node.push(format!("{irq}->{}", format_cpulist(&aff)));
                }
            }
        }
        let count = irqs.len();
        out.push(if !on_pinned.is_empty() {
            finding("irq_affinity", p.device.clone(), Status::Warn)
                .detail(format!(
                    "{} of {count} IRQs may land on pinned cores {}: {}",
                    on_pinned.len(),
                    format_cpulist(&pinned),
                    on_pinned.join(" ")
                ))
                .fix(
                    "echo CPULIST > /proc/irq/N/smp_affinity_list for each, with CPULIST the \
                     NIC node's unpinned cores; stop irqbalance or ban the pinned cores \
                     (IRQBALANCE_BANNED_CPULIST)",
                )
        } else if !off_node.is_empty() {
            finding("irq_affinity", p.device.clone(), Status::Warn)
                .detail(format!(
                    "{} of {count} IRQs may run off the NIC's node: {}",
                    off_node.len(),
                    off_node.join(" ")
                ))
                .fix("echo CPULIST > /proc/irq/N/smp_affinity_list, CPULIST on the NIC's node")
        } else {
            finding("irq_affinity", p.device.clone(), Status::Pass).detail(format!(
                "{count} IRQs, none on a pinned core{}",
                if local.is_some() {
                    ", all on the NIC's node"
                } else {
                    ""
                }
            ))
        });
    }
    out
}

/// The priority the configured traffic class lands in, given the port's DSCP map.
fn config_priority(needs: &Needs, qos: Option<&Qos>) -> Option<u8> {
    let tc = needs.traffic_class.as_ref()?.value;
    let dscp = tc >> 2;
    Some(qos.map_or(dscp >> 3, |q| q.priority_of(dscp)))
}

/// Reads `mlnx_qos -i IF`, else `dcb`; `Err` says why there is nothing.
fn read_qos(host: &Host, netdev: &str) -> Result<Qos, String> {
    let mut why = Vec::new();
    match host.tool("mlnx_qos", &["-i", netdev]) {
        ToolOutput::Ok(t) => match parse_mlnx_qos(&t) {
            Some(q) => return Ok(q),
            None => why.push("mlnx_qos printed no PFC table".to_owned()),
        },
        ToolOutput::Failed(e) => why.push(format!("mlnx_qos: {e}")),
        ToolOutput::Absent => why.push("mlnx_qos not installed".to_owned()),
    }
    match host.tool("dcb", &["pfc", "show", "dev", netdev]) {
        ToolOutput::Ok(t) => {
            let app = match host.tool("dcb", &["app", "show", "dev", netdev, "dscp-prio"]) {
                ToolOutput::Ok(a) => Some(a),
                _ => None,
            };
            match parse_dcb(&t, app.as_deref()) {
                Some(q) => return Ok(q),
                None => why.push("dcb printed no prio-pfc".to_owned()),
            }
        }
        ToolOutput::Failed(e) => why.push(format!("dcb: {e}")),
        ToolOutput::Absent => why.push("dcb not installed".to_owned()),
    }
    Err(why.join("; "))
}

/// `pfc`: PFC on the priority RoCE uses, and the port classifying by DSCP.
pub fn pfc(host: &Host, devs: &Devices, needs: &Needs) -> Vec<Finding> {
    let mut out = Vec::new();
    for n in netdevs(devs) {
        let qos = match read_qos(host, &n) {
            Ok(q) => q,
            Err(why) => {
                out.push(
                    finding("pfc", n.clone(), Status::Warn)
                        .detail(format!("PFC and trust state not readable: {why}"))
                        .fix(
                            "nothing to do on soft-RoCE or a NIC without DCB; on ConnectX \
                             install iproute2's dcb or mlnx_qos to have this checked",
                        ),
                );
                continue;
            }
        };
        let prios = if qos.pfc.is_empty() {
            "none".to_owned()
        } else {
            qos.pfc
                .iter()
                .map(u8::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let trust = qos.trust.clone().unwrap_or_else(|| "not shown".to_owned());
        let detail = format!("{}: PFC on priorities {prios}, trust {trust}", qos.source);
        let prio = config_priority(needs, Some(&qos));
        out.push(if qos.pfc.is_empty() {
            finding("pfc", n.clone(), Status::Warn)
                .detail(format!(
                    "{detail}: RoCE is lossy here, a dropped packet costs an RC retransmission \
                     timeout (fine only if the fabric is built for lossy RoCE with ECN)"
                ))
                .fix(format!(
                    "mlnx_qos -i {n} --pfc 0,0,0,1,0,0,0,0 (PFC on priority 3), the same \
                     priority lossless on every switch port"
                ))
        } else if let (Some(p), Some(tc)) = (prio, &needs.traffic_class) {
            if qos.pfc.contains(&p) {
                finding("pfc", n.clone(), Status::Pass).detail(format!(
                    "{detail}; traffic_class {} ({}) is DSCP {} -> priority {p}, lossless",
                    tc.value,
                    tc.origin,
                    tc.value >> 2
                ))
            } else {
                finding("pfc", n.clone(), Status::Fail)
                    .detail(format!(
                        "{detail}; traffic_class {} ({}) is DSCP {} -> priority {p}, which \
                         has no PFC: rocebus traffic is lossy while the fabric expects it \
                         lossless",
                        tc.value,
                        tc.origin,
                        tc.value >> 2
                    ))
                    .fix(
                        "set traffic_class to DSCP << 2 of the lossless class (DSCP 26 -> \
                         traffic_class 104, or 106 with ECN-capable), or map that DSCP to a \
                         PFC priority",
                    )
            }
        } else if qos.trust.as_deref() == Some("pcp") {
            finding("pfc", n.clone(), Status::Warn)
                .detail(format!(
                    "{detail}: the port classifies by VLAN PCP, and RoCE v2 marks DSCP"
                ))
                .fix(format!("mlnx_qos -i {n} --trust dscp"))
        } else {
            finding("pfc", n.clone(), Status::Pass).detail(format!(
                "{detail}; no traffic_class in the configs to check against"
            ))
        });
    }
    out
}

fn netdevs(devs: &Devices) -> Vec<String> {
    let mut v: Vec<String> = devs
        .ports
        .iter()
        .flat_map(|p| p.netdevs.iter().cloned())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// `ecn`: ECN reaction (DCQCN) enabled on the interface, per priority (mlx5's
/// `/sys/class/net/IF/ecn/roce_np/enable/N` and `roce_rp/enable/N`).
pub fn ecn(host: &Host, devs: &Devices, needs: &Needs) -> Vec<Finding> {
    let mut out = Vec::new();
    for n in netdevs(devs) {
        let dir = format!("class/net/{n}/ecn");
        let enabled = |role: &str| -> Option<Vec<u8>> {
            let base = format!("{dir}/{role}/enable");
            if !host.sys_exists(&base) {
                return None;
            }
            Some(
                (0u8..8)
                    .filter(|p| host.sys_text(format!("{base}/{p}")).as_deref() == Some("1"))
                    .collect(),
            )
        };
        let (Some(np), Some(rp)) = (enabled("roce_np"), enabled("roce_rp")) else {
            out.push(
                finding("ecn", n.clone(), Status::Warn)
                    .detail(format!(
                        "{} not exposed: the driver shows no ECN/DCQCN settings (soft-RoCE \
                         models none); cannot check",
                        host.sys.join(&dir).display()
                    ))
                    .fix("on ConnectX (mlx5) the directory exists; elsewhere see the NIC's tools"),
            );
            continue;
        };
        let both: Vec<u8> = np.iter().copied().filter(|p| rp.contains(p)).collect();
        let list = |v: &[u8]| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.iter().map(u8::to_string).collect::<Vec<_>>().join(",")
            }
        };
        let detail = format!(
            "notification point (CNPs sent) on priorities {}, reaction point (DCQCN rate \
             control) on {}",
            list(&np),
            list(&rp)
        );
        let fix = format!(
            "echo 1 > /sys/class/net/{n}/ecn/roce_np/enable/P and .../roce_rp/enable/P for \
             the RoCE priority P"
        );
        let prio = config_priority(needs, None);
        out.push(match prio {
            Some(p) if !both.contains(&p) => finding("ecn", n.clone(), Status::Warn)
                .detail(format!(
                    "{detail}; the configured traffic class is priority {p}, without DCQCN"
                ))
                .fix(fix),
            Some(p) => finding("ecn", n.clone(), Status::Pass)
                .detail(format!("{detail}; configured priority {p} covered")),
            None if both.is_empty() => finding("ecn", n.clone(), Status::Warn)
                .detail(format!(
                    "{detail}: congestion is answered by drops or pauses only"
                ))
                .fix(fix),
            None => finding("ecn", n.clone(), Status::Pass).detail(detail),
        });
    }
    out
}

/// Every check, in report order.
pub fn all(host: &Host, needs: &Needs) -> Vec<Finding> {
    let devs = devices(host);
    let mut out = rdma_device(host, &devs);
    out.extend(port_state(host, &devs));
    out.extend(gid_table(host, &devs));
    out.extend(config_address(&devs, needs));
    out.extend(mtu(host, &devs));
    out.extend(memlock(host, needs));
    out.extend(hugepages(host, needs));
    out.extend(isolated_cores(host, needs));
    out.extend(cpu_governor(host, needs));
    out.extend(numa(host, &devs, needs));
    out.extend(irq_affinity(host, &devs, needs));
    out.extend(pfc(host, &devs, needs));
    out.extend(ecn(host, &devs, needs));
    out
}
