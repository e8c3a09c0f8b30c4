use super::*;

fn parse(text: &str) -> Result<RdmaSettings, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        rdma: RdmaSettings,
    }
    toml::from_str::<File>(&format!("[rdma]\n{text}"))
        .map(|f| f.rdma)
        .map_err(|e| e.to_string())
}

fn refused(text: &str, words: &[&str]) {
    let err = parse(text).expect_err(text);
    for w in words {
        assert!(err.contains(w), "`{text}`: the error lacks {w:?}: {err}");
    }
}

#[test]
fn defaults_are_what_a_roce_v2_fabric_expects() {
    let d = parse("").unwrap();
    assert_eq!(d, RdmaSettings::default());
    assert_eq!(d.traffic_class, 106);
    assert_eq!((d.dscp(), d.ecn()), (26, 0b10), "DSCP 26, ECT(0)");
    assert_eq!(d.service_level, 0);
    assert_eq!(d.hugepages, HugePages::Auto);
    // Without keys, the path's own RC options stand but for the class.
    let base = RcOptions::default();
    assert_eq!(d.rc_options(base), base);
    assert_eq!(base.traffic_class, DEFAULT_TRAFFIC_CLASS);
}

#[test]
fn every_key_is_read_and_applied() {
    let s = parse(
        "traffic_class = 138\nservice_level = 3\npath_mtu = 2048\nack_timeout = 12\n\
         retry_count = 5\nrnr_retry = 6\nmax_inline = 128\nhugepages = \"on\"\ngid_index = 3\n",
    )
    .unwrap();
    assert_eq!((s.dscp(), s.ecn()), (34, 0b10));
    let rc = s.rc_options(RcOptions::default());
    assert_eq!(rc.traffic_class, 138);
    assert_eq!(rc.service_level, 3);
    assert_eq!(rc.path_mtu, Some(Mtu::M2048));
    assert_eq!((rc.timeout, rc.retry_count, rc.rnr_retry), (12, 5, 6));
    assert_eq!(rc.gid_index, Some(3));
    // What [rdma] does not set keeps the path's value.
    assert_eq!(rc.min_rnr_timer, RcOptions::default().min_rnr_timer);
    assert_eq!(s.max_inline, Some(128));
    assert_eq!(s.hugepages, HugePages::On);
    let ud = s.ud_class();
    assert_eq!(
        (ud.traffic_class, ud.service_level, ud.gid_index),
        (138, 3, Some(3))
    );
    assert_eq!(
        parse("hugepages = \"off\"").unwrap().hugepages,
        HugePages::Off
    );
}

#[test]
fn congestion_experienced_ecn_is_refused() {
    refused(
        "traffic_class = 107",
        &["rdma.traffic_class 107", "Congestion Experienced"],
    );
}

#[test]
fn traffic_class_above_255_is_refused() {
    refused(
        "traffic_class = 256",
        &["rdma.traffic_class 256", "0..=255"],
    );
}

#[test]
fn service_level_above_15_is_refused() {
    refused("service_level = 16", &["rdma.service_level 16", "0..=15"]);
}

#[test]
fn path_mtu_not_a_roce_mtu_is_refused() {
    refused(
        "path_mtu = 1500",
        &["rdma.path_mtu 1500", "256, 512, 1024, 2048, 4096"],
    );
}

#[test]
fn ack_timeout_above_31_is_refused() {
    refused("ack_timeout = 32", &["rdma.ack_timeout 32", "0..=31"]);
}

#[test]
fn retry_count_above_7_is_refused() {
    refused("retry_count = 8", &["rdma.retry_count 8", "0..=7"]);
}

#[test]
fn rnr_retry_above_7_is_refused() {
    refused("rnr_retry = 9", &["rdma.rnr_retry 9", "0..=7"]);
}

#[test]
fn max_inline_above_the_limit_is_refused() {
    refused("max_inline = 4096", &["rdma.max_inline 4096", "1024"]);
    // Below the handshake proof, which every connection sends inline (orders, recovery,
    // RC fan-out share the table).
    refused("max_inline = 16", &["rdma.max_inline 16", "32"]);
}

#[test]
fn gid_index_above_255_is_refused() {
    refused("gid_index = 256", &["rdma.gid_index 256", "0..=255"]);
}

#[test]
fn unknown_hugepages_value_is_refused() {
    refused("hugepages = \"yes\"", &["yes", "auto", "on", "off"]);
}

#[test]
fn misspelt_key_is_refused() {
    refused("trafic_class = 106", &["trafic_class", "traffic_class"]);
}

#[test]
fn negative_value_is_refused() {
    refused("traffic_class = -1", &["-1"]);
}

#[test]
fn from_table_reads_the_top_level_table_only() {
    let t: toml::Table = toml::from_str("[rdma]\ntraffic_class = 104\n[other]\nx = 1\n").unwrap();
    assert_eq!(RdmaSettings::from_table(&t).unwrap().traffic_class, 104);
    let t: toml::Table = toml::from_str("[other]\nx = 1\n").unwrap();
    assert_eq!(
        RdmaSettings::from_table(&t).unwrap(),
        RdmaSettings::default()
    );
    let t: toml::Table = toml::from_str("[rdma]\nservice_level = 99\n").unwrap();
    let e = RdmaSettings::from_table(&t).unwrap_err().to_string();
    assert!(e.contains("rdma.service_level 99"), "{e}");
}

