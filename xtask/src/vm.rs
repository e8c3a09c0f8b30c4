//! `cargo xtask vm`: boot one to four soft-RoCE guests and run a command.
//!
//! Each guest is a stock Debian kernel under qemu (TCG) with the host's root
//! shared read-only over 9p and a per-run writable folder; `rxe0` is created
//! on its virtio NIC. Two guests are linked by qemu's UDP socket netdev on the
//! host's loopback (the TCP form costs ~22 ms per round trip). xtask creates
//! the two UDP sockets itself, with receive buffers large enough to hold the
//! bursts a busy host leaves unread (see [`LINK_BUF_BYTES`]), and hands each
//! guest's qemu its end as an inherited descriptor. Three or four guests are
//! linked the same way through a switch that xtask runs (see [`Link`]). It
//! reads the host's UDP
//! drop counters before and after, so a run whose link dropped packets by
//! itself is reported as inconclusive instead of passing as a loss test.

use crate::setup::GuestImage;
use anyhow::{bail, Context, Result};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const GUEST_SH: &str = include_str!("../guest/guest.sh");

/// Environment variables passed from the host into the guest command.
const PASS_ENV: &[&str] = &[
    "RUST_BACKTRACE",
    "RUST_LOG",
    "RUST_TEST_THREADS",
    "NO_COLOR",
];

/// How to run one `vm` invocation.
#[derive(Debug, Clone)]
pub struct VmOptions {
    pub hosts: u8,
    pub netem: Option<String>,
    pub timeout: Duration,
    pub mem_mib: u32,
    pub cpus: Option<u8>,
    /// Extra `NAME=value` pairs exported in the guests.
    pub env: Vec<(String, String)>,
    /// Print guest lines as they come (prefixed with the guest index).
    pub stream: bool,
}

impl Default for VmOptions {
    fn default() -> Self {
        Self {
            hosts: 1,
            netem: None,
            timeout: Duration::from_secs(900),
            mem_mib: 2048,
            cpus: None,
            env: Vec::new(),
            stream: true,
        }
    }
}

/// What came back from the guests.
#[derive(Debug)]
pub struct VmOutcome {
    /// The command's exit status in each guest.
    pub statuses: Vec<i32>,
    /// Every line each guest printed (console), `\r` stripped.
    pub output: Vec<Vec<String>>,
    /// The per-guest writable folders (files the command left there).
    #[allow(dead_code)] // read by bench/demo
    pub out_dirs: Vec<PathBuf>,
    /// With two guests or more: what the link between them dropped by itself.
    pub link: Option<LinkDrops>,
}

impl VmOutcome {
    /// The first non-zero status, or 0.
    pub fn status(&self) -> i32 {
        self.statuses.iter().copied().find(|s| *s != 0).unwrap_or(0)
    }
}

/// Shell-quotes one word for `sh`.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+%@".contains(&b))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Makes the kernel kill the child when xtask dies, so an interrupted run
/// leaves no qemu behind.
fn kill_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls prctl,
    // which is async-signal-safe and touches no memory of ours.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn free_udp_port() -> Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Bytes asked for each end of the two-guest link, for its receive and its
/// send buffer (the kernel doubles the figure for its bookkeeping).
///
/// The default (`net.core.rmem_default`, 212,992 bytes) holds only about a
/// hundred of the ~1.1 KB RoCE packets, each of which costs more than 2 KB of
/// buffer on the loopback: when the host is busy, the receiving qemu does not
/// read for a while and whole bursts overflowed it (7,151 of 13,416 packets of
/// a "10% loss" run). 16 MiB (32 MiB charged) holds over ten thousand: more
/// than a test has in flight. The memory is only used while packets wait.
/// `ROCEBUS_LINK_BUF_BYTES` overrides it (106496, which the kernel doubles to
/// the default 212,992, reproduces the old link).
pub const LINK_BUF_BYTES: usize = 16 << 20;

