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

/// One RoCE v2 packet seen on `eth0`: its IPv4 header's fields and its BTH
/// opcode and destination QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocePacket {
    /// The IP header's TOS byte (DSCP << 2 | ECN).
    pub tos: u8,
    /// Source address.
    pub src: std::net::Ipv4Addr,
    /// Destination address.
    pub dst: std::net::Ipv4Addr,
    /// BTH opcode (RC: 0..=5 SEND, 6..=11 RDMA WRITE, 17 ACK; UD SEND only: 100).
    pub opcode: u8,
    /// BTH destination QP (1: the CM's general services QP).
    pub dest_qp: u32,
}

impl RocePacket {
    /// An RC SEND (first/middle/last/only, with or without immediate).
    pub fn is_rc_send(&self) -> bool {
        self.opcode <= 5
    }
    /// An RC RDMA WRITE.
    pub fn is_rc_write(&self) -> bool {
        (6..=11).contains(&self.opcode)
    }
    /// A UD SEND (only, with or without immediate).
    pub fn is_ud_send(&self) -> bool {
        self.opcode == 100 || self.opcode == 101
    }
    /// To a multicast group.
    pub fn is_multicast(&self) -> bool {
        self.dst.is_multicast()
    }
    /// A connection-manager message (UD to QP 1).
    pub fn is_cm(&self) -> bool {
        self.is_ud_send() && self.dest_qp == 1
    }
}

/// A running capture of `eth0`'s RoCE v2 traffic (UDP port 4791) by
/// Wireshark's `dumpcap`, written as classic pcap and parsed here (the IPv4
/// header and the BTH, nothing else). Needs two guests: inside one guest
/// rxe's loopback never reaches the netdev.
pub struct Capture {
    child: std::process::Child,
    path: std::path::PathBuf,
}

