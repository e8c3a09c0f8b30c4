//! `cargo xtask demo`: the whole pipeline in one command, then the report.
//!
//! Set-up (cached), release binaries, a generated ITCH day, then `demo/pipeline.sh` in one
//! soft-RoCE guest (or natively where the host has an RDMA device): replay → feed-handler →
//! UD multicast (or, with `--market-data ipc`, shared memory) → sample-engine → RC →
//! order-gateway → venue → back. The engine measures and
//! writes the report, `.hgrm` files and plots; this module copies them into the output
//! folder, adds the `rocebus stat` output taken mid-run, and prints it all.

use crate::{setup, venue, vm};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const PIPELINE_SH: &str = include_str!("../demo/pipeline.sh");

/// The venue behind the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Venue {
    /// The gateway's built-in venue simulator (`order-gateway run --venue sim`: acks and
    /// fills at once).
    Sim,
    /// A real QuickFIX acceptor (Python, `order-gateway/venue/venue.py`).
    Quickfix,
}

/// How market data reaches the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MarketData {
    /// The rocebus UD multicast bus (RDMA).
    Rdma,
    /// The feed handler's shared-memory streams (`rocebus::ipc`, `publish.ipc_stream`): the
    /// engine runs on the feed handler's host.
    Ipc,
}

impl MarketData {
    /// The name `demo/pipeline.sh` takes in `DEMO_MARKET_DATA`.
    pub fn as_str(self) -> &'static str {
        match self {
            MarketData::Rdma => "rdma",
            MarketData::Ipc => "ipc",
        }
    }
}

/// What `cargo xtask demo` runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Seconds of trading.
    pub seconds: u64,
    /// Output folder.
    pub out: PathBuf,
    /// Venue.
    pub venue: Venue,
    /// ITCH messages per second replayed.
    pub rate: u64,
    /// Orders per second (default: the engine config's).
    pub order_rate: Option<u64>,
    /// How market data reaches the engine.
    pub market_data: MarketData,
}

/// Binaries the pipeline runs: (package, binary).
const BINARIES: &[(&str, &str)] = &[
    ("feed-handler", "feed-handler"),
    ("order-gateway", "order-gateway"),
    ("rocebus-bench", "sample-engine"),
    ("rocebus-cli", "rocebus"),
];

fn host_rdma_addr() -> Option<String> {
    // The IPv4-mapped GID (::ffff:a.b.c.d) of the first device's port 1, index 1.
    let dev = std::fs::read_dir("/sys/class/infiniband")
        .ok()?
        .next()?
        .ok()?;
    let gid = std::fs::read_to_string(dev.path().join("ports/1/gids/1")).ok()?;
    let hex: Vec<u8> = gid
        .trim()
        .split(':')
        .skip(6)
        .flat_map(|w| {
            let v = u16::from_str_radix(w, 16).unwrap_or(0);
            [(v >> 8) as u8, v as u8]
        })
        .collect();
    (hex.len() == 4).then(|| format!("{}.{}.{}.{}", hex[0], hex[1], hex[2], hex[3]))
}

