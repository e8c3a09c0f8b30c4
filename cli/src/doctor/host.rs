//! What `rocebus doctor` reads from a host: files under a sysfs root and a procfs root
//! (`/sys` and `/proc`, or fake trees in tests), and the output of the read-only QoS tools
//! (`mlnx_qos`, `dcb`) found on a search path. Nothing here writes or configures anything.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The host being checked.
#[derive(Debug, Clone)]
pub struct Host {
    /// The sysfs root (`/sys`).
    pub sys: PathBuf,
    /// The procfs root (`/proc`).
    pub proc: PathBuf,
    /// Where the QoS tools are looked for (`$PATH`'s form); `None`: nowhere.
    pub tool_path: Option<OsString>,
}

/// What running a read-only tool gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutput {
    /// The tool is not installed (not on the search path).
    Absent,
    /// It ran and failed: its first line of error output (or the exit status).
    Failed(String),
    /// It ran and succeeded: its standard output.
    Ok(String),
}

impl Host {
    /// `rel` under the sysfs root, trimmed; `None` if missing, unreadable or empty.
    pub fn sys_text(&self, rel: impl AsRef<Path>) -> Option<String> {
        read_trimmed(&self.sys.join(rel))
    }

    /// `rel` under the procfs root, trimmed.
    pub fn proc_text(&self, rel: impl AsRef<Path>) -> Option<String> {
        read_trimmed(&self.proc.join(rel))
    }

    /// Whether `rel` exists under the sysfs root.
    pub fn sys_exists(&self, rel: impl AsRef<Path>) -> bool {
        self.sys.join(rel).exists()
    }

    /// Sorted entry names of the directory `rel` under the sysfs root; empty if absent.
    pub fn sys_list(&self, rel: impl AsRef<Path>) -> Vec<String> {
        list(&self.sys.join(rel))
    }

    /// Runs `prog args` if `prog` is on the tool path.
    pub fn tool(&self, prog: &str, args: &[&str]) -> ToolOutput {
        let Some(path) = &self.tool_path else {
            return ToolOutput::Absent;
        };
        let Some(exe) = std::env::split_paths(path)
            .map(|d| d.join(prog))
            .find(|p| p.is_file())
        else {
            return ToolOutput::Absent;
        };
        match Command::new(&exe).args(args).output() {
            Err(e) => ToolOutput::Failed(format!("cannot run {}: {e}", exe.display())),
            Ok(o) if o.status.success() => {
                ToolOutput::Ok(String::from_utf8_lossy(&o.stdout).into_owned())
            }
            Ok(o) => {
                let err = String::from_utf8_lossy(&o.stderr);
                let first = err
                    .lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty())
                    .map_or_else(|| format!("exit status {}", o.status), str::to_owned);
                ToolOutput::Failed(first)
            }
        }
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Sorted entry names of `dir`; empty if it cannot be read.
pub fn list(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    v.sort_by(|a, b| natural(a).cmp(&natural(b)));
    v
}

/// Sort key putting `2` before `10` (IRQ numbers, GID indices, CPU numbers).
fn natural(s: &str) -> (u64, &str) {
    (s.parse().unwrap_or(u64::MAX), s)
}

/// Parses a kernel CPU list (`0-3,8,10-11`); `None` for text that is not one. An empty
/// text and `(null)` (what `nohz_full` holds when off) are the empty list.
pub fn parse_cpulist(text: &str) -> Option<Vec<usize>> {
    let text = text.trim();
    let mut out = Vec::new();
    if text.is_empty() || text == "(null)" {
        return Some(out);
    }
    for part in text.split(',') {
        let part = part.trim();
        // `0-15:2/4` (groups) is rare on the command line; take the plain forms only.
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// Prints a CPU list in the kernel's compact form (`0-3,8`).
pub fn format_cpulist(cpus: &[usize]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        while i + 1 < v.len() && v[i + 1] == v[i] + 1 {
            i += 1;
        }
        parts.push(if v[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", v[i])
        });
        i += 1;
    }
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(",")
    }
}

/// The CPU list of a kernel command-line parameter (`isolcpus=domain,managed_irq,2-3`:
/// flags before the list are skipped; `nohz_full=2-3`), from `/proc/cmdline`'s text.
pub fn cmdline_cpus(cmdline: &str, param: &str) -> Option<Vec<usize>> {
    let value = cmdline
        .split_whitespace()
        .filter_map(|w| w.strip_prefix(param)?.strip_prefix('='))
        .next_back()?;
    // isolcpus flags (`nohz`, `domain`, `managed_irq`) come first, comma separated.
    let list: Vec<&str> = value
        .split(',')
        .filter(|p| p.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    parse_cpulist(&list.join(","))
}

/// The soft `Max locked memory` of `/proc/self/limits`: `Some(None)` for unlimited.
pub fn parse_memlock(limits: &str) -> Option<Option<u64>> {
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))?;
    let soft = line.split_whitespace().next()?;
    if soft == "unlimited" {
        return Some(None);
    }
    soft.parse().ok().map(Some)
}
