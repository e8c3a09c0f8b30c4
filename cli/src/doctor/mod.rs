//! `rocebus doctor`: checks a host for the rocebus configs given and prints pass, warn or
//! fail per item, with the fix. It reads sysfs and procfs (roots configurable, so tests run
//! it over fake trees) and runs the read-only QoS tools `mlnx_qos` and `dcb` when they are
//! installed; it changes nothing. docs/deploy.md explains each setting and names the test of
//! each check.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use serde::Serialize;

mod checks;
mod host;
mod needs;
mod qos;
#[cfg(test)]
mod tests;

pub use host::Host;
pub use needs::Needs;

/// Options of `rocebus doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// A service config to check the host for (feed handler, order gateway, engine,
    /// market-data file); repeat for each service that runs here. Its pinned cores, bound
    /// addresses, ring sizes and traffic class are checked against the host.
    #[arg(long = "config", value_name = "FILE")]
    configs: Vec<PathBuf>,
    /// Print one JSON object (`checks`: check, subject, status, detail, fix; and counts).
    #[arg(long)]
    json: bool,
    /// Root of sysfs (for tests and containers).
    #[arg(long, default_value = "/sys", value_name = "DIR")]
    sysfs_root: PathBuf,
    /// Root of procfs (for tests and containers).
    #[arg(long, default_value = "/proc", value_name = "DIR")]
    procfs_root: PathBuf,
}

/// The outcome of one check on one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// As it should be.
    Pass,
    /// Works, but costs latency or loses packets under load, or cannot be checked here.
    Warn,
    /// rocebus will not work as configured.
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The check's name (`port_state`, `gid_table`, ...), as docs/deploy.md lists them.
    pub check: &'static str,
    /// What was checked (`mlx5_0/1`, `core 3`, `eth2`).
    pub subject: String,
    /// Pass, warn or fail.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about it, for warn and fail.
    pub fix: Option<String>,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    checks: &'a [Finding],
    pass: usize,
    warn: usize,
    fail: usize,
}

fn count(findings: &[Finding], s: Status) -> usize {
    findings.iter().filter(|f| f.status == s).count()
}

/// The human-readable report.
pub fn render_text(findings: &[Finding]) -> String {
    let width = findings.iter().map(|f| f.check.len()).max().unwrap_or(0);
    let mut out = format!(
        "rocebus doctor: {} pass, {} warn, {} fail\n",
        count(findings, Status::Pass),
        count(findings, Status::Warn),
        count(findings, Status::Fail)
    );
    for f in findings {
        out.push_str(&format!(
            "{} {:width$} {}: {}\n",
            f.status.label(),
            f.check,
            f.subject,
            f.detail
        ));
        if let Some(fix) = &f.fix {
            out.push_str(&format!("     {:width$} fix: {fix}\n", ""));
        }
    }
    out
}

/// The JSON report.
pub fn render_json(findings: &[Finding]) -> String {
    let r = JsonReport {
        checks: findings,
        pass: count(findings, Status::Pass),
        warn: count(findings, Status::Warn),
        fail: count(findings, Status::Fail),
    };
    // A struct of strings and numbers always serializes.
    serde_json::to_string_pretty(&r).unwrap_or_default() + "\n"
}

/// Runs every check; exit code 0 when nothing failed, 1 otherwise.
pub fn doctor(args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let needs = Needs::read(&args.configs)?;
    let host = Host {
        sys: args.sysfs_root.clone(),
        proc: args.procfs_root.clone(),
        tool_path: std::env::var_os("PATH"),
    };
    let findings = checks::all(&host, &needs);
    let text = if args.json {
        render_json(&findings)
    } else {
        render_text(&findings)
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .context("cannot write to stdout")?;
    Ok(if findings.iter().any(|f| f.status == Status::Fail) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
