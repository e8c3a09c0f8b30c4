//! `cargo xtask vm`: boot one or two soft-RoCE guests and run a command.
//!
//! Each guest is a stock Debian kernel under qemu (TCG) with the host's root
//! shared read-only over 9p and a per-run writable folder; `rxe0` is created
//! on its virtio NIC. Two guests are linked by qemu's UDP socket netdev on the
//! host's loopback (the TCP form costs ~22 ms per round trip).

use crate::setup::GuestImage;
use anyhow::{bail, Context, Result};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::UdpSocket;
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
    if !(1..=2).contains(&opts.hosts) {
        bail!("--hosts must be 1 or 2");
    }
    let run = run_dir(workspace)?;
    let cwd = std::env::current_dir()?;
    let ports = [free_udp_port()?, free_udp_port()?];
    let hosts = opts.hosts as usize;
    let cpus = opts.cpus.unwrap_or(if hosts == 1 { 2 } else { 1 });
    let (tx, rx) = mpsc::channel::<(usize, Option<String>)>();
    let mut guests = Vec::new();
    let started = Instant::now();
    for i in 0..hosts {
        let out_dir = run.join(format!("g{i}"));
        fs::create_dir_all(&out_dir)?;
        let addr = format!("198.18.0.{}", i + 1);
        let peer = format!("198.18.0.{}", 2 - i);
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
            format!(
                "socket,id=n0,udp=127.0.0.1:{},localaddr=127.0.0.1:{}",
                ports[1 - i],
                ports[i]
            )
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
        .args([
            "-append",
            // tsc=reliable: without it the emulated guest falls back to the
            // HPET clocksource, and every clock_gettime (Instant::now)
            // traps into the emulator (~13 us each).
            "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init clocksource=tsc tsc=reliable",
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
                "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:{:02x}",
                0x10 + i
            ),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        kill_with_parent(&mut q);
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
    Ok(VmOutcome {
        statuses,
        output,
        out_dirs: guests.into_iter().map(|g| g.out_dir).collect(),
    })
}