#[test]
fn memlock_below_the_rings_is_an_error_naming_the_bytes_needed() {
    let e = check_memlock(Some(65536), false, 3 << 20).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("65536 bytes"), "{msg}");
    assert!(msg.contains("at least 3145728 bytes"), "{msg}");
    assert!(msg.contains("ulimit -l 3072"), "{msg}");
    assert!(
        check_memlock(Some(3 << 20), false, 3 << 20).is_ok(),
        "exactly enough"
    );
    assert!(check_memlock(None, false, u64::MAX).is_ok(), "unlimited");
    assert!(
        check_memlock(Some(0), true, 1 << 30).is_ok(),
        "CAP_IPC_LOCK pins past the limit"
    );
}

#[test]
fn stat_shows_the_gid_the_class_and_registered_memory() {
    use crate::counters::{CountersFile, CountersReader};
    use crate::verbs::{Gid, GidChoice, GidEntry, GidType};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("svc.counters");
    let file = CountersFile::create(&path, 32).unwrap();
    let gid = export::LocalGid {
        choice: GidChoice {
            device: "mlx5_0".into(),
            port: 1,
            entry: GidEntry {
                index: 3,
                gid: Gid(std::net::Ipv4Addr::new(198, 18, 0, 1)
                    .to_ipv6_mapped()
                    .octets()),
                gid_type: GidType::RoceV2,
                netdev: Some("ens1f0".into()),
            },
            explicit: true,
        },
        active_mtu: 4096,
    };
    let s = RdmaSettings {
        traffic_class: 138,
        service_level: 3,
        ..RdmaSettings::default()
    };
    let _e = export::RdmaCountersExport::new(&file, "rdma", s.ud_class(), Some(&gid)).unwrap();
    let lines: Vec<(String, u64)> = CountersReader::open(&path)
        .unwrap()
        .iter()
        .map(|e| (e.label.to_string(), e.value))
        .collect();
    let get = |l: &str| lines.iter().find(|(k, _)| k == l).map(|(_, v)| *v);
    assert_eq!(get("rdma.traffic_class"), Some(138));
    assert_eq!(get("rdma.service_level"), Some(3));
    assert_eq!(get("rdma.gid_index"), Some(3));
    assert_eq!(get("rdma.active_mtu"), Some(4096));
    assert_eq!(
        get("rdma.gid ::ffff:198.18.0.1 RoCE v2 ens1f0 mlx5_0 port 1"),
        Some(3),
        "{lines:?}"
    );
    for l in [
        "rdma.registered_bytes",
        "rdma.hugepage_bytes",
        "rdma.hugepage_fallbacks",
    ] {
        assert!(get(l).is_some(), "{l} missing: {lines:?}");
    }
}

/// Huge pages through the allocator every ring and staging area uses
/// (`SharedMemory` shares it and needs no device): `on` with none free is
/// a clear error, `auto` falls back and counts it, small mappings never ask.
/// Which branch runs depends on the host's free huge pages; both check.
#[test]
fn huge_pages_on_fails_clearly_and_auto_falls_back_when_none_are_free() {
    use crate::verbs::{registered_memory, set_huge_pages, SharedMemory, VerbsError, HUGE_PAGE};
    let free: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    set_huge_pages(HugePages::On);
    let on = SharedMemory::new(HUGE_PAGE);
    let small = SharedMemory::new(4096).expect("small mappings stay on 4 KiB pages");
    assert!(!small.is_huge());
    let before = registered_memory().huge_page_fallbacks;
    set_huge_pages(HugePages::Auto);
    let auto = SharedMemory::new(HUGE_PAGE).expect("auto never fails for want of huge pages");
    set_huge_pages(HugePages::Off);
    let off = SharedMemory::new(HUGE_PAGE).unwrap();
    assert!(!off.is_huge());
    if free == 0 {
        match on {
            Err(e @ VerbsError::HugePages { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("hugepages = \"on\"") && msg.contains("vm.nr_hugepages"),
                    "{msg}"
                );
            }
            other => panic!("no free huge pages, yet `on` gave {other:?}"),
        }
        assert!(!auto.is_huge());
        assert!(registered_memory().huge_page_fallbacks > before);
    } else {
        assert!(on.expect("free huge pages").is_huge());
    }
}

#[test]
fn a_market_data_file_carries_its_rdma_table() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/md.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let md = McastConfig::from_toml_str(&text).expect("configs/md.toml");
    assert_eq!(md.rdma.traffic_class, DEFAULT_TRAFFIC_CLASS);
    let changed = text.replace("traffic_class = 106", "traffic_class = 138");
    assert_ne!(changed, text, "configs/md.toml documents traffic_class");
    let md = McastConfig::from_toml_str(&changed).unwrap();
    assert_eq!(md.rdma.traffic_class, 138);
    // Loaders that take the table out of a bigger file keep it too.
    let v: toml::Value = toml::from_str(&changed).unwrap();
    assert_eq!(McastConfig::from_value(v).unwrap().rdma.traffic_class, 138);
    let bad = text.replace("traffic_class = 106", "traffic_class = 107");
    let e = McastConfig::from_toml_str(&bad).unwrap_err();
    let e = std::error::Error::source(&e)
        .map(|s| s.to_string())
        .unwrap_or_default();
    assert!(e.contains("rdma.traffic_class 107"), "{e}");
}
