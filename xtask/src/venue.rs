//! The FIX venue used by the order-gateway tests and the demo: a QuickFIX
//! acceptor (PyPI `quickfix-ssl`) in a Python virtual environment kept in
//! the cache folder, so it needs no system-wide pip.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// The venv's python, which tests receive as `ROCEBUS_PYTHON`.
pub fn python() -> PathBuf {
    crate::setup::cache_dir().join("venv/bin/python3")
}

/// Creates the venv and installs the venue's requirements (cached).
pub fn ensure_venue() -> Result<()> {
    let req = crate::workspace_root().join("order-gateway/venue/requirements.txt");
    if !req.exists() {
        return Ok(());
    }
    let reqs = std::fs::read_to_string(&req)?;
    let venv = crate::setup::cache_dir().join("venv");
    let stamp = venv.join("rocebus-requirements.txt");
    if python().exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(reqs.as_str()) {
        return Ok(());
    }
    eprintln!(
        "setup: creating the venue's Python environment ({})",
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
    let st = Command::new(venv.join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check", "-r"])
        .arg(&req)
        .status()?;
    if !st.success() {
        bail!("pip install -r {} failed", req.display());
    }
    std::fs::write(stamp, reqs)?;
    Ok(())
}
