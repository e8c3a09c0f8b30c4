//! `cargo xtask check-build`: does the verbs binding build whatever libclang
//! and Debian release the machine has?
//!
//! rdma-sys generates its bindings with bindgen at build time, and bindgen
//! loads a libclang found on the machine, so the build depends on which clang
//! versions are installed (issue 15: rdma-sys 0.3.0's own bindgen panicked on
//! libclang 15+). The workspace builds a vendored rdma-sys with a current
//! bindgen; this command checks that:
//!
//! - on this host, for every LLVM installed under `/usr/lib/llvm-N` (library
//!   and builtin headers), rdma-sys builds with `LIBCLANG_PATH` pointing at it,
//!   and every version yields the same bindings (`cargo xtask test` runs this
//!   when more than one is installed; one is what the normal build uses);
//! - with `--trixie`, the `rocebus` crate builds in a Debian trixie chroot
//!   (libclang 19, rustc 1.85, the workspace's minimum) from crates vendored on
//!   the host, offline. The chroot is cached under [`setup::cache_dir`]; the
//!   first run takes a few minutes, later ones about the build's time.

use crate::setup;
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Debian packages the trixie chroot gets: what a user installs to build
/// rocebus (see README), with the distribution's own Rust toolchain.
const CHROOT_PACKAGES: &[&str] = &[
    "cargo",
    "rustc",
    "gcc",
    "libc6-dev",
    "pkg-config",
    "libibverbs-dev",
    "librdmacm-dev",
    "libclang-dev",
];

/// The vendored rdma-sys's package name: a name of its own, so that no registry crate can
/// replace it where rocebus is a dependency (see [`embed`]).
const VENDORED: &str = "rocebus-rdma-sys";

/// An LLVM under `/usr/lib/llvm-N/lib` with both libclang and the builtin
/// headers (`stddef.h` & co.) that bindgen needs; the same rule rdma-sys's
/// build script uses to choose one when `LIBCLANG_PATH` is unset.
#[derive(Debug, Clone)]
pub struct Llvm {
    pub version: u32,
    pub lib: PathBuf,
    pub complete: bool,
}

/// The LLVMs installed here with a libclang, oldest first.
pub fn installed_llvms() -> Vec<Llvm> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/usr/lib") else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(version) = name
            .to_str()
            .and_then(|n| n.strip_prefix("llvm-"))
            .and_then(|v| v.parse::<u32>().ok())
        else {
            continue;
        };
        let lib = entry.path().join("lib");
        let has_library = fs::read_dir(&lib).is_ok_and(|files| {
            files.flatten().any(|f| {
                let f = f.file_name();
                let f = f.to_string_lossy();
                f.starts_with("libclang") && !f.starts_with("libclang-cpp") && f.contains(".so")
            })
        });
        if !has_library {
            continue;
        }
        let complete = fs::read_dir(lib.join("clang")).is_ok_and(|dirs| {
            dirs.flatten()
                .any(|d| d.path().join("include/stddef.h").is_file())
        });
        found.push(Llvm {
            version,
            lib,
            complete,
        });
    }
    found.sort_by_key(|l| l.version);
    found
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// Builds rdma-sys (`cargo check`: the build script generates the bindings
/// in full) with `LIBCLANG_PATH` at `lib`; returns the generated bindings.
fn bindings_with(root: &Path, lib: &Path) -> Result<String> {
    // A target dir of its own, shared by all versions: bindgen builds once,
    // and only rdma-sys's build script re-runs when LIBCLANG_PATH changes.
    let out = Command::new(env!("CARGO"))
        .args(["check", "-p", VENDORED, "--message-format=json"])
        .env("CARGO_TARGET_DIR", target_dir(root).join("check-build"))
        .env("LIBCLANG_PATH", lib)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cargo check -p {VENDORED}"))?;
    if !out.status.success() {
        bail!(
            "rdma-sys does not build with LIBCLANG_PATH={}",
            lib.display()
        );
    }
    let out_dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "build-script-executed")
        .filter(|v| {
            v["package_id"]
                .as_str()
                .is_some_and(|p| p.contains(VENDORED))
        })
        .find_map(|v| v["out_dir"].as_str().map(PathBuf::from))
        .context("cargo did not report rdma-sys's build script")?;
    let file = out_dir.join("bindings.rs");
    fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))
}

