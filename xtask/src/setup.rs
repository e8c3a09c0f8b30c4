//! `cargo xtask setup`: Debian packages, the guest kernel and its initramfs.
//!
//! Everything built here is cached under [`cache_dir`] and rebuilt only when
//! an input changes (kernel package version, init script, module list).

use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian packages the project needs (see SOFTROCE-NOTES and the README).
pub const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "kmod",
    "cpio",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "libibverbs-dev",
    "librdmacm-dev",
    "rdmacm-utils",
    "perftest",
    "iproute2",
    "libclang-dev",
    // libclang 19 (trixie's default; on bookworm beside 14): `cargo xtask test` builds a
    // scratch engine that embeds rocebus with it (check_build::embed), and check-build
    // compares the bindings of every libclang installed.
    "libclang-19-dev",
    "pkg-config",
    "tshark",
    "python3-pip",
    "python3-venv",
    "fonts-dejavu-core",
    // The metrics endpoint's test scrapes `rocebus stat --listen` with a real Prometheus.
    "prometheus",
    // `cargo xtask bench ipc` builds Aeron C from source, which links these.
    "uuid-dev",
    "libbsd-dev",
    // `cargo xtask test` runs the ring's loopback tests under memcheck.
    "valgrind",
    // ffi/: the C and C++ examples of the C ABI, built and run by its tests (and by
    // their Makefile).
    "gcc",
    "g++",
    "make",
    // rdma-core's Python binding: the raw-verbs attackers of the guest tests
    // (`core/tests/attackers/*.py`, run with /usr/bin/python3). The guests
    // see it because they run in a chroot of this machine's root.
    "python3-pyverbs",
];

/// Modules the guest loads, in this order (dependencies are resolved by
/// `modprobe --show-depends` against the unpacked kernel at setup time).
/// crc32_generic first: without it `rdma link add` fails to add eth0.
const MODULES: &[&str] = &[
    "crc32_generic",
    "virtio_pci",
    "virtio_net",
    "9pnet_virtio",
    "9p",
    "configfs",
    "rdma_rxe",
    "ib_uverbs",
    "rdma_ucm",
    "sch_netem",
    // Per-destination loss (A/B line tests): a prio qdisc with u32 filters.
    "sch_prio",
    "cls_u32",
];

const INIT_SH: &str = include_str!("../guest/init.sh");

/// The guest's kernel and initramfs, ready to boot.
#[derive(Debug, Clone)]
pub struct GuestImage {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

/// Where downloads and the initramfs are cached: `$ROCEBUS_CACHE`, else
/// `$XDG_CACHE_HOME/rocebus`, else `~/.cache/rocebus`. Outside the checkout
/// so that fresh clones (CI) reuse it.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ROCEBUS_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("rocebus");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/rocebus")
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::geteuid() == 0
    }
}

fn missing_packages() -> Vec<&'static str> {
    PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            let out = Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output();
            !matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect()
}

/// Installs missing Debian packages (as root) or explains how to.
pub fn ensure_packages() -> Result<()> {
    let missing = missing_packages();
    if missing.is_empty() {
        return Ok(());
    }
    let line = format!("apt-get install -y {}", missing.join(" "));
    if !is_root() {
        bail!(
            "missing Debian packages: {}\nrun as root:\n  apt-get update && {line}",
            missing.join(" ")
        );
    }
    eprintln!("setup: installing {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    Ok(())
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The name of the versioned kernel image package `linux-image-amd64` pulls in.
fn kernel_package() -> Result<String> {
    let deps = output(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))?;
    deps.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-") && !p.contains('<'))
        .map(str::to_owned)
        .context("apt-cache does not know linux-image-amd64: run `apt-get update` first")
}

/// Downloads and unpacks the kernel (cached), builds the initramfs (cached).
pub fn guest_image() -> Result<GuestImage> {
    let cache = cache_dir();
    fs::create_dir_all(&cache).with_context(|| format!("cannot create {}", cache.display()))?;
    let pkg = match kernel_package() {
        Ok(p) => p,
        Err(e) => {
            // Offline or no apt lists: reuse whatever kernel is cached.
            match cached_kernel_package(&cache) {
                Some(p) => p,
                None => {
                    if is_root() {
                        run(Command::new("apt-get").args(["update", "-qq"]))?;
                        kernel_package()?
                    } else {
                        return Err(e);
                    }
                }
            }
        }
    };
    let kdir = cache.join(&pkg);
    let version = pkg.trim_start_matches("linux-image-").to_owned();
    let vmlinuz = kdir.join(format!("root/boot/vmlinuz-{version}"));
    if !vmlinuz.exists() {
        eprintln!("setup: fetching {pkg}");
        let _ = fs::remove_dir_all(&kdir);
        fs::create_dir_all(&kdir)?;
        run(Command::new("apt-get")
            .args(["download", "-qq", &pkg])
            .current_dir(&kdir))?;
        let deb = fs::read_dir(&kdir)?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .context("apt-get download produced no .deb")?;
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(kdir.join("root")))?;
        fs::remove_file(&deb)?;
        run(Command::new("depmod")
            .arg("-b")
            .arg(kdir.join("root"))
            .arg(&version))?;
    }
    let initrd = build_initramfs(&kdir, &version)?;
    Ok(GuestImage {
        kernel: vmlinuz,
        initrd,
    })
}

