//! The project's Python virtual environment, kept in the cache folder so it
//! needs no system-wide pip: the FIX venue used by the order-gateway tests and
//! the demo (a QuickFIX acceptor, PyPI `quickfix-ssl`), and itch-book, the
//! independent ITCH book that feed-handler's BBO is checked against in the
//! tests and measured against by `cargo xtask bench books`.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// The venv's python, which tests receive as `ROCEBUS_PYTHON`.
pub fn python() -> PathBuf {
    crate::setup::cache_dir().join("venv/bin/python3")
}

/// Requirement files installed into the venv, relative to the workspace root.
pub const REQUIREMENTS: &[&str] = &[
    "order-gateway/venue/requirements.txt",
    "feed-handler/crosscheck/requirements.txt",
    "bench/aeron/requirements.txt",
];

/// Creates the venv and installs every file of [`REQUIREMENTS`] (cached: redone
/// only when one of them changed).
pub fn ensure_venue() -> Result<()> {
    let root = crate::workspace_root();
    let files: Vec<PathBuf> = REQUIREMENTS
        .iter()
        .map(|r| root.join(r))
        .filter(|p| p.exists())
        .collect();
    if files.is_empty() {
        return Ok(());
    }
    let mut reqs = String::new();
    for f in &files {
        reqs.push_str(
            &std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        );
    }
    let venv = crate::setup::cache_dir().join("venv");
    let stamp = venv.join("rocebus-requirements.txt");
    if python().exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(reqs.as_str()) {
        return Ok(());
    }
    eprintln!(
        "setup: creating the project's Python environment ({})",
        venv.display()
    );
    let py = ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .arg("-c")
                .arg("import venv")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .context("python3 with the venv module is needed (apt-get install python3-venv)")?;
    let st = Command::new(py).args(["-m", "venv"]).arg(&venv).status()?;
    if !st.success() {
        bail!("python3 -m venv {} failed", venv.display());
    }
    let mut pip = Command::new(venv.join("bin/pip"));
    pip.args(["install", "-q", "--disable-pip-version-check"]);
    for f in &files {
        pip.arg("-r").arg(f);
    }
    let st = pip.status()?;
    if !st.success() {
        bail!("pip install {pip:?} failed");
    }
    std::fs::write(stamp, reqs)?;
    Ok(())
}
