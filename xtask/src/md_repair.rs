//! `cargo xtask bench md-repair`: repair datagrams the publisher sends per
//! datagram lost on its egress, with 1, 2 and 3 subscribers, with multicast
//! repair (the default) and unicast only (the baseline).
//!
//! The harness is the guest test
//! `rdma_md_three_hosts_shared_loss_repaired_on_multicast` (core/tests/md_net.rs),
//! run in N + 1 guests on one emulated switch: guest 0 publishes 40,000
//! messages under correlated netem loss on its multicast egress (Gilbert
//! model, `loss state 5% 50%`: about 9% lost, in bursts), the others subscribe, and the publisher prints its netem drop
//! count and the repair datagrams it sent (unicast and multicast). The test
//! itself fails if a subscriber misses anything. Figures are counts, not
//! times, so the debug build the test runner uses is fine.

use crate::{setup, test, vm};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::time::Duration;

const TEST: &str = "rdma_md_three_hosts_shared_loss_repaired_on_multicast";

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
    let mut results = Vec::new();
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
            let opts = vm::VmOptions {
                hosts: subs + 1,
                timeout: Duration::from_secs(900),
                env: vec![(
                    "ROCEBUS_MD_REPAIR_UNICAST".into(),
                    if unicast { "1" } else { "0" }.into(),
                )],
                stream: false,
                ..Default::default()
            };
            let out = vm::run(&img, root, &cmd, &opts)?;
            if let Some(why) = out.link.as_ref().and_then(vm::LinkDrops::inconclusive) {
                bail!("md-repair with {subs} subscribers ({mode}): {why}");
            }
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
                bail!(
                    "md-repair with {subs} subscribers ({mode}) failed (status {})",
                    out.status()
                );
            }
            let f = parse(&out.output[0]).context("the publisher printed no md-repair-figures")?;
            eprintln!(
                "   lost {} datagrams on the publisher's egress, sent {} repair datagrams",
                f.lost, f.repairs
            );
            results.push((unicast, subs, f));
        }
    }
    for (unicast, subs, f) in &results {
        let head = if *unicast {
            "md-repair (unicast only)"
        } else {
            "md-repair"
        };
        println!(
            "{head}: {subs} subscribers, {:.2} repair datagrams per lost datagram \
             ({} repairs for {} lost)",
            f.per_lost, f.repairs, f.lost
        );
    }
    Ok(())
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
}
