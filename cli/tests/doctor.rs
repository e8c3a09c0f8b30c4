//! `rocebus doctor` as a binary: its exit code and JSON over a fake soft-RoCE tree, and
//! (in the guest) over the real one.

use std::path::Path;
use std::process::Command;

fn doctor(args: &[&str], path: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rocebus"))
        .arg("doctor")
        .args(args)
        .env("PATH", path)
        .output()
        .expect("run rocebus doctor");
    (
        out.status.code(),
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, format!("{text}\n")).unwrap();
}

/// A soft-RoCE guest's tree, reduced to what the checks read.
fn rxe_tree(root: &Path) {
    let port = "sys/class/infiniband/rxe0/ports/1";
    write(root, "sys/class/infiniband/rxe0/parent", "eth0");
    write(root, &format!("{port}/state"), "4: ACTIVE");
    write(root, &format!("{port}/link_layer"), "Ethernet");
    for (i, gid) in [
        "fe80:0000:0000:0000:5054:00ff:fe12:3401",
        "0000:0000:0000:0000:0000:ffff:c612:0001",
    ]
    .iter()
    .enumerate()
    {
        write(root, &format!("{port}/gids/{i}"), gid);
        write(root, &format!("{port}/gid_attrs/types/{i}"), "RoCE v2");
        write(root, &format!("{port}/gid_attrs/ndevs/{i}"), "eth0");
    }
    write(root, "sys/class/net/eth0/mtu", "1500");
    write(root, "sys/devices/system/cpu/online", "0-1");
    write(
        root,
        "proc/self/limits",
        "Max locked memory         unlimited            unlimited            bytes",
    );
}

fn statuses(json: &serde_json::Value, check: &str) -> Vec<String> {
    json["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["check"] == check)
        .map(|c| c["status"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn doctor_exit_code_and_json_over_a_fake_rxe_tree() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    rxe_tree(root);
    let sys = root.join("sys");
    let proc = root.join("proc");
    let (sys_s, proc_s) = (sys.to_str().unwrap(), proc.to_str().unwrap());
    let no_tools = root.join("bin");
    std::fs::create_dir_all(&no_tools).unwrap();
    let roots = ["--sysfs-root", sys_s, "--procfs-root", proc_s];

    // Nothing fails on an honest rxe host: exit 0, warnings for what it cannot show.
    let (code, out, err) = doctor(&[&roots[..], &["--json"]].concat(), &no_tools);
    assert_eq!(code, Some(0), "{out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["fail"], 0, "{out}");
    assert_eq!(statuses(&json, "port_state"), ["pass"]);
    assert_eq!(statuses(&json, "pfc"), ["warn"]);

    // A config pinning a core the host does not have, bound to an address with no GID:
    // exit 1, and the text report says why and what to do.
    let cfg = root.join("gw.toml");
    std::fs::write(&cfg, "[service]\ncore = 7\nlisten = \"198.18.0.9:7470\"\n").unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let (code, out, err) = doctor(&[&roots[..], &["--config", cfg_s]].concat(), &no_tools);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains("FAIL isolated_cores core 7: pinned by"),
        "{out}"
    );
    assert!(out.contains("FAIL config_address 198.18.0.9:"), "{out}");
    assert!(out.contains("fix: pin to an online core"), "{out}");

    // A config that cannot be read is an error, not a report.
    let (code, _, err) = doctor(
        &[&roots[..], &["--config", "/nonexistent.toml"]].concat(),
        &no_tools,
    );
    assert_eq!(code, Some(1));
    assert!(
        err.contains("cannot read config /nonexistent.toml"),
        "{err}"
    );
}

#[test]
#[ignore = "rdma: runs rocebus doctor on the soft-RoCE guest's real /sys and /proc"]
fn rdma_doctor_reports_rxe_honestly() {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let (code, out, err) = doctor(&["--json"], Path::new(&path));
    eprintln!("{out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON report");
    let find = |check: &str| -> Vec<&serde_json::Value> {
        json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["check"] == check)
            .collect()
    };
    // The device is found, is software, and its port is ACTIVE.
    let dev = find("rdma_device");
    assert!(
        dev.iter()
            .any(|d| d["subject"].as_str().unwrap().starts_with("rxe")
                && d["status"] == "pass"
                && d["detail"].as_str().unwrap().contains("software device")),
        "{out}"
    );
    let port = find("port_state");
    assert!(
        port.iter()
            .any(|p| p["status"] == "pass" && p["detail"].as_str().unwrap().contains("ACTIVE")),
        "{out}"
    );
    // The GID table is read with types: rxe has RoCE v2 entries only.
    let gid = find("gid_table");
    assert!(
        gid.iter().any(|g| g["status"] == "pass"
            && g["detail"].as_str().unwrap().contains("RoCE v2")
            && !g["detail"].as_str().unwrap().contains("RoCE v1")),
        "{out}"
    );
    // rxe shows no PFC or ECN state: warned, not failed.
    for check in ["pfc", "ecn"] {
        let f = find(check);
        assert!(!f.is_empty(), "no {check} finding: {out}");
        assert!(f.iter().all(|x| x["status"] == "warn"), "{check}: {out}");
    }
    assert_eq!(json["fail"], 0, "{out}");
    assert_eq!(code, Some(0), "{out}{err}");
}
