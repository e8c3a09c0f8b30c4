//! GID selection over fake sysfs trees modelled on real mlx5 and rxe ports.

use super::*;
use std::net::Ipv4Addr;

const ZERO: &str = "0000:0000:0000:0000:0000:0000:0000:0000";
const LL: &str = "fe80:0000:0000:0000:0e42:a1ff:fe2b:0c5e";
const A1: &str = "0000:0000:0000:0000:0000:ffff:c612:0001"; // 198.18.0.1
const A2: &str = "0000:0000:0000:0000:0000:ffff:c613:0001"; // 198.19.0.1
const V1: &str = "IB/RoCE v1\n";
const V2: &str = "RoCE v2\n";

/// One slot: GID text, and the type and netdev files (absent for unused
/// slots, which real kernels answer with EINVAL).
type Slot = (&'static str, Option<&'static str>, Option<&'static str>);

fn tree(dev: &str, slots: &[Slot]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let base = root
        .path()
        .join("class/infiniband")
        .join(dev)
        .join("ports/1");
    for d in ["gids", "gid_attrs/types", "gid_attrs/ndevs"] {
        fs::create_dir_all(base.join(d)).unwrap();
    }
    for (i, (gid, ty, ndev)) in slots.iter().enumerate() {
        fs::write(base.join("gids").join(i.to_string()), format!("{gid}\n")).unwrap();
        if let Some(t) = ty {
            fs::write(base.join("gid_attrs/types").join(i.to_string()), t).unwrap();
        }
        if let Some(n) = ndev {
            fs::write(base.join("gid_attrs/ndevs").join(i.to_string()), n).unwrap();
        }
    }
    root
}

/// mlx5 (ConnectX): every address twice, v1 then v2; link-local first;
/// two IPv4 addresses; the rest of the 16 slots unused.
fn mlx5() -> (tempfile::TempDir, GidTable) {
    let n = Some("ens1f0\n");
    let mut slots: Vec<Slot> = vec![
        (LL, Some(V1), n),
        (LL, Some(V2), n),
        (A1, Some(V1), n),
        (A1, Some(V2), n),
        (A2, Some(V1), n),
        (A2, Some(V2), n),
    ];
    slots.resize(16, (ZERO, None, None));
    let root = tree("mlx5_0", &slots);
    let t = GidTable::read_sysfs(root.path(), "mlx5_0", 1).unwrap();
    (root, t)
}

/// rxe (soft-RoCE): one RoCE v2 entry per address.
fn rxe(extra: bool) -> (tempfile::TempDir, GidTable) {
    let n = Some("eth0\n");
    let mut slots: Vec<Slot> = vec![(LL, Some(V2), n), (A1, Some(V2), n)];
    if extra {
        slots.push((A2, Some(V2), n));
    }
    slots.resize(32, (ZERO, None, None));
    let root = tree("rxe0", &slots);
    let t = GidTable::read_sysfs(root.path(), "rxe0", 1).unwrap();
    (root, t)
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

/// What `Context::default_gid_index` did before: the first IPv4-mapped GID.
fn old_rule(t: &GidTable) -> &GidEntry {
    t.entries.iter().find(|e| e.gid.ipv4().is_some()).unwrap()
}

#[test]
fn reads_mlx5_tree_skipping_unused_slots() {
    let (_r, t) = mlx5();
    assert_eq!(t.entries.len(), 6);
    assert_eq!(t.entries[2].gid.ipv4(), Some(Ipv4Addr::new(198, 18, 0, 1)));
    assert_eq!(t.entries[2].gid_type, GidType::RoceV1);
    assert_eq!(t.entries[3].gid_type, GidType::RoceV2);
    assert_eq!(t.entries[3].netdev.as_deref(), Some("ens1f0"));
}

#[test]
fn old_rule_picks_roce_v1_on_mlx5_and_new_default_picks_v2() {
    let (_r, t) = mlx5();
    let old = old_rule(&t);
    assert_eq!((old.index, &old.gid_type), (2, &GidType::RoceV1));
    let c = select_gid(&t, &GidPolicy::default()).unwrap();
    assert_eq!((c.index(), &c.entry.gid_type), (3, &GidType::RoceV2));
    assert!(!c.explicit);
}

#[test]
fn mlx5_by_local_ip_picks_that_address_v2_entry() {
    let (_r, t) = mlx5();
    let p = |a| GidPolicy {
        local_ip: ip(a),
        ..GidPolicy::default()
    };
    assert_eq!(select_gid(&t, &p("198.18.0.1")).unwrap().index(), 3);
    assert_eq!(select_gid(&t, &p("198.19.0.1")).unwrap().index(), 5);
    assert_eq!(
        select_gid(&t, &p("fe80::e42:a1ff:fe2b:c5e"))
            .unwrap()
            .index(),
        1
    );
}

#[test]
fn mlx5_by_netdev_picks_first_ipv4_v2_entry() {
    let (_r, t) = mlx5();
    let p = GidPolicy {
        netdev: Some("ens1f0".into()),
        ..GidPolicy::default()
    };
    assert_eq!(select_gid(&t, &p).unwrap().index(), 3);
    let wrong = GidPolicy {
        netdev: Some("ens1f1".into()),
        ..GidPolicy::default()
    };
    let e = select_gid(&t, &wrong).unwrap_err().to_string();
    assert!(e.contains("netdev ens1f1"), "{e}");
}

#[test]
fn allowing_v1_still_prefers_v2() {
    let (_r, t) = mlx5();
    let p = GidPolicy {
        local_ip: ip("198.19.0.1"),
        allow_roce_v1: true,
        ..GidPolicy::default()
    };
    assert_eq!(select_gid(&t, &p).unwrap().index(), 5);
}

#[test]
fn v1_only_table_is_refused_unless_allowed() {
    let n = Some("eth2\n");
    let root = tree(
        "mlx4_0",
        &[(LL, Some(V1), n), (A1, Some(V1), n), (ZERO, None, None)],
    );
    let t = GidTable::read_sysfs(root.path(), "mlx4_0", 1).unwrap();
    let e = select_gid(&t, &GidPolicy::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("RoCE v2") && e.contains("[1] ::ffff:198.18.0.1 RoCE v1 eth2"),
        "{e}"
    );
    let p = GidPolicy {
        allow_roce_v1: true,
        ..GidPolicy::default()
    };
    assert_eq!(select_gid(&t, &p).unwrap().index(), 1);
}

#[test]
fn rxe_default_is_index_1() {
    let (_r, t) = rxe(false);
    assert_eq!(t.entries.len(), 2);
    let c = select_gid(&t, &GidPolicy::default()).unwrap();
    assert_eq!(c.index(), 1);
    assert_eq!(
        c.to_string(),
        "rxe0 port 1 gid_index 1 gid ::ffff:198.18.0.1 RoCE v2 netdev eth0"
    );
}

#[test]
fn rxe_with_a_second_address_selects_by_local_ip() {
    let (_r, t) = rxe(true);
    let p = GidPolicy {
        local_ip: ip("198.19.0.1"),
        ..GidPolicy::default()
    };
    assert_eq!(select_gid(&t, &p).unwrap().index(), 2);
    // Without an address the first IPv4 entry still wins.
    assert_eq!(select_gid(&t, &GidPolicy::default()).unwrap().index(), 1);
}

#[test]
fn absent_address_is_an_error_listing_the_table() {
    let (_r, t) = mlx5();
    let p = GidPolicy {
        local_ip: ip("10.0.0.1"),
        ..GidPolicy::default()
    };
    let e = select_gid(&t, &p).unwrap_err();
    assert!(matches!(e, GidError::NoMatch { .. }));
    let msg = e.to_string();
    assert!(msg.contains("address 10.0.0.1, RoCE v2"), "{msg}");
    assert!(
        msg.contains("[3] ::ffff:198.18.0.1 RoCE v2 ens1f0"),
        "{msg}"
    );
    assert!(
        msg.contains("[4] ::ffff:198.19.0.1 RoCE v1 ens1f0"),
        "{msg}"
    );
}

#[test]
fn explicit_index_wins_and_is_validated() {
    let (_r, t) = mlx5();
    let p = |i, v1| GidPolicy {
        local_ip: ip("198.18.0.1"),
        gid_index: Some(i),
        allow_roce_v1: v1,
        ..GidPolicy::default()
    };
    let c = select_gid(&t, &p(3, false)).unwrap();
    assert_eq!((c.index(), c.explicit), (3, true));
    let e = select_gid(&t, &p(5, false)).unwrap_err();
    assert!(
        matches!(e, GidError::AddressMismatch { index: 5, .. }),
        "{e}"
    );
    let no_ip = GidPolicy {
        gid_index: Some(5),
        ..GidPolicy::default()
    };
    assert_eq!(select_gid(&t, &no_ip).unwrap().index(), 5);
    assert!(matches!(
        select_gid(&t, &p(2, false)),
        Err(GidError::NotRoceV2 { index: 2, .. })
    ));
    assert_eq!(select_gid(&t, &p(2, true)).unwrap().index(), 2);
    let e = select_gid(&t, &p(7, false)).unwrap_err();
    assert!(
        matches!(e, GidError::IndexNotInTable { index: 7, .. }),
        "{e}"
    );
}

#[test]
fn connection_index_may_change_the_type_not_the_address() {
    let (_r, t) = mlx5();
    // rdma_cm resolved 198.18.0.1 to its v1 entry (default_roce_mode v1).
    assert_eq!(check_connection_index(&t, 3, 2).unwrap().index(), 3);
    assert!(matches!(
        check_connection_index(&t, 2, 3),
        Err(GidError::NotRoceV2 { index: 2, .. })
    ));
    let e = check_connection_index(&t, 5, 3).unwrap_err();
    assert!(
        matches!(e, GidError::AddressMismatch { index: 5, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("::ffff:198.18.0.1"), "{e}");
}

#[test]
fn entry_without_type_file_is_not_taken_as_v2() {
    let root = tree("old0", &[(A1, None, Some("eth0\n"))]);
    let t = GidTable::read_sysfs(root.path(), "old0", 1).unwrap();
    assert_eq!(t.entries[0].gid_type, GidType::Unknown);
    assert!(select_gid(&t, &GidPolicy::default()).is_err());
}

#[test]
fn missing_device_is_a_read_error() {
    let root = tempfile::tempdir().unwrap();
    let e = GidTable::read_sysfs(root.path(), "mlx5_9", 1).unwrap_err();
    assert!(matches!(e, GidError::ReadTable { port: 1, .. }), "{e}");
}

#[test]
fn type_text_parses() {
    assert_eq!(GidType::parse("IB/RoCE v1\n"), GidType::RoceV1);
    assert_eq!(GidType::parse("RoCE v2\n"), GidType::RoceV2);
    assert_eq!(GidType::parse("\n"), GidType::Unknown);
    assert_eq!(GidType::parse("x"), GidType::Other("x".into()));
}

#[test]
fn one_entry_reads_like_the_table() {
    let (r, t) = mlx5();
    let e = GidTable::read_sysfs_entry(r.path(), "mlx5_0", 1, 3).unwrap();
    assert_eq!(e, t.entries[3]);
    assert_eq!(GidTable::read_sysfs_entry(r.path(), "mlx5_0", 1, 9), None);
}

/// Issue 43: no `gid_index` configured and rdma_cm bound the connection to a RoCE v1 entry
/// (mlx5 lists every address twice, v1 first): the connection sends from the v2 entry of
/// the same address; an address with no v2 entry is refused, naming the table. Before, the
/// v1 entry was used with a warning.
#[test]
fn a_connection_rdma_cm_bound_to_a_roce_v1_gid_sends_from_that_address_v2_entry() {
    let (_r, t) = mlx5();
    for (resolved, want) in [(2, 3), (3, 3), (4, 5), (0, 1)] {
        let e = connection_default_entry(&t, resolved).unwrap();
        assert_eq!(
            (e.index, &e.gid_type),
            (want, &GidType::RoceV2),
            "{resolved}"
        );
    }
    let (_r, x) = rxe(true);
    assert_eq!(connection_default_entry(&x, 2).unwrap().index, 2);
    let n = Some("ens1f1\n");
    let root = tree(
        "mlx5_1",
        &[(LL, Some(V1), n), (A1, Some(V1), n), (A2, Some(V2), n)],
    );
    let v1_only = GidTable::read_sysfs(root.path(), "mlx5_1", 1).unwrap();
    let e = connection_default_entry(&v1_only, 1).unwrap_err();
    assert!(
        matches!(e, GidError::NoRoceV2ForAddress { index: 1, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("gid_index"), "{e}");
    assert!(matches!(
        connection_default_entry(&v1_only, 7),
        Err(GidError::IndexNotInTable { index: 7, .. })
    ));
}
