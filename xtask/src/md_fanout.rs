//! `cargo xtask bench md-fanout`: the publisher's CPU time per published
//! message on UD multicast and on RC fan-out, with 1, 2 and 4 subscribers,
//! all in one soft-RoCE guest (subscribers are threads of the harness).
//!
//! The harness is `rocebus-bench md-fanout` (bench/src/fanout.rs), built in
//! release; it prints one line per configuration and the closing
//! `md-fanout: multicast N=1 X ns/msg, ...` line, passed through here.

use crate::{bench, setup, vm};
use anyhow::{bail, Result};
use std::path::Path;
use std::time::Duration;

pub fn run(root: &Path, iterations: Option<u64>, extra: &str) -> Result<()> {
    let (exe, _) = bench::build_bench(root)?;
    let n = iterations.map(|n| format!("-n {n}")).unwrap_or_default();
    let cmd = format!(
        "timeout 900 {} md-fanout {n} {extra}",
        vm::shell_quote(&exe.display().to_string())
    );
    let lines: Vec<String> =
        if std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some()) {
            eprintln!("== this host has an RDMA device: running natively");
            let o = std::process::Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .current_dir(root)
                .output()?;
            eprint!("{}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_owned)
                .collect()
        } else {
            let img = setup::guest_image()?;
            let opts = vm::VmOptions {
                timeout: Duration::from_secs(1200),
                ..Default::default()
            };
            let out = vm::run(&img, root, &cmd, &opts)?;
            if out.status() != 0 {
                bail!("md-fanout failed in the guest (status {})", out.status());
            }
            out.output.into_iter().next().unwrap_or_default()
        };
    let Some(summary) = lines.iter().find(|l| l.starts_with("md-fanout: ")) else {
        bail!("the harness printed no md-fanout line");
    };
    println!();
    crate::verdict::line(summary.as_str());
    Ok(())
}