fn cached_kernel_package(cache: &Path) -> Option<String> {
    fs::read_dir(cache)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("linux-image-"))
        .max()
}

fn build_initramfs(kdir: &Path, version: &str) -> Result<PathBuf> {
    let root = kdir.join("root");
    // Resolve module dependencies in load order, first occurrence wins.
    let mut seen = BTreeSet::new();
    let mut load = Vec::new();
    for m in MODULES {
        let deps = output(Command::new("modprobe").arg("-d").arg(&root).args([
            "-S",
            version,
            "--show-depends",
            m,
        ]))
        .with_context(|| format!("module {m} not in {}", root.display()))?;
        for line in deps.lines() {
            if let Some(path) = line.trim().strip_prefix("insmod ") {
                let path = path.trim().to_owned();
                if seen.insert(path.clone()) {
                    load.push(path);
                }
            }
        }
    }
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("/bin/busybox missing: install busybox-static (cargo xtask setup)");
    }
    // The stamp covers every input; rebuild only when it changes.
    let stamp = format!("{version}\n{}\n{INIT_SH}", load.join("\n"));
    let initrd = kdir.join("initramfs.cpio.gz");
    let stamp_path = kdir.join("initramfs.stamp");
    if initrd.exists() && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        return Ok(initrd);
    }
    eprintln!("setup: building initramfs");
    let stage = kdir.join("initramfs");
    let _ = fs::remove_dir_all(&stage);
    for d in [
        "bin", "proc", "sys", "dev", "host", "out", "keep", "modules",
    ] {
        fs::create_dir_all(stage.join(d))?;
    }
    fs::copy(busybox, stage.join("bin/busybox"))?;
    let init = stage.join("init");
    fs::write(&init, INIT_SH)?;
    set_exec(&init)?;
    let mut list = String::new();
    for (i, path) in load.iter().enumerate() {
        let name = Path::new(path).file_name().context("module path")?;
        let dest = format!("modules/{i:02}-{}", name.to_string_lossy());
        fs::copy(path, stage.join(&dest)).with_context(|| format!("copy {path}"))?;
        list.push_str(&format!("/{dest}\n"));
    }
    fs::write(stage.join("modules.load"), list)?;
    let tmp = kdir.join("initramfs.cpio.gz.tmp");
    run(Command::new("sh").arg("-c").arg(format!(
        "cd '{}' && find . -print0 | cpio --null -o -H newc --quiet | gzip -1 > '{}'",
        stage.display(),
        tmp.display()
    )))?;
    fs::rename(&tmp, &initrd)?;
    fs::write(&stamp_path, stamp)?;
    Ok(initrd)
}

fn set_exec(p: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// `cargo xtask setup`.
pub fn setup() -> Result<GuestImage> {
    ensure_packages()?;
    let img = guest_image()?;
    crate::venue::ensure_venue()?;
    eprintln!(
        "setup: ready (kernel {}, initramfs {})",
        img.kernel.display(),
        img.initrd.display()
    );
    Ok(img)
}
