//! `cargo xtask bench md-repair`: repair datagrams the publisher sends per
//! datagram lost on its egress, with 1, 2 and 3 subscribers, with multicast
//! repair (the default) and unicast only (the baseline).
//!
//! The harness is the guest test
//! `rdma_md_three_hosts_shared_loss_repaired_on_multicast` (core/tests/md_net.rs),
//! run in N + 1 guests on one emulated switch: guest 0 publishes 40,000
//! messages (`ROCEBUS_MD_REPAIR_MESSAGES` in xtask's environment sets
//! another count) under correlated netem loss on its multicast egress
//! (Gilbert model, `loss state 5% 50%`: about 9% lost, in bursts), the
//! others subscribe, and the publisher prints its netem drop count and the
//! repair datagrams it sent (unicast and multicast). The test itself fails
//! if a subscriber misses anything, or, with multicast repair, if the
//! figure is not below the goal of 1.5. Figures are counts, not times, so
//! the debug build the test runner uses is fine. A configuration that fails
//! is reported and the others still run; the bench fails at the end.
//!
//! First, on the host (no RDMA, no guest), it prints the amplification
//! figure of issue 41: bytes the publisher sends in repair per byte of
//! request when two admitted peers ask for the same ranges over and over
//! for one simulated second, and the bound the recovery server states
//! (`rocebus::mcast::server`). The figure comes from the simulator test
//! that asserts the bound, driving the shipped `RecoveryServer` and
//! `PublisherState`.

use crate::{setup, test, vm};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const TEST: &str = "rdma_md_three_hosts_shared_loss_repaired_on_multicast";

/// The host simulator test that measures the amplification.
const AMPLIFICATION_TEST: &str =
    "two_admitted_peers_cannot_make_the_publisher_send_more_than_the_bound";

/// Bytes in and out of the amplification run, and the bound.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Amplification {
    bytes_in: u64,
    bytes_out: u64,
    bound: u64,
}

/// Parses the `md-repair-amplification: ...` line the simulator test
/// prints.
fn parse_amplification(lines: &str) -> Option<Amplification> {
    let l = lines
        .lines()
        .find_map(|l| l.split_once("md-repair-amplification: ").map(|(_, r)| r))?;
    let w: Vec<&str> = l.split_whitespace().collect();
    let after = |key: &str| {
        w.iter()
            .position(|x| *x == key)
            .and_then(|i| w.get(i + 1))
            .and_then(|v| v.parse().ok())
    };
    Some(Amplification {
        bytes_in: after("in")?,
        bytes_out: after("out")?,
        bound: after("bound")?,
    })
}

/// Runs the host simulator test and prints the amplification figure.
fn amplification(root: &Path) -> Result<()> {
    eprintln!("== md-repair: amplification by two admitted peers, on the host (no RDMA)");
    let out = Command::new(env!("CARGO"))
        .args([
            "test",
            "-p",
            "rocebus",
            "--test",
            "mcast_sim",
            "--",
            "--exact",
        ])
        .arg(AMPLIFICATION_TEST)
        .arg("--nocapture")
        .current_dir(root)
        .output()
        .context("running cargo test")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let a = parse_amplification(&stdout);
    if let Some(a) = a {
        let ratio = |b: u64| b as f64 / a.bytes_in.max(1) as f64;
        crate::verdict::line(format!(
            "md-repair amplification: {:.0} bytes of repair per byte of request \
             ({} out for {} in, two admitted peers, one simulated second; \
             stated bound {} bytes, {:.0} per byte)",
            ratio(a.bytes_out),
            a.bytes_out,
            a.bytes_in,
            a.bound,
            ratio(a.bound)
        ));
    }
    if !out.status.success() {
        bail!("{AMPLIFICATION_TEST} failed ({})", out.status);
    }
    a.map(|_| ())
        .context("the simulator printed no md-repair-amplification line")
}

/// The publisher's figures of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Figures {
    lost: u64,
    repairs: u64,
    per_lost: f64,
}

/// Parses the `md-repair-figures: ...` line the publisher prints.
fn parse(lines: &[String]) -> Option<Figures> {
    let l = lines
        .iter()
        .find_map(|l| l.split_once("md-repair-figures: ").map(|(_, r)| r))?;
    let w: Vec<&str> = l.split_whitespace().collect();
    let after = |key: &str| {
        w.iter()
            .position(|x| *x == key)
            .and_then(|i| w.get(i + 1))
            .copied()
    };
    Some(Figures {
        lost: after("lost")?.parse().ok()?,
        repairs: after("repairs")?.parse().ok()?,
        per_lost: after("per_lost")?.parse().ok()?,
    })
}

/// The goal: repair datagrams per lost datagram, whatever the number of
/// subscribers.
const GOAL: f64 = 1.5;