/// Builds rdma-sys against every complete LLVM installed here and checks
/// that they all generate the same bindings. `quiet_if_one`: with a single
/// LLVM (the normal build already used it) only say so.
pub fn host(root: &Path, quiet_if_one: bool) -> Result<()> {
    let llvms = installed_llvms();
    for l in llvms.iter().filter(|l| !l.complete) {
        eprintln!(
            "check-build: libclang {} has no builtin headers (libclang-common-{}-dev): \
             not used by the build, skipped",
            l.version, l.version
        );
    }
    let complete: Vec<&Llvm> = llvms.iter().filter(|l| l.complete).collect();
    if complete.is_empty() {
        eprintln!(
            "check-build: no /usr/lib/llvm-N with libclang and its headers; the build uses \
             whatever libclang clang-sys finds"
        );
        return Ok(());
    }
    if quiet_if_one && complete.len() == 1 {
        eprintln!(
            "== libclang: only {} installed, which the build above used",
            complete[0].version
        );
        return Ok(());
    }
    let mut first: Option<(u32, String)> = None;
    for l in &complete {
        let t0 = Instant::now();
        eprintln!(
            "== rdma-sys with libclang {} ({})",
            l.version,
            l.lib.display()
        );
        let bindings = bindings_with(root, &l.lib)?;
        eprintln!(
            "check-build: libclang {}: {} bytes of bindings in {:.0?}",
            l.version,
            bindings.len(),
            t0.elapsed()
        );
        match &first {
            None => first = Some((l.version, bindings)),
            Some((v, b)) if *b != bindings => bail!(
                "rdma-sys's bindings differ between libclang {v} and {}: compare the \
                 bindings.rs files under {}",
                l.version,
                target_dir(root).join("check-build").display()
            ),
            Some(_) => {}
        }
    }
    let versions: Vec<String> = complete.iter().map(|l| l.version.to_string()).collect();
    let same = if versions.len() > 1 {
        ", identical bindings"
    } else {
        ""
    };
    eprintln!(
        "check-build: rdma-sys builds with libclang {}{same}",
        versions.join(", ")
    );
    Ok(())
}

