//! `rocebus` is what a trading engine embeds: its dependency list carries no command-line
//! or HTTP crate (the `/metrics` server lives in the `rocebus` CLI, `cli/src/http.rs`).

/// Crates a library for engines has no use for.
const FORBIDDEN: &[&str] = &[
    "clap",
    "anyhow",
    "signal-hook",
    "hyper",
    "tiny_http",
    "tiny-http",
    "axum",
    "actix-web",
    "warp",
    "prometheus",
];

#[test]
fn core_has_no_cli_or_http_dependencies() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("read core/Cargo.toml");
    let doc: toml::Table = manifest.parse().expect("core/Cargo.toml parses");
    let mut found = Vec::new();
    for section in ["dependencies", "build-dependencies"] {
        if let Some(deps) = doc.get(section).and_then(|d| d.as_table()) {
            for name in deps.keys() {
                if FORBIDDEN.contains(&name.as_str()) {
                    found.push(format!("[{section}] {name}"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "core/Cargo.toml declares CLI/HTTP crates: {found:?}"
    );
}
