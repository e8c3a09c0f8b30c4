//! Every `extern "C"` function of the crate is one call to `guard` (the
//! wrapper that catches a panic and returns `ROCEBUS_STATUS_PANIC`):
//! nothing before it but plain `let` bindings of its result. A new entry
//! point written without it fails here. (`guard` itself, and the handle's
//! poisoning after a panic, are tested in `src/error.rs` and `src/handle.rs`.)

use std::path::Path;

#[test]
fn every_entry_point_is_guarded() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut entry_points = 0;
    let mut unguarded = Vec::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let path = e.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let Some(at) = l.find("extern \"C\" fn ") else {
                continue;
            };
            if !l.trim_start().starts_with("pub") {
                continue; // a function pointer type, not a definition
            }
            entry_points += 1;
            let name: String = l[at + 14..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            // The body starts after the line that ends the signature.
            let open = (i..lines.len())
                .find(|&j| lines[j].trim_end().ends_with('{'))
                .unwrap();
            let body: Vec<&str> = lines[open + 1..]
                .iter()
                .map(|l| l.trim())
                .filter(|l| !l.is_empty() && !l.starts_with("//"))
                .take(3)
                .collect();
            let ok = body
                .iter()
                .take_while(|l| !l.contains("guard("))
                .all(|l| l.starts_with("let ") || l.starts_with("static "))
                && body.iter().any(|l| l.contains("guard("));
            if !ok {
                unguarded.push(format!("{}: {name}", path.display()));
            }
        }
    }
    assert!(entry_points >= 30, "found only {entry_points} entry points");
    assert!(
        unguarded.is_empty(),
        "entry points not wrapped in guard: {unguarded:#?}"
    );
}