/// Creates (or reuses) a minimal Debian `suite` chroot with the build's
/// packages; returns its root.
fn chroot(suite: &str, mirror: Option<&str>) -> Result<PathBuf> {
    let dir = setup::cache_dir().join(format!("{suite}-build"));
    let rootfs = dir.join("rootfs");
    let stamp = dir.join("rootfs.stamp");
    let want = format!("{suite} {}\n", CHROOT_PACKAGES.join(","));
    if fs::read_to_string(&stamp).is_ok_and(|s| s == want) && rootfs.join("usr/bin/cargo").exists()
    {
        eprintln!(
            "check-build: reusing the {suite} chroot in {}",
            rootfs.display()
        );
        return Ok(rootfs);
    }
    if Command::new("debootstrap")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map_or(true, |s| !s.success())
    {
        eprintln!("check-build: installing debootstrap");
        setup::run(
            Command::new("apt-get")
                .args([
                    "install",
                    "-y",
                    "-qq",
                    "--no-install-recommends",
                    "debootstrap",
                ])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    let tmp = dir.join("rootfs.tmp");
    for d in [&tmp, &rootfs] {
        if d.exists() {
            fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
        }
    }
    let _ = fs::remove_file(&stamp);
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    eprintln!(
        "check-build: debootstrap {suite} into {} (a few minutes)",
        rootfs.display()
    );
    let mut cmd = Command::new("debootstrap");
    cmd.args(["--variant=minbase"])
        .arg(format!("--include={}", CHROOT_PACKAGES.join(",")))
        .arg(suite)
        .arg(&tmp);
    // Without a mirror, debootstrap uses Debian's default one.
    if let Some(m) = mirror {
        cmd.arg(m);
    }
    setup::run(&mut cmd)?;
    fs::rename(&tmp, &rootfs)?;
    fs::write(&stamp, want)?;
    Ok(rootfs)
}

/// Copies the workspace's files (tracked and untracked, not ignored: no
/// `target/`) to `dest`.
fn copy_workspace(root: &Path, dest: &Path) -> Result<()> {
    if dest.exists() {
        fs::remove_dir_all(dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()
        .context("git ls-files (the workspace must be a git checkout)")?;
    if !out.status.success() {
        bail!("git ls-files failed in {}", root.display());
    }
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let rel = Path::new(std::str::from_utf8(name).context("non-UTF-8 file name")?);
        let from = root.join(rel);
        if !from.is_file() {
            continue; // deleted but still in the index
        }
        let to = dest.join(rel);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(())
}

/// Builds the `rocebus` crate inside a Debian `suite` chroot, offline, with
/// the distribution's rustc and libclang.
pub fn debian(root: &Path, suite: &str, mirror: Option<&str>) -> Result<()> {
    if !setup::is_root() {
        bail!("check-build --{suite} needs root (debootstrap, chroot)");
    }
    let t0 = Instant::now();
    let rootfs = chroot(suite, mirror)?;
    let t_chroot = t0.elapsed();
    let build = rootfs.join("build");
    eprintln!("check-build: copying the workspace and vendoring its crates");
    copy_workspace(root, &build.join("src"))?;
    // `cargo vendor` on the host (which reaches crates.io) so the chroot
    // builds offline with exactly Cargo.lock's crates.
    let st = Command::new(env!("CARGO"))
        .args(["vendor", "--locked", "--quiet"])
        .arg(build.join("crates"))
        .current_dir(root)
        .stdout(Stdio::null())
        .status()
        .context("cargo vendor")?;
    if !st.success() {
        bail!("cargo vendor failed");
    }
    fs::create_dir_all(build.join("cargo-home"))?;
    fs::write(
        build.join("cargo-home/config.toml"),
        "[source.crates-io]\nreplace-with = \"vendored\"\n\n\
         [source.vendored]\ndirectory = \"/build/crates\"\n",
    )?;
    let script = "set -e
export PATH=/usr/bin:/bin HOME=/root CARGO_HOME=/build/cargo-home CARGO_TARGET_DIR=/build/target
echo \"check-build: $(. /etc/os-release; echo \"$PRETTY_NAME\"), $(rustc --version)\"
echo \"check-build: libclang $(ls -d /usr/lib/llvm-* | sed 's,.*/llvm-,,' | tr '\\n' ' ')\"
cd /build/src
cargo build -p rocebus --offline --locked
";
    // A private mount namespace: /proc for the chroot goes away with it.
    let t_build = Instant::now();
    let st = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount -t proc proc \"$1/proc\" && exec chroot \"$1\" env -i sh -c \"$2\"")
        .args(["sh"])
        .arg(&rootfs)
        .arg(script)
        .status()
        .context("unshare/chroot")?;
    if !st.success() {
        bail!("building rocebus in the {suite} chroot failed");
    }
    eprintln!(
        "check-build: {suite}: rocebus builds (chroot ready in {:.0?}, build {:.0?}, total {:.0?})",
        t_chroot,
        t_build.elapsed(),
        t0.elapsed()
    );
    Ok(())
}

/// The LLVM version [`embed`] builds with: Debian trixie's default, and one whose libclang the
/// published rdma-sys 0.3.0 (bindgen 0.59) cannot use.
pub const EMBED_LLVM: u32 = 19;

/// The scratch engine's manifest: rocebus by path, its own (empty) `[workspace]` so no
/// enclosing workspace applies, and no `[patch]` of any kind.
fn embed_manifest(core: &Path) -> String {
    format!(
        "[package]\nname = \"scratch-engine\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\
         publish = false\n\n[dependencies]\nrocebus = {{ path = {} }}\n\n[workspace]\n",
        toml_string(&core.display().to_string())
    )
}

/// `s` as a TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The scratch engine: a rocebus type, and a call through the verbs binding into libibverbs
/// (so the binding is linked and loaded, not only compiled). Needs no RDMA device.
const EMBED_MAIN: &str = r#"//! The smallest engine that embeds rocebus from outside its workspace.
use rocebus::verbs::{device_names, Gid};

fn main() {
    let gid = Gid([0; 16]);
    assert!(gid.is_zero() && gid.ipv4().is_none());
    let devices = match device_names() {
        Ok(names) => names.join(","),
        Err(e) => format!("none ({e})"),
    };
    println!("scratch-engine: rocebus linked; RDMA devices: {devices}");
}
"#;

/// Removes a directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Embedding from another workspace (issue 42): creates a scratch engine crate in a
/// temporary directory outside the repository, depending on the `rocebus` crate at `core`
/// by path with no `[patch]`, builds it with `LIBCLANG_PATH` at LLVM [`EMBED_LLVM`] and runs
/// it. Fails if libclang 19 is missing, the build fails or the engine does not print its line.
///
/// The published rdma-sys 0.3.0 panics in its build script with libclang 15 or newer; rocebus
/// depends on its vendored copy under another name (`rocebus-rdma-sys`) by path, which no
/// registry resolution can replace. `core` is normally this workspace's; `--rocebus PATH`
/// points the same check at another checkout (an older one fails it).
///
/// Cost: about a minute on two cores the first time (rocebus and its dependencies in debug),
/// seconds once built. The build has a target directory of its own, `embed/` in the
/// workspace's: sharing the workspace's would rebuild the whole workspace after every run,
/// since bindgen's build script re-runs whenever `LIBCLANG_PATH` changes and bindgen, a
/// registry crate, has the same artifact name in both builds. The workspace's Cargo.lock is
/// copied, so the versions are the tested ones and no registry look-up is needed.
pub fn embed(root: &Path, core: &Path) -> Result<()> {
    let t0 = Instant::now();
    let llvm = installed_llvms()
        .into_iter()
        .find(|l| l.version == EMBED_LLVM && l.complete)
        .with_context(|| {
            format!(
                "libclang {EMBED_LLVM} with its headers is not installed \
                 (apt-get install libclang-{EMBED_LLVM}-dev; `cargo xtask setup` does)"
            )
        })?;
    let core = core
        .canonicalize()
        .with_context(|| format!("no rocebus crate at {}", core.display()))?;
    if !core.join("Cargo.toml").is_file() {
        bail!("{} has no Cargo.toml", core.display());
    }
    let dir = std::env::temp_dir()
        .canonicalize()
        .context("the temporary directory")?
        .join(format!("rocebus-embed-{}", std::process::id()));
    let root_abs = root.canonicalize()?;
    if dir.starts_with(&root_abs) {
        bail!(
            "the temporary directory {} is inside the repository: set TMPDIR elsewhere",
            dir.display()
        );
    }
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(dir.join("src"))
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let _cleanup = RemoveOnDrop(dir.clone());
    fs::write(dir.join("Cargo.toml"), embed_manifest(&core))?;
    fs::write(dir.join("src/main.rs"), EMBED_MAIN)?;
    // The workspace's versions: shared artifacts, and no registry look-up when they suffice.
    let lock = core
        .parent()
        .map(|p| p.join("Cargo.lock"))
        .filter(|l| l.is_file());
    if let Some(lock) = lock {
        fs::copy(&lock, dir.join("Cargo.lock"))?;
    }
    let target = target_dir(root).join("embed");
    eprintln!(
        "== embedding: a scratch engine in {} depends on {} by path, built with libclang {}",
        dir.display(),
        core.display(),
        llvm.version
    );
    let st = Command::new(env!("CARGO"))
        .args(["build", "--quiet"])
        .env("CARGO_TARGET_DIR", &target)
        .env("LIBCLANG_PATH", &llvm.lib)
        .env_remove("CARGO_MANIFEST_DIR")
        .current_dir(&dir)
        .status()
        .context("cargo build (scratch engine)")?;
    if !st.success() {
        bail!(
            "a scratch engine outside the workspace that depends on rocebus by path does not \
             build with libclang {} ({st}): embedding needs a [patch] again?",
            llvm.version
        );
    }
    let t_build = t0.elapsed();
    let exe = target.join("debug/scratch-engine");
    let out = Command::new(&exe)
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !stdout.starts_with("scratch-engine: rocebus linked") {
        bail!(
            "the scratch engine built but did not run ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("{}", stdout.trim_end());
    eprintln!(
        "embedding: ok (build {:.0?}, total {:.0?})",
        t_build,
        t0.elapsed()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scratch_manifest_has_no_patch_and_its_own_workspace() {
        let m = embed_manifest(Path::new("/x/my \"rocebus\"/core"));
        assert!(!m.contains("patch"), "{m}");
        assert!(m.contains("\n[workspace]\n"), "{m}");
        assert!(
            m.contains(r#"rocebus = { path = "/x/my \"rocebus\"/core" }"#),
            "{m}"
        );
    }
}