pub fn run(root: &Path) -> Result<()> {
    let bins = test::rdma_test_binaries(root)?;
    let exe = bins
        .iter()
        .find(|b| b.rdma_tests.iter().any(|t| t == TEST))
        .map(|b| b.path.clone())
        .with_context(|| format!("no test binary has {TEST}"))?;
    let img = setup::guest_image()?;
    let cmd = format!(
        "{} --ignored --exact {TEST} --test-threads=1 --nocapture",
        vm::shell_quote(&exe.display().to_string())
    );
    let messages = std::env::var("ROCEBUS_MD_REPAIR_MESSAGES").ok();
    let mut results = Vec::new();
    let mut failed = Vec::new();
    if let Err(e) = amplification(root) {
        eprintln!("   failed: {e:#}");
        failed.push(format!("amplification: {e:#}"));
    }
    for unicast in [false, true] {
        for subs in 1..=3u8 {
            let mode = if unicast {
                "unicast only"
            } else {
                "multicast repair"
            };
            eprintln!(
                "== md-repair: {subs} subscriber(s), {mode} ({} guests)",
                subs + 1
            );
            let mut env = vec![(
                "ROCEBUS_MD_REPAIR_UNICAST".to_string(),
                if unicast { "1" } else { "0" }.to_string(),
            )];
            if let Some(n) = &messages {
                env.push(("ROCEBUS_MD_REPAIR_MESSAGES".into(), n.clone()));
            }
            let opts = vm::VmOptions {
                hosts: subs + 1,
                timeout: Duration::from_secs(900),
                env,
                stream: false,
                ..Default::default()
            };
            match run_one(&img, root, &cmd, &opts) {
                Ok(f) => {
                    eprintln!(
                        "   lost {} datagrams on the publisher's egress, sent {} repair datagrams",
                        f.lost, f.repairs
                    );
                    results.push((unicast, subs, f));
                }
                Err(e) => {
                    eprintln!("   failed: {e:#}");
                    failed.push(format!("{subs} subscribers ({mode}): {e:#}"));
                }
            }
        }
    }
    for (unicast, subs, f) in &results {
        let head = if *unicast {
            "md-repair (unicast only)"
        } else {
            "md-repair"
        };
        let goal = match (*unicast, f.per_lost < GOAL) {
            (true, _) => "",
            (false, true) => ", goal < 1.5 met",
            (false, false) => ", goal < 1.5 NOT met",
        };
        crate::verdict::line(format!(
            "{head}: {subs} subscribers, {:.2} repair datagrams per lost datagram \
             ({} repairs for {} lost{goal})",
            f.per_lost, f.repairs, f.lost
        ));
    }
    if !failed.is_empty() {
        bail!(
            "md-repair: {} run(s) failed: {}",
            failed.len(),
            failed.join("; ")
        );
    }
    Ok(())
}

/// One configuration: boots the guests, runs the test, reads the figures.
fn run_one(
    img: &setup::GuestImage,
    root: &Path,
    cmd: &str,
    opts: &vm::VmOptions,
) -> Result<Figures> {
    let out = vm::run(img, root, cmd, opts)?;
    if let Some(why) = out.link.as_ref().and_then(vm::LinkDrops::inconclusive) {
        bail!("{why}");
    }
    // The publisher's line, even from a run that failed (the goal missed).
    let figures = parse(&out.output[0]);
    if out.status() != 0 {
        // The panic message, not the backtrace after it.
        for (i, o) in out.output.iter().enumerate() {
            for (j, l) in o.iter().enumerate() {
                if l.contains("panicked at") {
                    for l in o.iter().skip(j).take(3) {
                        eprintln!("[g{i}] {l}");
                    }
                }
            }
        }
        if let Some(f) = figures {
            eprintln!(
                "   (the publisher measured {:.2}: {} repairs for {} lost)",
                f.per_lost, f.repairs, f.lost
            );
        }
        bail!("failed (status {})", out.status());
    }
    figures.context("the publisher printed no md-repair-figures")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_publisher_line() {
        let lines = vec![
            "noise".to_string(),
            "md-repair-figures: subscribers 3 multicast_repair true lost 61 of 1500 repairs 70 \
             (unicast 5 multicast 65) covered 120 per_lost 1.148"
                .to_string(),
        ];
        assert_eq!(
            parse(&lines),
            Some(Figures {
                lost: 61,
                repairs: 70,
                per_lost: 1.148
            })
        );
        assert_eq!(parse(&["md-repair-figures: lost x".to_string()]), None);
    }

    #[test]
    fn parses_the_amplification_line() {
        let out = "running 1 test\nmd-repair-amplification: in 160000 out 83996389 \
                   (unicast 48927421, multicast 35068968 on 2 lines) ratio 525 \
                   bound 88080384 ratio-bound 551\ntest ... ok\n";
        assert_eq!(
            parse_amplification(out),
            Some(Amplification {
                bytes_in: 160000,
                bytes_out: 83996389,
                bound: 88080384
            })
        );
        assert_eq!(parse_amplification("md-repair-amplification: in x"), None);
    }
}