impl Capture {
    /// Starts `dumpcap` and waits until it says it is capturing (it takes
    /// 1-8 s to start in a guest).
    pub fn start(name: &str) -> Capture {
        use std::io::BufRead as _;
        let path = std::env::temp_dir().join(format!("{name}-{}.pcap", std::process::id()));
        let mut child = std::process::Command::new("dumpcap")
            .args(["-i", "eth0", "-f", "udp port 4791", "-P", "-q", "-w"])
            .arg(&path)
            .env("HOME", std::env::temp_dir())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run dumpcap (Debian's wireshark-common; `cargo xtask setup` installs it)");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                eprintln!("dumpcap: {line}");
                if line.contains("Capturing on") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("dumpcap did not start capturing within 60 s");
        // The filter is attached when it says so; a short margin anyway.
        std::thread::sleep(std::time::Duration::from_millis(500));
        Capture { child, path }
    }

    /// Stops the capture and returns the RoCE v2 packets, in capture order.
    pub fn stop(mut self) -> Vec<RocePacket> {
        // Give the last packets time to cross the emulated link.
        std::thread::sleep(std::time::Duration::from_secs(1));
        // SIGINT, so dumpcap flushes and closes the file (by our child's pid).
        let st = std::process::Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(st.success(), "signal dumpcap");
        let status = self.child.wait().expect("wait for dumpcap");
        eprintln!("dumpcap exited: {status}");
        let bytes = std::fs::read(&self.path).expect("read the capture");
        std::fs::remove_file(&self.path).ok();
        parse_pcap(&bytes)
    }
}

/// The RoCE v2 packets (IPv4, UDP port 4791) of a classic pcap file with
/// Ethernet link type, either byte order.
pub fn parse_pcap(bytes: &[u8]) -> Vec<RocePacket> {
    assert!(bytes.len() >= 24, "pcap shorter than its header");
    let be = match bytes[..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => false,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => true,
        _ => panic!("not a classic pcap file: {:02x?}", &bytes[..4]),
    };
    let u32_at = |b: &[u8], i: usize| {
        let w: [u8; 4] = b[i..i + 4].try_into().unwrap();
        if be {
            u32::from_be_bytes(w)
        } else {
            u32::from_le_bytes(w)
        }
    };
    assert_eq!(u32_at(bytes, 20), 1, "link type is not Ethernet");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        let incl = u32_at(bytes, at + 8) as usize;
        let frame = &bytes[at + 16..(at + 16 + incl).min(bytes.len())];
        at += 16 + incl;
        if frame.len() < 14 + 20 || frame[12..14] != [0x08, 0x00] {
            continue;
        }
        let ip = &frame[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ip[0] >> 4 != 4 || ip[9] != 17 || ip.len() < ihl + 8 + 12 {
            continue;
        }
        let udp = &ip[ihl..];
        if u16::from_be_bytes([udp[2], udp[3]]) != 4791 {
            continue;
        }
        let bth = &udp[8..];
        out.push(RocePacket {
            tos: ip[1],
            src: std::net::Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            dst: std::net::Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
            opcode: bth[0],
            dest_qp: u32::from_be_bytes([0, bth[5], bth[6], bth[7]]),
        });
    }
    out
}

/// The GID entry `index` of the guest's RDMA device port 1, as sysfs shows it.
pub fn sysfs_gid(index: u32) -> String {
    let dev = std::env::var("ROCEBUS_RDMA_DEVICE").unwrap_or_else(|_| "rxe0".into());
    std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/1/gids/{index}"))
        .expect("read the GID table")
        .trim()
        .to_owned()
}

/// Every packet's TOS is `tc`; panics naming the first few that are not.
pub fn assert_class(what: &str, packets: &[RocePacket], tc: u8) {
    let wrong: Vec<&RocePacket> = packets.iter().filter(|p| p.tos != tc).collect();
    assert!(
        wrong.is_empty(),
        "{what}: {} of {} packets do not carry traffic class {tc} (DSCP {}, ECN {}); first: {:?}",
        wrong.len(),
        packets.len(),
        tc >> 2,
        tc & 3,
        &wrong[..wrong.len().min(5)]
    );
}

/// The IPv4 address GID entry `index` holds (an IPv4-mapped GID).
pub fn sysfs_gid_ipv4(index: u32) -> std::net::Ipv4Addr {
    let text = sysfs_gid(index);
    let gid: std::net::Ipv6Addr = text.parse().expect("a GID");
    gid.to_ipv4_mapped()
        .unwrap_or_else(|| panic!("GID {index} ({text}) holds no IPv4 address"))
}

/// Checks a two-guest capture taken on the guest at `local`: every packet
/// between `local` and `peer` carries `tc`, and the packets `local` sent
/// leave from the address of GID entry `gid_index`. Prints a summary by kind.
pub fn assert_capture(
    packets: &[RocePacket],
    local: std::net::Ipv4Addr,
    peer: std::net::Ipv4Addr,
    tc: u8,
    gid_index: u32,
) {
    type Kind = (&'static str, fn(&RocePacket) -> bool);
    let kinds: [Kind; 5] = [
        ("RC SEND", RocePacket::is_rc_send),
        ("RC RDMA WRITE", RocePacket::is_rc_write),
        ("RC ACK", |p| p.opcode == 17),
        ("UD multicast", |p| p.is_ud_send() && p.is_multicast()),
        ("CM (UD to QP 1)", RocePacket::is_cm),
    ];
    for (name, f) in kinds {
        for (dir, from) in [("sent", local), ("received", peer)] {
            let n = packets.iter().filter(|p| f(p) && p.src == from).count();
            let tos: std::collections::BTreeSet<u8> = packets
                .iter()
                .filter(|p| f(p) && p.src == from)
                .map(|p| p.tos)
                .collect();
            eprintln!("capture: {name} {dir}: {n} packets, TOS {tos:?}");
        }
    }
    assert!(!packets.is_empty(), "nothing captured");
    let gid_addr = sysfs_gid_ipv4(gid_index);
    assert_eq!(
        gid_addr, local,
        "GID {gid_index} holds {gid_addr}, not this guest's {local}"
    );
    for p in packets {
        assert!(
            (p.src == local && (p.dst == peer || p.dst.is_multicast())) || p.src == peer,
            "a packet from a GID other than the configured one: {p:?}"
        );
    }
    assert_class("every RoCE v2 packet", packets, tc);
}

/// Guest 0's side of a start signal over TCP: waits (up to 120 s) for
/// guest 1 to connect to `port` and tells it to go. Used so that guest 1
/// sends nothing before guest 0 listens and captures (a connect request to
/// a port where nothing listens is answered by the kernel's CM, not by us).
pub fn signal_go(local: std::net::IpAddr, port: u16) {
    use std::io::Write as _;
    let l = std::net::TcpListener::bind((local, port)).expect("bind the start signal");
    let (mut s, _) = l.accept().expect("guest 1 asks for the start signal");
    s.write_all(b"g").expect("send the start signal");
}

/// Guest 1's side of [`signal_go`]: connects to guest 0's `port` (retrying
/// for up to 120 s while guest 0 starts) and waits for the signal.
pub fn wait_for_go(peer: std::net::IpAddr, port: u16) {
    use std::io::Read as _;
    let t = std::time::Instant::now();
    let mut s = loop {
        match std::net::TcpStream::connect((peer, port)) {
            Ok(s) => break s,
            Err(e) => {
                assert!(
                    t.elapsed().as_secs() < 120,
                    "no start signal from {peer}: {e}"
                );
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
    };
    let mut b = [0u8; 1];
    s.read_exact(&mut b).expect("the start signal");
}

/// [`gid_stat::SecondAddress`] and the other GID helpers, shared with the
/// other crates' tests.
#[path = "../support/gid_stat.rs"]
pub mod gid_stat;

/// A pyverbs attacker (`tests/attackers/*.py`, Debian's python3-pyverbs,
/// rdma-core's own Python binding) started with Debian's interpreter; its
/// standard input is kept open (closing it stops the attacker) and its
/// standard output read line by line.
pub struct PyAttacker {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl PyAttacker {
    pub fn start(script: &str, args: &[String]) -> PyAttacker {
        use std::io::BufRead;
        let path = format!("{}/tests/attackers/{script}", env!("CARGO_MANIFEST_DIR"));
        // Debian's interpreter: the python3 first on PATH may be a build that does
        // not see Debian's python3-pyverbs (`cargo xtask setup` installs it).
        let mut child = std::process::Command::new("/usr/bin/python3")
            .arg(&path)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {path} with /usr/bin/python3: {e}"));
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        PyAttacker { child, lines }
    }

    /// The next line it printed, within `within`.
    pub fn line(&self, within: std::time::Duration) -> String {
        self.lines.recv_timeout(within).unwrap_or_else(|e| {
            panic!("the attacker printed nothing more within {within:?} ({e}): did python3-pyverbs load? (`cargo xtask setup` installs it)")
        })
    }

    /// A line it printed, if one is waiting (never blocks).
    pub fn try_line(&self) -> Option<String> {
        self.lines.try_recv().ok()
    }

    /// Waits for a line equal to `want`, within `within`.
    pub fn wait_for(&self, want: &str, within: std::time::Duration) {
        let t = std::time::Instant::now();
        loop {
            let l = self.line(within.saturating_sub(t.elapsed()));
            eprintln!("attacker: {l}");
            if l == want {
                return;
            }
        }
    }

    /// Closes its standard input (it stops), and returns its last line (its
    /// report), parsed.
    pub fn stop(mut self) -> serde_json::Value {
        drop(self.child.stdin.take());
        let mut last = None;
        let t = std::time::Instant::now();
        while let Ok(l) = self.lines.recv_timeout(std::time::Duration::from_secs(60)) {
            if l.starts_with('{') {
                last = Some(l);
                break;
            }
            assert!(
                t.elapsed() < std::time::Duration::from_secs(60),
                "the attacker never stopped"
            );
        }
        let st = self.child.wait().expect("wait for the attacker");
        assert!(st.success(), "the attacker failed: {st}");
        let last = last.expect("the attacker's report");
        serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: {last}"))
    }
}