/// The size asked for the link's buffers: [`LINK_BUF_BYTES`] unless
/// `ROCEBUS_LINK_BUF_BYTES` says otherwise.
fn link_buf_bytes() -> usize {
    std::env::var("ROCEBUS_LINK_BUF_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n > 0 && n <= (i32::MAX / 2) as usize)
        .unwrap_or(LINK_BUF_BYTES)
}

// Socket options of Linux's asm-generic/socket.h (x86, arm, riscv), not all
// exported by the libc crate.
const SO_SNDBUFFORCE: libc::c_int = 32;
const SO_RCVBUFFORCE: libc::c_int = 33;
const SO_MEMINFO: libc::c_int = 55;
/// Index of the drop count in SO_MEMINFO's array (`SK_MEMINFO_DROPS`).
const SK_MEMINFO_DROPS: usize = 8;
const SK_MEMINFO_VARS: usize = 9;

fn set_int_opt(fd: RawFd, opt: libc::c_int, value: libc::c_int) -> std::io::Result<()> {
    // SAFETY: fd is an open socket we own; the option value is a c_int on
    // our stack whose size is passed with it.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn get_int_opt(fd: RawFd, opt: libc::c_int) -> std::io::Result<usize> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: fd is an open socket; value and len are ours and len tells the
    // kernel how much it may write.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(value.max(0) as usize)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Packets the kernel dropped on arrival at this socket (full receive
/// buffer), from `SO_MEMINFO`; None where the kernel does not say.
fn socket_drops(fd: RawFd) -> Option<u64> {
    let mut info = [0u32; SK_MEMINFO_VARS];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: fd is an open socket; info and len are ours and len tells the
    // kernel how much it may write.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    (r == 0 && len as usize > SK_MEMINFO_DROPS * 4).then(|| u64::from(info[SK_MEMINFO_DROPS]))
}

/// Sets one buffer: the FORCE option first (root, or CAP_NET_ADMIN: not
/// capped by `net.core.rmem_max`/`wmem_max`), else the plain one, which the
/// kernel silently caps. Returns the size the socket ended up with.
fn size_buffer(fd: RawFd, bytes: usize, force: libc::c_int, plain: libc::c_int) -> Result<usize> {
    let want = bytes as libc::c_int;
    if set_int_opt(fd, force, want).is_err() {
        set_int_opt(fd, plain, want).context("setting a link socket's buffer size")?;
    }
    Ok(get_int_opt(fd, plain)?)
}

/// Ethernet address of guest `i`'s NIC (the hub forwards by it).
fn guest_mac(i: usize) -> [u8; 6] {
    [0x52, 0x54, 0x00, 0x12, 0x34, 0x10 + i as u8]
}

/// Most guests one run links (one emulated switch; 4 x 1 vCPU under TCG is
/// what a 2-core host still runs).
pub const MAX_HOSTS: u8 = 4;

/// The link between the guests: UDP sockets on the host's loopback, with
/// buffers of [`LINK_BUF_BYTES`]; each guest's qemu inherits its end.
///
/// Two guests: the two ends are bound and connected to each other (a wire,
/// nothing between). More: each guest end is connected to its own port on
/// a switch that xtask runs in threads ([`Switch`]): a frame goes to the
/// port of its destination MAC, or to every other port if it is multicast,
/// broadcast or unknown. Every socket, guest end or switch port, has the
/// same buffers, and the drops of all are counted (a switch port that
/// overflowed because its thread was not scheduled in time counts like a
/// guest end that did). All exist before any qemu starts, so no datagram
/// meets a closed port, and xtask keeps them open until the guests are
/// gone.
struct Link {
    ends: Vec<UdpSocket>,
    switch: Option<Switch>,
    /// The smallest receive buffer of all sockets, in bytes.
    rcvbuf: usize,
}

/// The switch of a link between more than two guests: one port (socket)
/// and one forwarding thread per guest.
struct Switch {
    ports: std::sync::Arc<Vec<UdpSocket>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Where the switch sends a frame that came in on port `from` of `n`: the
/// one port owning its destination MAC, or (multicast, broadcast, unknown
/// or too short to tell) every other port.
fn switch_ports(frame: &[u8], from: usize, n: usize) -> impl Iterator<Item = usize> {
    let known = frame
        .get(..6)
        .and_then(|dst| (0..n).find(|&i| dst == guest_mac(i)));
    (0..n).filter(move |&j| j != from && known.is_none_or(|k| k == j))
}

impl Switch {
    fn start(ports: Vec<UdpSocket>) -> Result<Self> {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        for p in &ports {
            // Wakes the threads now and then to see `stop`.
            p.set_read_timeout(Some(Duration::from_millis(100)))?;
        }
        let ports = Arc::new(ports);
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..ports.len())
            .map(|i| {
                let (ports, stop) = (ports.clone(), stop.clone());
                std::thread::Builder::new()
                    .name(format!("vm-switch-{i}"))
                    .spawn(move || {
                        let mut buf = vec![0u8; 65536];
                        // ORDERING: Relaxed: a flag polled for shutdown,
                        // no data is published through it.
                        while !stop.load(Ordering::Relaxed) {
                            let Ok(n) = ports[i].recv(&mut buf) else {
                                continue;
                            };
                            for j in switch_ports(&buf[..n], i, ports.len()) {
                                // A full receiver drops it, counted as its
                                // socket's drop; nothing else can fail here.
                                let _ = ports[j].send(&buf[..n]);
                            }
                        }
                    })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self {
            ports,
            stop,
            threads,
        })
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        // ORDERING: Relaxed, see the threads' load.
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Link {
    fn new(hosts: usize) -> Result<Self> {
        let bind = || UdpSocket::bind("127.0.0.1:0");
        let ends = (0..hosts)
            .map(|_| bind())
            .collect::<std::io::Result<Vec<_>>>()?;
        let ports = if hosts == 2 {
            ends[0].connect(ends[1].local_addr()?)?;
            ends[1].connect(ends[0].local_addr()?)?;
            Vec::new()
        } else {
            let ports = (0..hosts)
                .map(|_| bind())
                .collect::<std::io::Result<Vec<_>>>()?;
            for (e, p) in ends.iter().zip(&ports) {
                e.connect(p.local_addr()?)?;
                p.connect(e.local_addr()?)?;
            }
            ports
        };
        let bytes = link_buf_bytes();
        let mut rcvbuf = usize::MAX;
        for e in ends.iter().chain(&ports) {
            let fd = e.as_raw_fd();
            rcvbuf = rcvbuf.min(size_buffer(fd, bytes, SO_RCVBUFFORCE, libc::SO_RCVBUF)?);
            size_buffer(fd, bytes, SO_SNDBUFFORCE, libc::SO_SNDBUF)?;
        }
        // The kernel reports twice what was set (half is its overhead).
        if rcvbuf < 2 * bytes {
            eprintln!(
                "xtask vm: the guests' link got a {rcvbuf}-byte receive buffer, not {} \
                 (not root, and net.core.rmem_max is lower): a busy host may make it drop \
                 packets, which is then reported",
                2 * bytes
            );
        }
        if bytes != LINK_BUF_BYTES {
            eprintln!("xtask vm: ROCEBUS_LINK_BUF_BYTES: link buffers of {rcvbuf} bytes");
        }
        let switch = if ports.is_empty() {
            None
        } else {
            Some(Switch::start(ports)?)
        };
        Ok(Self {
            ends,
            switch,
            rcvbuf,
        })
    }

    fn drops(&self) -> Option<u64> {
        let ports = self.switch.iter().flat_map(|s| s.ports.iter());
        self.ends
            .iter()
            .chain(ports)
            .map(|e| socket_drops(e.as_raw_fd()))
            .sum()
    }
}

/// The host's UDP error counters (the `Udp:` lines of `/proc/net/snmp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpCounters {
    /// Datagrams dropped because a socket's receive buffer was full.
    pub rcvbuf_errors: u64,
    /// All datagrams dropped on receipt (includes `RcvbufErrors`).
    pub in_errors: u64,
}

/// Parses the `Udp:` header and value lines of `/proc/net/snmp` (not
/// `UdpLite:`). None when either counter is missing.
pub fn parse_udp_snmp(text: &str) -> Option<UdpCounters> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let names = lines.next()?.split_whitespace().skip(1);
    let values = lines.next()?.split_whitespace().skip(1);
    let (mut rcvbuf_errors, mut in_errors) = (None, None);
    for (n, v) in names.zip(values) {
        match n {
            "RcvbufErrors" => rcvbuf_errors = v.parse().ok(),
            "InErrors" => in_errors = v.parse().ok(),
            _ => {}
        }
    }
    Some(UdpCounters {
        rcvbuf_errors: rcvbuf_errors?,
        in_errors: in_errors?,
    })
}

fn host_udp_counters() -> Option<UdpCounters> {
    parse_udp_snmp(&fs::read_to_string("/proc/net/snmp").ok()?)
}

/// What the two-guest link dropped by itself during a run (netem's drops,
/// made inside the guests, are not among them).
#[derive(Debug, Clone, Copy)]
pub struct LinkDrops {
    /// Growth of the host's `RcvbufErrors` and `InErrors` over the run; None
    /// if `/proc/net/snmp` could not be read at either end.
    pub host: Option<UdpCounters>,
    /// Drops counted on the link's own two sockets.
    pub sockets: Option<u64>,
    /// The smallest receive buffer of the two ends, bytes.
    pub rcvbuf: usize,
}

impl LinkDrops {
    /// Why a run over this link cannot be trusted as a loss test, or None.
    ///
    /// The host counters are machine-wide: another process's UDP socket that
    /// overflows during the run counts too, and the run is then reported as
    /// inconclusive although its own link lost nothing. That errs on the safe
    /// side; the message says how many of the drops were the link's own.
    pub fn inconclusive(&self) -> Option<String> {
        let own = self.sockets.unwrap_or(0);
        let Some(h) = self.host else {
            return Some(
                "cannot read the host's UDP counters (/proc/net/snmp), so drops by the \
                 emulated link itself cannot be ruled out; result inconclusive"
                    .into(),
            );
        };
        let n = h.rcvbuf_errors.max(h.in_errors).max(own);
        (n > 0).then(|| {
            format!(
                "the emulated link itself dropped {n} packets; result inconclusive \
                 (host UDP RcvbufErrors +{}, InErrors +{} during the run, {} of them on this \
                 link's own sockets, whose receive buffers are {} bytes; the host counters \
                 include other processes' sockets)",
                h.rcvbuf_errors,
                h.in_errors,
                self.sockets
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "an unknown number".into()),
                self.rcvbuf
            )
        })
    }
}

/// The host's TSC frequency in kHz, measured against the monotonic clock
/// (x86_64 only). Under TCG the guest's TSC is the host's, but a guest on a
/// busy host calibrates it against emulated timers that fall behind, and a
/// third or fourth guest booting while the others run has been seen to get
/// it badly wrong: its clock then ran about 15 times too fast (soft-lockup
/// warnings at boot, a test "finished in 2262 s" after 150 s, every timeout
/// 15 times too short). Passing the measured value as `tsc_early_khz`
/// skips that calibration.
#[cfg(target_arch = "x86_64")]
fn host_tsc_khz() -> Option<u64> {
    #[allow(unsafe_code, unused_unsafe)]
    // SAFETY: RDTSC reads a counter; every x86_64 CPU has it and it touches
    // no memory.
    let tsc = || unsafe { core::arch::x86_64::_rdtsc() };
    let (t0, c0) = (Instant::now(), tsc());
    std::thread::sleep(Duration::from_millis(50));
    let (c1, dt) = (tsc(), t0.elapsed());
    let khz = u128::from(c1.checked_sub(c0)?) * 1_000_000 / dt.as_nanos().max(1);
    // Below 100 MHz or above 10 GHz: not a TSC we understand.
    u64::try_from(khz)
        .ok()
        .filter(|k| (100_000..10_000_000).contains(k))
}

#[cfg(not(target_arch = "x86_64"))]
fn host_tsc_khz() -> Option<u64> {
    None
}

/// Lets the child inherit `fd` (std opens every descriptor close-on-exec).
fn inherit_fd(cmd: &mut Command, fd: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls fcntl,
    // which is async-signal-safe, on a descriptor the parent keeps open.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The folder for this run's writable exports: under the workspace target dir.
fn run_dir(workspace: &Path) -> Result<PathBuf> {
    let base = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("vm");
    fs::create_dir_all(&base)?;
    let base = base.canonicalize()?;
    for n in 0.. {
        let d = base.join(format!("run-{}-{n}", std::process::id()));
        if !d.exists() {
            fs::create_dir_all(&d)?;
            return Ok(d);
        }
    }
    unreachable!()
}

struct Guest {
    child: Child,
    out_dir: PathBuf,
}

/// Boots the guests, runs `cmd` (a shell command line) in each, and waits.
pub fn run(img: &GuestImage, workspace: &Path, cmd: &str, opts: &VmOptions) -> Result<VmOutcome> {
    if !(1..=MAX_HOSTS).contains(&opts.hosts) {
        bail!("--hosts must be 1 to {MAX_HOSTS}");
    }
    let run = run_dir(workspace)?;
    let cwd = std::env::current_dir()?;
    let ports = [free_udp_port()?, free_udp_port()?];
    let hosts = opts.hosts as usize;
    let link = if hosts > 1 {
        Some(Link::new(hosts)?)
    } else {
        None
    };
    // Machine-wide, so taken before anything of ours can overflow; see
    // LinkDrops::inconclusive.
    let udp_before = host_udp_counters();
    let cpus = opts.cpus.unwrap_or(if hosts == 1 { 2 } else { 1 });
    let tsc_khz = host_tsc_khz();
    let (tx, rx) = mpsc::channel::<(usize, Option<String>)>();
    let mut guests = Vec::new();
    let started = Instant::now();
    for i in 0..hosts {
        let out_dir = run.join(format!("g{i}"));
        fs::create_dir_all(&out_dir)?;
        let addr = format!("198.18.0.{}", i + 1);
        // Guest 0's peer is guest 1; every other guest's is guest 0 (the
        // one that serves, in tests with more than two).
        let peer = format!("198.18.0.{}", if i == 0 { 2 } else { 1 });
        let mut script = String::from("#!/bin/sh\n");
        let mut vars: Vec<(String, String)> = vec![
            ("ROCEBUS_GUEST_INDEX".into(), i.to_string()),
            ("ROCEBUS_HOSTS".into(), hosts.to_string()),
            ("ROCEBUS_GUEST_ADDR".into(), addr),
            (
                "ROCEBUS_PEER_ADDR".into(),
                if hosts > 1 { peer } else { String::new() },
            ),
            ("ROCEBUS_OUT".into(), out_dir.display().to_string()),
            (
                "ROCEBUS_NETEM".into(),
                opts.netem.clone().unwrap_or_default(),
            ),
            ("ROCEBUS_CWD".into(), cwd.display().to_string()),
            ("ROCEBUS_CMD".into(), cmd.to_owned()),
        ];
        for k in PASS_ENV {
            if let Ok(v) = std::env::var(k) {
                vars.push(((*k).into(), v));
            }
        }
        vars.extend(opts.env.iter().cloned());
        for (k, v) in &vars {
            script.push_str(&format!("export {k}={}\n", shell_quote(v)));
        }
        script.push_str(GUEST_SH);
        fs::write(out_dir.join("guest.sh"), script)?;
        fs::write(out_dir.join("hostpath"), out_dir.display().to_string())?;
        let mut keep = vec![workspace.canonicalize()?.display().to_string()];
        keep.push(cwd.display().to_string());
        if let Some(t) =
            std::env::var_os("CARGO_TARGET_DIR").and_then(|t| PathBuf::from(t).canonicalize().ok())
        {
            keep.push(t.display().to_string());
        }
        fs::write(out_dir.join("keep"), keep.join("\n") + "\n")?;

        let netdev = if hosts == 1 {
            // Frames the guest puts on the wire (multicast, whose loopback
            // copy the guest kernel delivers itself) go to a UDP port on the
            // host's loopback where nobody listens, so the virtio queue
            // always drains: a hub with a single port never takes them and
            // rxe stalls the QP after 64 unsent packets.
            format!(
                "socket,id=n0,udp=127.0.0.1:{},localaddr=127.0.0.1:{}",
                ports[1], ports[0]
            )
        } else {
            // qemu 7.2's `socket,fd=` form would sendto() an address it never
            // learnt; `dgram` with a descriptor send()s on the connected
            // socket.
            let fd = link.as_ref().expect("several hosts").ends[i].as_raw_fd();
            format!("dgram,id=n0,local.type=fd,local.str={fd}")
        };
        let mut q = Command::new("qemu-system-x86_64");
        q.args([
            "-accel",
            "tcg",
            "-cpu",
            "max",
            "-nodefaults",
            "-no-user-config",
        ])
        .args(["-smp", &cpus.to_string(), "-m", &opts.mem_mib.to_string()])
        .arg("-kernel")
        .arg(&img.kernel)
        .arg("-initrd")
        .arg(&img.initrd)
        .arg("-append")
        .arg(format!(
            "{}{}",
            // tsc=reliable: without it the emulated guest falls back to the
            // HPET clocksource, and every clock_gettime (Instant::now)
            // traps into the emulator (~13 us each). no_timer_check: with
            // three or four guests on a busy host, the kernel's boot-time
            // check of the emulated IO-APIC timer can miss its window and
            // panic ("IO-APIC + timer doesn't work!"); the timer works.
            "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init clocksource=tsc tsc=reliable no_timer_check",
            tsc_khz
                .map(|k| format!(" tsc_early_khz={k}"))
                .unwrap_or_default()
        ))
        .args([
            "-display",
            "none",
            "-serial",
            "stdio",
            "-monitor",
            "none",
            "-no-reboot",
        ])
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        ])
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=out,security_model=none,multidevs=remap",
            out_dir.display()
        ))
        .args(["-netdev", &netdev])
        .args([
            "-device",
            &format!(
                "virtio-net-pci,netdev=n0,mac={}",
                guest_mac(i).map(|b| format!("{b:02x}")).join(":")
            ),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        kill_with_parent(&mut q);
        if let Some(link) = &link {
            inherit_fd(&mut q, link.ends[i].as_raw_fd());
        }
        let mut child = q
            .spawn()
            .context("cannot start qemu-system-x86_64 (cargo xtask setup)")?;
        for pipe in [
            Box::new(child.stdout.take().expect("piped")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("piped")),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(pipe);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match r.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let line = String::from_utf8_lossy(&buf)
                                .trim_end_matches(['\n', '\r'])
                                .replace('\r', "");
                            let _ = tx.send((i, Some(line)));
                        }
                    }
                }
                let _ = tx.send((i, None));
            });
        }
        guests.push(Guest { child, out_dir });
    }
    drop(tx);

    let mut output = vec![Vec::new(); hosts];
    let mut open_pipes = hosts * 2;
    let deadline = started + opts.timeout;
    let mut timed_out = false;
    let stdout = std::io::stdout();
    while open_pipes > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, Some(line))) => {
                if opts.stream {
                    let mut o = stdout.lock();
                    if hosts > 1 {
                        let _ = writeln!(o, "[g{i}] {line}");
                    } else {
                        let _ = writeln!(o, "{line}");
                    }
                }
                output[i].push(line);
            }
            Ok((_, None)) => open_pipes -= 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let mut statuses = Vec::new();
    let mut problems = Vec::new();
    for (i, g) in guests.iter_mut().enumerate() {
        if timed_out {
            let _ = g.child.kill();
        }
        let _ = g.child.wait();
        let status = fs::read_to_string(g.out_dir.join("status"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        match status {
            Some(s) => statuses.push(s),
            None if timed_out => {
                problems.push(format!(
                    "guest {i} did not finish within {} s (hung, or the command never ended); it was killed",
                    opts.timeout.as_secs()
                ));
                statuses.push(124);
            }
            None => {
                let panic = output[i].iter().any(|l| l.contains("Kernel panic"));
                problems.push(format!(
                    "guest {i} stopped without reporting a status{}",
                    if panic {
                        " (kernel panic)"
                    } else {
                        " (crashed or powered off early)"
                    }
                ));
                statuses.push(125);
            }
        }
    }
    for p in &problems {
        eprintln!("xtask vm: {p}");
        if let Some(i) = p
            .strip_prefix("guest ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok())
        {
            let tail: Vec<_> = output[i].iter().rev().take(15).rev().collect();
            eprintln!("xtask vm: last lines of guest {i}:");
            for l in tail {
                eprintln!("  | {l}");
            }
        }
    }
    let link = link.map(|l| LinkDrops {
        host: udp_before
            .zip(host_udp_counters())
            .map(|(b, a)| UdpCounters {
                rcvbuf_errors: a.rcvbuf_errors.saturating_sub(b.rcvbuf_errors),
                in_errors: a.in_errors.saturating_sub(b.in_errors),
            }),
        sockets: l.drops(),
        rcvbuf: l.rcvbuf,
    });
    Ok(VmOutcome {
        statuses,
        output,
        out_dirs: guests.into_iter().map(|g| g.out_dir).collect(),
        link,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// /proc/net/snmp's UDP part as Linux 6.1 prints it.
    const SNMP: &str = "\
Ip: Forwarding DefaultTTL InReceives InHdrErrors
Ip: 2 64 123 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 13416 3 7152 13420 7151 0 1 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 99 0 98 0 0 0 0
";

    #[test]
    fn parses_udp_counters_not_udplite() {
        assert_eq!(
            parse_udp_snmp(SNMP),
            Some(UdpCounters {
                rcvbuf_errors: 7151,
                in_errors: 7152
            })
        );
        assert_eq!(parse_udp_snmp("Ip: a b\nIp: 1 2\n"), None);
        assert_eq!(
            parse_udp_snmp("Udp: InDatagrams InErrors\nUdp: 1 2\n"),
            None,
            "RcvbufErrors missing"
        );
    }

    #[test]
    fn link_drops_make_a_run_inconclusive() {
        let quiet = LinkDrops {
            host: Some(UdpCounters {
                rcvbuf_errors: 0,
                in_errors: 0,
            }),
            sockets: Some(0),
            rcvbuf: 2 * LINK_BUF_BYTES,
        };
        assert_eq!(quiet.inconclusive(), None);
        let dropped = LinkDrops {
            host: Some(UdpCounters {
                rcvbuf_errors: 7151,
                in_errors: 7151,
            }),
            ..quiet
        };
        let msg = dropped.inconclusive().expect("inconclusive");
        assert!(
            msg.starts_with("the emulated link itself dropped 7151 packets; result inconclusive"),
            "{msg}"
        );
        let unknown = LinkDrops {
            host: None,
            ..quiet
        };
        assert!(unknown.inconclusive().is_some());
    }

    #[test]
    fn the_switch_forwards_by_mac_and_floods_the_rest() {
        let to = |dst: [u8; 6], from: usize| {
            let mut f = dst.to_vec();
            f.extend_from_slice(&guest_mac(from));
            switch_ports(&f, from, 4).collect::<Vec<_>>()
        };
        assert_eq!(to(guest_mac(2), 0), [2]);
        assert_eq!(to(guest_mac(0), 3), [0]);
        // IPv4 multicast MAC, broadcast, a MAC no guest has.
        assert_eq!(to([0x01, 0x00, 0x5e, 0x07, 0x04, 0x01], 1), [0, 2, 3]);
        assert_eq!(to([0xff; 6], 2), [0, 1, 3]);
        assert_eq!(to([0x52, 0x54, 0, 0x12, 0x34, 0x20], 0), [1, 2, 3]);
        assert_eq!(switch_ports(&[1, 2], 0, 3).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn the_host_has_udp_counters() {
        assert!(host_udp_counters().is_some());
    }
}