/// Parses the `RESULT key=value ...` line of the engine.
pub fn parse_result(text: &str) -> Option<BTreeMap<String, u64>> {
    let line = text.lines().rev().find(|l| l.starts_with("RESULT "))?;
    line.split_whitespace()
        .skip(1)
        .map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// Why a finished run does not count as a working pipeline, if it does not.
pub fn judge(result: &BTreeMap<String, u64>) -> Option<String> {
    let get = |k: &str| result.get(k).copied().unwrap_or(0);
    if get("md_messages") == 0 {
        return Some("no market data reached the engine".into());
    }
    if get("orders") == 0 || get("acks") == 0 {
        return Some("no order made the round trip to the venue".into());
    }
    if get("md_unrecoverable") != 0 {
        return Some(format!(
            "{} unrecoverable market-data losses",
            get("md_unrecoverable")
        ));
    }
    None
}

/// The head of the report: the conditions the run had (emulated or native, vCPUs, busy
/// processes per vCPU, idle strategies) and this host's raw-verbs floor measured just
/// before it, with each figure of the run expressed in floors.
fn conditions_block(
    native: bool,
    venue: Venue,
    conditions: &str,
    floor_write: &str,
    floor_send: &str,
    result: Option<&BTreeMap<String, u64>>,
) -> String {
    use crate::bench::{parse_perftest, Kind};
    let mut s = String::from("conditions:\n");
    let kv: BTreeMap<&str, &str> = conditions
        .lines()
        .filter_map(|l| l.split_once('='))
        .collect();
    s.push_str(if native {
        "  native: this host's RDMA device, no emulation\n"
    } else {
        "  emulated: one qemu guest without hardware acceleration (TCG), soft-RoCE (rdma_rxe);\n  \
         every instruction costs some 10-50x native, so absolute times are for shape only\n"
    });
    // The busy processes: feed handler, gateway and engine poll; the exchange replay and
    // the QuickFIX venue run beside them.
    let ipc = kv.get("market_data") == Some(&"ipc");
    s.push_str(if ipc {
        "  market data: the feed handler's shared-memory streams (rocebus::ipc), same host\n"
    } else {
        "  market data: the rocebus UD multicast bus (RDMA)\n"
    });
    let busy = 3.0;
    match kv.get("vcpus").and_then(|v| v.parse::<f64>().ok()) {
        Some(n) if n > 0.0 => s.push_str(&format!(
            "  {n} vCPUs; 3 polling processes (feed-handler, order-gateway, sample-engine){} \
             beside the exchange replay: {:.1} polling threads per vCPU\n",
            if venue == Venue::Quickfix {
                " and the QuickFIX venue"
            } else {
                ""
            },
            busy / n
        )),
        _ => s.push_str("  vCPUs: not recorded\n"),
    }
    for (k, v) in kv.iter().filter(|(k, _)| k.starts_with("idle.")) {
        let v = if v.is_empty() {
            "busy_spin (default)"
        } else {
            v
        };
        s.push_str(&format!("  idle strategy of {}: {v}\n", &k[5..]));
    }
    s.push_str(
        "  (more polling threads than vCPUs: each backs off when idle (spins, then yields, \
         then parks up to 50 us) so the others get the cores; a parked thread adds up to \
         its park time to a message that arrives meanwhile)\n",
    );
    let lines = |t: &str| t.lines().map(str::to_owned).collect::<Vec<_>>();
    let write = parse_perftest(&lines(floor_write), Kind::Latency);
    let send = parse_perftest(&lines(floor_send), Kind::Latency);
    s.push_str("raw-verbs floor on this host just before the run (perftest, 64 B, one-way, 2000 iterations):\n");
    let show = |name: &str, f: &Option<crate::bench::Figures>, raw: &str| match f {
        Some(f) => format!("  {name}: p50 {:.2} us, p99 {:.2} us\n", f.p50_us, f.p99_us),
        None => format!(
            "  {name}: not measured ({})\n",
            raw.lines().last().unwrap_or("no output").trim()
        ),
    };
    s.push_str(&show("ib_write_lat (one RDMA WRITE)", &write, floor_write));
    s.push_str(&show("ib_send_lat -c UD (one UD send)", &send, floor_send));
    let get = |k: &str| result.and_then(|r| r.get(k)).copied().unwrap_or(0) as f64 / 1000.0;
    s.push_str("the run's medians in floors:\n");
    match send {
        Some(f) if get("md_p50_ns") > 0.0 => s.push_str(&format!(
            "  market data p50 {:.1} us = {:.1} x ib_send_lat p50 (the path: exchange UDP packet \
             -> feed handler's books -> {} -> engine handler)\n",
            get("md_p50_ns"),
            get("md_p50_ns") / f.p50_us,
            if ipc {
                "one shared-memory stream, no NIC"
            } else {
                "one UD multicast hop"
            }
        )),
        _ => s.push_str("  market data: no floor or no figure to compare\n"),
    }
    match write {
        Some(f) if get("rtt_p50_ns") > 0.0 => s.push_str(&format!(
            "  order round trip p50 {:.1} us = {:.1} x ib_write_lat p50 (the path: two RC hops, \
             risk, two journal appends, FIX to the venue and back over TCP)\n",
            get("rtt_p50_ns"),
            get("rtt_p50_ns") / f.p50_us
        )),
        _ => s.push_str("  order round trip: no floor or no figure to compare\n"),
    }
    s.push('\n');
    s
}

/// Runs the demo; fails if the pipeline did not work end to end.
pub fn run(root: &Path, opts: &DemoOptions) -> Result<()> {
    eprintln!("== set-up (cached after the first run)");
    let img = setup::setup()?;
    if opts.venue == Venue::Quickfix {
        venue::ensure_venue()?;
    }
    eprintln!("== building release binaries");
    let mut build = Command::new(env!("CARGO"));
    build
        .args(["build", "--release", "--bins"])
        .current_dir(root);
    for (package, _) in BINARIES {
        build.args(["-p", package]);
    }
    if !build.status()?.success() {
        bail!("building the release binaries failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("release").canonicalize()?;

    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("cannot create {}", opts.out.display()))?;
    let out = opts.out.canonicalize()?;
    // Enough exchange traffic for the whole run (and the start-up), at the replay rate. The
    // day goes under the target folder, which the guest sees (unlike the host's /tmp).
    let messages = opts.rate * (opts.seconds + 20);
    let day = target.join("demo/day.itch50");
    std::fs::create_dir_all(target.join("demo"))?;
    eprintln!(
        "== generating an ITCH 5.0 day ({messages} messages, 100 symbols) into {}",
        day.display()
    );
    let st = Command::new(bin.join("feed-handler"))
        .args(["generate", "--seed", "1", "--symbols", "100", "--messages"])
        .arg(messages.to_string())
        .arg("-o")
        .arg(&day)
        .status()?;
    if !st.success() {
        bail!("feed-handler generate failed");
    }

    let python = venue::python();
    let mut env: Vec<(String, String)> = vec![
        ("DEMO_BIN".into(), bin.display().to_string()),
        (
            "DEMO_ROOT".into(),
            root.canonicalize()?.display().to_string(),
        ),
        ("DEMO_DAY".into(), day.display().to_string()),
        ("DEMO_SECONDS".into(), opts.seconds.to_string()),
        ("DEMO_RATE".into(), opts.rate.to_string()),
        (
            "DEMO_VENUE".into(),
            match opts.venue {
                Venue::Sim => "sim",
                Venue::Quickfix => "quickfix",
            }
            .into(),
        ),
        ("DEMO_PYTHON".into(), python.display().to_string()),
        ("DEMO_MARKET_DATA".into(), opts.market_data.as_str().into()),
    ];
    // The Python QuickFIX venue answers a few dozen orders a second under emulation.
    let order_rate = opts
        .order_rate
        .or((opts.venue == Venue::Quickfix).then_some(20));
    if let Some(r) = order_rate {
        env.push(("DEMO_ORDER_RATE".into(), r.to_string()));
    }
    let guest_out;
    let status = if let Some(addr) = host_rdma_addr() {
        eprintln!("== this host has an RDMA device ({addr}): running natively");
        guest_out = out.join("run");
        env.push(("DEMO_ADDR".into(), addr));
        env.push(("DEMO_OUT".into(), guest_out.display().to_string()));
        Command::new("sh")
            .arg("-c")
            .arg(PIPELINE_SH)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(root)
            .status()?
            .code()
            .unwrap_or(1)
    } else {
        eprintln!("== running the pipeline in a soft-RoCE guest (emulated: figures are for shape, not speed)");
        // The guest writes into its own export folder; the script takes it from ROCEBUS_OUT.
        let script = format!("DEMO_OUT=\"$ROCEBUS_OUT\"\nexport DEMO_OUT\n{PIPELINE_SH}");
        let vm_opts = vm::VmOptions {
            timeout: Duration::from_secs(opts.seconds + 300),
            env,
            ..Default::default()
        };
        let outcome = vm::run(&img, root, &script, &vm_opts)?;
        guest_out = outcome.out_dirs[0].clone();
        outcome.status()
    };

    // Collect: the engine's report folder, the logs and the stat snapshots.
    let mut copied = Vec::new();
    for dir in [guest_out.join("report"), guest_out.clone()] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            let keep = p.is_file()
                && !matches!(
                    name.to_str(),
                    Some("guest.sh" | "status" | "hostpath" | "keep")
                );
            if keep && p.parent() != Some(&out) {
                std::fs::copy(&p, out.join(&name))
                    .with_context(|| format!("cannot copy {}", p.display()))?;
                copied.push(name.to_string_lossy().into_owned());
            }
        }
    }
    copied.sort();
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let report = read("report.txt");
    let stat = read("stat.txt");
    let prom = read("stat.prom");
    let mut full = String::new();
    let native = host_rdma_addr().is_some();
    full.push_str(&conditions_block(
        native,
        opts.venue,
        &read("conditions.txt"),
        &read("floor-write.txt"),
        &read("floor-send.txt"),
        parse_result(&read("result.txt")).as_ref(),
    ));
    full.push_str(&report);
    full.push_str("\n`rocebus stat --once`, read from another process mid-run:\n");
    full.push_str(if stat.is_empty() {
        "(not taken)\n"
    } else {
        &stat
    });
    full.push_str(&format!(
        "\n`rocebus stat --prometheus` mid-run: {} metric lines (stat.prom)\n",
        prom.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count()
    ));
    std::fs::write(out.join("report.txt"), &full)?;
    println!("\n================ rocebus demo report ================");
    print!("{full}");
    println!("files in {}: {}", out.display(), copied.join(", "));

    if status != 0 {
        bail!(
            "the demo pipeline failed (status {status}); logs are in {}",
            out.display()
        );
    }
    let result = parse_result(&read("result.txt"))
        .with_context(|| format!("the engine wrote no result line ({})", out.display()))?;
    if let Some(problem) = judge(&result) {
        bail!("the demo ran but {problem}; logs are in {}", out.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_head_states_conditions_and_floors() {
        let perftest = |p50: &str| {
            format!(
                " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n \
                 64       2000          10.00          90.00        {p50}          21.00        2.00            30.00                 80.00\n"
            )
        };
        let result =
            parse_result("RESULT md_p50_ns=100000 rtt_p50_ns=400000 md_messages=1").unwrap();
        let s = conditions_block(
            false,
            Venue::Sim,
            "vcpus=2\nidle.feed-handler={ kind = \"backoff\" }\nidle.sample-engine=\n",
            &perftest("20.00"),
            &perftest("50.00"),
            Some(&result),
        );
        assert!(s.contains("emulated"), "{s}");
        assert!(
            s.contains("market data: the rocebus UD multicast bus"),
            "{s}"
        );
        assert!(s.contains("one UD multicast hop"), "{s}");
        assert!(
            s.contains("2 vCPUs") && s.contains("1.5 polling threads per vCPU"),
            "{s}"
        );
        assert!(
            s.contains("idle strategy of feed-handler: { kind = \"backoff\" }"),
            "{s}"
        );
        assert!(
            s.contains("idle strategy of sample-engine: busy_spin"),
            "{s}"
        );
        assert!(
            s.contains("ib_write_lat (one RDMA WRITE): p50 20.00 us"),
            "{s}"
        );
        assert!(
            s.contains("market data p50 100.0 us = 2.0 x ib_send_lat"),
            "{s}"
        );
        assert!(
            s.contains("order round trip p50 400.0 us = 20.0 x ib_write_lat"),
            "{s}"
        );
        let s = conditions_block(
            true,
            Venue::Sim,
            "",
            "ib_write_lat is not installed",
            "",
            None,
        );
        assert!(
            s.contains("native") && s.contains("not measured (ib_write_lat is not installed)"),
            "{s}"
        );
        assert!(s.contains("market data: no floor"), "{s}");
        let s = conditions_block(
            false,
            Venue::Sim,
            "vcpus=2\nmarket_data=ipc\n",
            &perftest("20.00"),
            &perftest("50.00"),
            Some(&result),
        );
        assert!(s.contains("shared-memory streams"), "{s}");
        assert!(s.contains("one shared-memory stream, no NIC"), "{s}");
    }

    #[test]
    fn parses_and_judges_result_lines() {
        let r = parse_result("noise\nRESULT md_messages=5 orders=3 acks=3 md_unrecoverable=0\n")
            .unwrap();
        assert_eq!(r["md_messages"], 5);
        assert_eq!(judge(&r), None);
        let mut bad = r.clone();
        bad.insert("md_unrecoverable".into(), 2);
        assert!(judge(&bad).unwrap().contains("2 unrecoverable"));
        bad.insert("acks".into(), 0);
        assert!(judge(&bad).unwrap().contains("round trip"));
        bad.insert("md_messages".into(), 0);
        assert!(judge(&bad).unwrap().contains("market data"));
        assert!(parse_result("RESULT x=notanumber").is_none());
        assert!(parse_result("nothing").is_none());
    }
}
