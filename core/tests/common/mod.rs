//! Guest-side helpers shared by the RDMA integration tests: traffic
//! control on the guest's `eth0` (netem loss, per-packet filters).
// Each test crate that includes this module uses part of it.
#![allow(dead_code)]

/// (sent, dropped) packets of eth0's netem qdisc `handle` (None: the first
/// netem qdisc, e.g. the runner's root one), from `tc -s qdisc show`.
pub fn netem_stats(handle: Option<&str>) -> (u64, u64) {
    let out = std::process::Command::new("tc")
        .args(["-s", "qdisc", "show", "dev", "eth0"])
        .output()
        .expect("run tc");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.starts_with("qdisc netem")
            && handle.is_none_or(|h| l.split_whitespace().nth(2) == Some(h))
        {
            // " Sent 949204 bytes 1868 pkt (dropped 802, overlimits 0 ...)"
            let stats: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
            let num = |key: &str| {
                stats
                    .iter()
                    .position(|w| *w == key)
                    .and_then(|i| stats.get(i + 1))
                    .map(|w| w.trim_end_matches(',').parse().expect("a count"))
            };
            let sent = stats
                .iter()
                .position(|w| *w == "pkt")
                .and_then(|i| stats.get(i.checked_sub(1)?))
                .map_or(0, |w| w.parse().expect("a count"));
            return (sent, num("(dropped").unwrap_or(0));
        }
    }
    panic!("no netem qdisc {handle:?} on eth0:\n{text}");
}

/// Runs `tc` in the guest, failing the test on error.
pub fn tc(args: &str) {
    let st = std::process::Command::new("tc")
        .args(args.split_whitespace())
        .status()
        .expect("run tc");
    assert!(st.success(), "tc {args}");
}

/// Loads the `prio` qdisc and `u32` classifier, which the guest's initramfs
/// does not carry: modprobe, else insmod from the kernel tree that
/// `cargo xtask setup` unpacked into its cache (visible through the shared
/// root). Asking xtask to load them (its MODULES list) would be cleaner.
pub fn load_sched_modules() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let release = release.trim();
    let caches: Vec<std::path::PathBuf> = [
        std::env::var_os("ROCEBUS_CACHE").map(Into::into),
        std::env::var_os("XDG_CACHE_HOME").map(|x| std::path::Path::new(&x).join("rocebus")),
        std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/rocebus")),
        Some("/root/.cache/rocebus".into()),
    ]
    .into_iter()
    .flatten()
    .collect();
    for m in ["sch_prio", "cls_u32"] {
        if std::path::Path::new("/sys/module").join(m).exists()
            || std::process::Command::new("modprobe")
                .arg(m)
                .status()
                .is_ok_and(|s| s.success())
        {
            continue;
        }
        let ko = caches
            .iter()
            .filter_map(|c| std::fs::read_dir(c).ok())
            .flatten()
            .flatten()
            .map(|e| {
                e.path().join(format!(
                    "root/lib/modules/{release}/kernel/net/sched/{m}.ko"
                ))
            })
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{m}.ko for {release} not found in {caches:?}"));
        let st = std::process::Command::new("insmod")
            .arg(&ko)
            .status()
            .expect("insmod");
        assert!(st.success(), "insmod {}", ko.display());
    }
}

/// Drops every rdma_cm ready-to-use message (RTU, the last of the
/// connection handshake's three messages) this guest sends: a `prio` qdisc
/// on eth0 whose first band is a 100%-loss netem (handle `10:`), and a `u32`
/// filter sending RoCE v2 datagrams (UDP port 4791) that carry a CM MAD
/// (management class 0x07) with attribute RTU (0x0014) there. Offsets from
/// the IPv4 header (20 bytes, no options): UDP 8, BTH 12, DETH 8, then the
/// MAD header, whose class is byte 1 and attribute ID bytes 16-17. Every
/// other packet goes to band 4, untouched. The CM of the accepting side then
/// never hears that the connection is established; `netem_stats(Some("10:"))`
/// counts the RTUs dropped.
pub fn drop_cm_rtu() {
    load_sched_modules();
    tc("qdisc add dev eth0 root handle 1: prio bands 4 priomap 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3");
    tc("qdisc add dev eth0 parent 1:1 handle 10: netem loss 100%");
    tc("filter add dev eth0 parent 1: protocol ip prio 1 u32 \
        match ip protocol 17 0xff match ip dport 4791 0xffff \
        match u8 0x07 0xff at 49 match u16 0x0014 0xffff at 64 flowid 1:1");
}
