//! `rocebus keygen`: random keys the configs accept.

use std::process::Command;

fn keygen(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rocebus"))
        .arg("keygen")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn keygen_prints_a_fresh_key_the_checks_accept() {
    let a = keygen(&[]);
    assert!(a.status.success());
    let a = String::from_utf8(a.stdout).unwrap();
    let a = a.trim();
    assert_eq!(a.len(), 64, "{a}");
    assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
    assert_eq!(rocebus::auth::check_secret(a), Ok(()));
    let b = String::from_utf8(keygen(&[]).stdout).unwrap();
    assert_ne!(a, b.trim());
    let short = String::from_utf8(keygen(&["--bits", "128"]).stdout).unwrap();
    assert_eq!(short.trim().len(), 32);
    assert_eq!(rocebus::auth::check_secret(short.trim()), Ok(()));
    assert!(!keygen(&["--bits", "64"]).status.success());
    assert!(!keygen(&["--bits", "130"]).status.success());
}
