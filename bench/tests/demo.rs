//! The demo (`cargo xtask demo`): its configs and the sample engine's CLI on any host, and
//! the whole pipeline in the soft-RoCE guest (`#[ignore = "rdma: ..."]`, run by
//! `cargo xtask test`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use feed_handler::binaryfile::Reader;
use feed_handler::generate::{generate_binaryfile, GenConfig};
use feed_handler::itch::Message;
use rocebus_bench::demo::{EngineConfig, Transport};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench is inside the workspace")
        .to_path_buf()
}

fn demo_config(name: &str) -> PathBuf {
    root().join("configs/demo").join(name)
}

#[test]
fn sample_engine_bad_config_names_file_key_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(demo_config("sample-engine.toml")).unwrap();
    let cases = [
        (
            good.replace("quantity = 100", "quantity = 0"),
            "strategy.quantity",
            "at least 1",
        ),
        (
            good.replace("[strategy]", "[strategy]\nsymbol = \"A\""),
            "symbol",
            "unknown field",
        ),
        (
            good.replace("orders_per_second = 100", "orders_per_second = \"fast\""),
            "orders_per_second",
            "expected u64",
        ),
        (
            good.replace(
                "token = \"9d41c0e7b25a8f63d1e04b7c29a58f3e6b0d2c71a4e98f05c3b67d1a2e9f4c08\"",
                "token = \"\"",
            ),
            "gateway.orders.token",
            "empty",
        ),
    ];
    for (i, (text, key, problem)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("engine{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_sample-engine"))
            .arg("--check")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} was accepted");
        assert!(
            err.contains(&format!("engine{i}.toml")) && err.contains(key) && err.contains(problem),
            "case {i}: want file, {key:?} and {problem:?} in:\n{err}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_sample-engine"))
        .args(["--check", "--config", "no/such/engine.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/engine.toml"));
    let out = Command::new(env!("CARGO_BIN_EXE_sample-engine"))
        .arg("--check")
        .arg("--config")
        .arg(demo_config("sample-engine.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every demo config loads in its binary's own loader, the gateway takes its reference
/// prices from the bus the feed handler publishes on, and the engine's symbols trade on the
/// generated day the demo replays, within a day's range narrower than the price collar.
#[test]
fn demo_configs_load_and_agree() {
    let engine = EngineConfig::load(&demo_config("sample-engine.toml")).unwrap();
    rocebus_bench::demo::load_market_data(&engine.market_data.config).unwrap();
    let fh = feed_handler::config::Config::load(&demo_config("feed-handler.toml")).unwrap();
    let mut gateways = vec![demo_config("order-gateway-quickfix.toml")];
    if demo_config("order-gateway.toml").exists() {
        gateways.push(demo_config("order-gateway.toml"));
    }
    // Prices of the demo's day (same seed and symbol count as `cargo xtask demo`).
    let (day, _) = generate_binaryfile(&GenConfig {
        seed: 1,
        messages: 50_000,
        symbols: 100,
    });
    let mut range: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for m in Reader::new(&day).unwrap().flatten() {
        if let Message::AddOrder(a) = m {
            let name = a.stock.as_str().unwrap_or_default().to_owned();
            let p = f64::from(a.price.get()) / 1e4;
            let r = range.entry(name).or_insert((p, p));
            *r = (r.0.min(p), r.1.max(p));
        }
    }
    for path in gateways {
        let gw = order_gateway::config::Config::load(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let grant = gw
            .risk
            .engines
            .iter()
            .find(|g| g.id == engine.gateway.engine_id)
            .expect("the engine id has a [[risk.engines]] entry");
        assert!(grant.accounts.contains(&engine.gateway.account));
        assert_eq!(grant.token, engine.gateway.engine_token);
        assert_eq!(gw.service.orders.token, engine.gateway.orders.token);
        assert_eq!(gw.service.listen, engine.gateway.addr);
        let account = gw
            .risk
            .accounts
            .iter()
            .find(|a| a.id == engine.gateway.account)
            .unwrap();
        let collar = f64::from(account.collar_bps) / 1e4;
        let md = gw
            .market_data
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no [market_data]", path.display()));
        assert!(
            gw.reference_prices.is_empty(),
            "{}: static prices would mask the feed",
            path.display()
        );
        let bus = md.load_bus().unwrap();
        assert_eq!(bus.channels, fh.market_data.channels, "{}", path.display());
        assert_eq!(md.publisher, fh.publish.local_ip, "{}", path.display());
        for sym in &engine.strategy.symbols {
            // The engine quotes at the touch and the reference is the midpoint: a day whose
            // whole range fits in the collar cannot trip it on a quote of its own.
            let (lo, hi) = range[sym];
            assert!(
                hi - lo <= lo * collar,
                "{}: {sym} trades {lo}..{hi}, wider than the collar ({collar})",
                path.display()
            );
        }
    }
}

/// A sibling binary of this package's binaries (other packages' binaries land in the same
/// folder when the workspace is built, as `cargo xtask test` does).
fn sibling(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_sample-engine"))
        .parent()
        .unwrap();
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} missing: build the workspace's binaries first (`cargo build --workspace --bins`)",
        p.display()
    );
    dir.to_path_buf()
}

/// `demo/pipeline.sh` switches the demo to shared memory by uncommenting one line in each
/// of two configs; with them uncommented, both configs load, and the engine reads the
/// streams the feed handler publishes.
#[test]
fn demo_configs_switch_to_shared_memory_as_the_pipeline_does() {
    let dir = tempfile::tempdir().unwrap();
    for (name, from, to) in [
        ("feed-handler.toml", "\n#ipc_stream = ", "\nipc_stream = "),
        (
            "sample-engine.toml",
            "\n#transport = \"ipc\"",
            "\ntransport = \"ipc\"",
        ),
    ] {
        let text = std::fs::read_to_string(demo_config(name)).unwrap();
        let enabled = text.replace(from, to);
        assert_ne!(
            enabled, text,
            "{name}: no {from:?} line for pipeline.sh to enable"
        );
        std::fs::write(dir.path().join(name), enabled).unwrap();
    }
    let engine = EngineConfig::load(&dir.path().join("sample-engine.toml")).unwrap();
    assert_eq!(engine.market_data.transport, Transport::Ipc);
    let fh = feed_handler::config::Config::load(&dir.path().join("feed-handler.toml")).unwrap();
    let source = rocebus_bench::demo::load_ipc_source(&engine.market_data).unwrap();
    assert_eq!(Some(&source.prefix), fh.publish.ipc_stream.as_ref());
    assert_eq!(source.config.dir, fh.ipc_config().dir);
    // The defaults stay on the bus.
    let engine = EngineConfig::load(&demo_config("sample-engine.toml")).unwrap();
    assert_eq!(engine.market_data.transport, Transport::Rdma);
    let fh = feed_handler::config::Config::load(&demo_config("feed-handler.toml")).unwrap();
    assert_eq!(fh.publish.ipc_stream, None);
}

/// The whole demo pipeline for a few seconds: market data reaches the engine, orders make
/// the round trip, nothing is lost for good, the report files are written and non-empty,
/// and `rocebus stat` read the running components' counters from another process.
#[test]
#[ignore = "rdma: runs the demo pipeline (feed-handler, order-gateway, sample-engine) on an RDMA device"]
fn demo_pipeline_runs_end_to_end() {
    pipeline_end_to_end("rdma");
}

/// The same with the engine reading the feed handler's shared-memory streams instead of
/// the bus (`cargo xtask demo --market-data ipc`); the orders still go over RC.
#[test]
#[ignore = "rdma: runs the demo pipeline (feed-handler, order-gateway, sample-engine) on an RDMA device"]
fn demo_pipeline_runs_end_to_end_over_ipc() {
    let stat = pipeline_end_to_end("ipc");
    assert!(
        stat.contains("md.ch1.ipc messages"),
        "the engine did not read shared memory:\n{stat}"
    );
}

/// Runs `demo/pipeline.sh` with `DEMO_MARKET_DATA=market_data`, checks what both
/// transports must give, and returns the `rocebus stat` output taken mid-run.
fn pipeline_end_to_end(market_data: &str) -> String {
    let bin = sibling("feed-handler");
    for b in ["order-gateway", "rocebus"] {
        sibling(b);
    }
    let dir = tempfile::tempdir().unwrap();
    let day = dir.path().join("day.itch50");
    let st = Command::new(bin.join("feed-handler"))
        .args([
            "generate",
            "--seed",
            "1",
            "--symbols",
            "100",
            "--messages",
            "40000",
            "-o",
        ])
        .arg(&day)
        .status()
        .unwrap();
    assert!(st.success());
    let out = dir.path().join("out");
    let run = Command::new("sh")
        .arg(root().join("xtask/demo/pipeline.sh"))
        .env("DEMO_BIN", &bin)
        .env("DEMO_ROOT", root())
        .env("DEMO_DAY", &day)
        .env("DEMO_OUT", &out)
        .env("DEMO_SECONDS", "8")
        .env("DEMO_RATE", "2000")
        .env("DEMO_MARKET_DATA", market_data)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "pipeline failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let result = std::fs::read_to_string(out.join("report/result.txt")).unwrap();
    let kv: BTreeMap<&str, u64> = result
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect();
    assert!(kv["md_messages"] > 0, "no market data: {result}\n{stdout}");
    assert!(
        kv["orders"] > 0 && kv["acks"] > 0,
        "no order round trip: {result}\n{stdout}"
    );
    assert!(kv["rtt_count"] > 0, "{result}");
    assert_eq!(
        kv["md_unrecoverable"], 0,
        "unrecovered market-data loss: {result}"
    );
    // The latency probe needs CAP_NET_RAW: the guest runs as root, so there it must work.
    if std::env::var_os("ROCEBUS_IN_GUEST").is_some() {
        assert!(
            kv["md_latency_count"] > 0,
            "no market-data latency: {result}"
        );
    }
    let mut files = vec![
        "report.txt",
        "order-rtt.hgrm",
        "order-rtt.png",
        "order-rtt.svg",
    ];
    if kv["md_latency_count"] > 0 {
        files.extend(["md-latency.hgrm", "md-latency.png", "md-latency.svg"]);
    }
    for f in files {
        let len = std::fs::metadata(out.join("report").join(f)).map_or(0, |m| m.len());
        assert!(len > 0, "{f} missing or empty");
    }
    let stat = std::fs::read_to_string(out.join("stat.txt")).unwrap();
    for component in ["sample-engine", "feed-handler", "order-gateway"] {
        assert!(
            stat.contains(component),
            "rocebus stat lacks {component}:\n{stat}"
        );
    }
    assert!(stat.contains("orders sent"), "{stat}");
    // Each component names the RoCE v2 GID it sends from (issue 43): the bus, the gateway's
    // engine listener, the engine's gateway connection.
    for component in ["sample-engine", "feed-handler", "order-gateway"] {
        let section: Vec<&str> = stat
            .lines()
            .skip_while(|l| !l.starts_with(&format!("{component}  pid ")))
            .skip(1)
            .take_while(|l| l.starts_with(' '))
            .collect();
        assert!(
            section
                .iter()
                .any(|l| l.contains("rdma.gid ::ffff:") && l.contains(" RoCE v2 ")),
            "rocebus stat shows no GID for {component}:\n{stat}"
        );
    }
    let prom = std::fs::read_to_string(out.join("stat.prom")).unwrap();
    assert!(
        prom.lines()
            .any(|l| !l.starts_with('#') && l.contains("sample")),
        "{prom}"
    );
    let engine_log = std::fs::read_to_string(out.join("sample-engine.log")).unwrap();
    assert!(
        engine_log.contains(&format!("over {market_data}")),
        "the engine did not use {market_data}:\n{engine_log}"
    );
    stat
}
