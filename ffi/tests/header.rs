//! `include/rocebus.h` is what cbindgen makes of the crate's source now:
//! the checked-in header cannot drift from the library it declares.
//! `ROCEBUS_BLESS=1 cargo test -p rocebus-ffi --test header` rewrites it.

use std::path::Path;

#[test]
fn the_checked_in_header_is_what_cbindgen_generates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8");
    let path = dir.join("include/rocebus.h");
    if std::env::var_os("ROCEBUS_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("writing include/rocebus.h");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/rocebus.h differs from what cbindgen generates from ffi/src: run \
         `ROCEBUS_BLESS=1 cargo test -p rocebus-ffi --test header` and commit the header"
    );
    // The declarations every C example uses are there.
    for f in [
        "rocebus_last_error",
        "rocebus_ipc_publisher_try_claim",
        "rocebus_orders_connection_poll",
    ] {
        assert!(generated.contains(f), "{f} missing from the header");
    }
}
