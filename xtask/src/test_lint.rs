//! A test never passes by returning early: one that returns before checking anything (an
//! environment variable absent, a tool not installed) is counted as passed by every runner
//! and proves nothing. Child-process entry points are `#[ignore]`d and fail when run
//! alone; tests that lack a tool fail and say how to get it.
//!
//! The check is static, over every `#[test]` function of the workspace: a `return` among
//! the first lines of its body is reported. A role split that returns after its checks
//! (guest 0 of a two-host test, which checked its side inside the helper it called) says
//! so on the line: `return; // checked: ...`.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// Lines of a test's body looked at: where a guard that skips the test stands.
const GUARD_LINES: usize = 6;

/// `file:line: fn name` of each test in `text` that returns early.
pub(crate) fn early_returns(rel: &Path, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() != "#[test]" {
            continue;
        }
        let Some(f) = (i + 1..lines.len()).find(|&j| {
            let t = lines[j].trim_start();
            t.starts_with("fn ") || t.starts_with("pub fn ") || t.starts_with("async fn ")
        }) else {
            continue;
        };
        let body = &lines[f + 1..lines.len().min(f + 1 + GUARD_LINES)];
        for (k, b) in body.iter().enumerate() {
            if b.contains("// checked:") {
                continue;
            }
            let code = b.split("//").next().unwrap_or("");
            if code
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|w| w == "return")
                && !code.contains("return Ok")
            {
                found.push(format!(
                    "{}:{}: {}",
                    rel.display(),
                    f + 2 + k,
                    lines[f].trim()
                ));
                break;
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let e = e?;
        let p = e.path();
        if e.file_type()?.is_dir() {
            let name = e.file_name();
            if name != "target" && name != ".git" && name != "vendor" {
                rust_files(&p, out)?;
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// Every test of the workspace at `root` that returns early.
pub(crate) fn scan(root: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    rust_files(root, &mut files)?;
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).with_context(|| format!("read {}", f.display()))?;
        let rel = f.strip_prefix(root).unwrap_or(&f);
        if rel == Path::new(file!()) {
            continue; // this lint's own test cases
        }
        found.extend(early_returns(rel, &text));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_test_in_the_workspace_returns_early() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let found = scan(&root).unwrap();
        assert!(found.is_empty(), "{}", found.join("\n"));
    }

    #[test]
    fn the_shapes_that_passed_without_checking_are_found() {
        let child = "#[test]\nfn kill9_child() {\n    let Ok(spec) = std::env::var(\"X\") else {\n        return;\n    };\n}\n";
        assert_eq!(
            early_returns(Path::new("t.rs"), child),
            vec!["t.rs:4: fn kill9_child() {"]
        );
        let skip = "#[test]\nfn wire() {\n    if !have(\"tshark\") {\n        println!(\"SKIPPED\");\n        return;\n    }\n}\n";
        assert_eq!(early_returns(Path::new("t.rs"), skip).len(), 1);
        let role = "#[test]\nfn two() {\n    let Some(r) = two_hosts() else {\n        return; // checked: guest 0 in two_hosts\n    };\n}\n";
        assert!(early_returns(Path::new("t.rs"), role).is_empty());
        let fine = "#[test]\nfn t() -> Result<(), E> {\n    let x = f()?;\n    // return early? no\n    return Ok(());\n}\n#[test]\nfn u() {\n    let r = (0..3).map(|i| i + 1);\n}\n";
        assert!(early_returns(Path::new("t.rs"), fine).is_empty());
    }
}
