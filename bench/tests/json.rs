//! `rocebus-bench --json`: every harness ends with one JSON object holding its figures
//! (here the two that need no RDMA device; the RDMA harnesses go through the same
//! `report::emit_result`, whose parsing `report`'s unit tests cover).

use std::process::Command;

/// Runs `rocebus-bench ARGS --json`; the last stdout line parsed as JSON.
fn last_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_rocebus-bench"))
        .args(args)
        .arg("--json")
        .output()
        .expect("run rocebus-bench");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: last line {last:?}"));
    assert!(v["figures"].is_object(), "{v}");
    v
}

#[test]
fn tag_cost_ends_with_its_figures_as_json() {
    let v = last_json(&["tag-cost", "-n", "2000", "--sizes", "64,128"]);
    assert_eq!(v["bench"], "tag-cost", "{v}");
    let f = v["figures"].as_object().unwrap();
    assert!(!f.is_empty(), "{v}");
    assert!(f.values().all(|x| x.is_number()), "{v}");
}

#[test]
fn gateway_restart_ends_with_its_figures_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let v = last_json(&[
        "gateway-restart",
        "-n",
        "2000",
        "--rounds",
        "1",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(v["bench"], "gateway-restart", "{v}");
    assert_eq!(v["figures"]["orders"], 2000, "{v}");
    assert!(v["figures"]["records"].as_u64().unwrap() >= 2000, "{v}");
    assert!(
        v["figures"]["replay_warm_seconds"].as_f64().unwrap() > 0.0,
        "{v}"
    );
}
