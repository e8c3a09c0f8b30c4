//! The crate's top-level modules import each other without cycles: a module that uses
//! another (directly or through a chain) is never used by it in return, so each can be read,
//! tested and changed with only what is below it in mind (an item two modules share lives
//! in the one that owns it, or in a small module of its own).
//!
//! Reads the crate's own `src/**/*.rs` (tests and test-only modules included: a test that
//! reaches back up is a cycle too), builds the graph of `crate::` paths between top-level
//! modules (`src/x.rs` and `src/x/` are module `x`; `lib.rs` and `main.rs` are the roots
//! and are left out) and fails naming the cycle and where each of its imports is. Comment
//! lines are ignored, so doc links do not count. Paths between top-level modules are written
//! `crate::…` in this crate (a `super::super::` that climbs out of its module is not seen).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module -> module it imports -> the first place it does (`file:line`).
type Graph = BTreeMap<String, BTreeMap<String, String>>;

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = import_graph(&src);
    let edges: usize = graph.values().map(BTreeMap::len).sum();
    // A parser that finds nothing would pass whatever the code says.
    assert!(
        graph.len() >= 5 && edges >= 5,
        "found only {} modules and {edges} imports in {}: the scan is broken",
        graph.len(),
        src.display()
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("{}", describe(&graph, &cycle));
    }
}

#[test]
fn a_cycle_is_found_and_named() {
    let mut g = Graph::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        g.entry(a.into())
            .or_default()
            .insert(b.into(), format!("{a}.rs:1"));
        g.entry(b.into()).or_default();
    }
    let cycle = find_cycle(&g).expect("a -> b -> c -> a");
    assert_eq!(cycle.len(), 3);
    let text = describe(&g, &cycle);
    assert!(text.contains("a -> b -> c -> a"), "{text}");
    g.get_mut("c").unwrap().remove("a");
    assert_eq!(find_cycle(&g), None);
}

#[test]
fn imports_are_read_from_use_lines_groups_and_paths() {
    let modules: BTreeSet<String> = ["config", "driver", "fix", "risk"]
        .into_iter()
        .map(String::from)
        .collect();
    let text = "\
//! [`crate::risk`] in a doc comment is no import
use crate::fix::SessionConfig;
use crate::{
    driver::Link,
    proto::Symbol,
};
fn f() { let _ = crate::risk::RiskEngine::new(); let s = \"http://x\"; } // crate::config
macro_rules! m { () => { $crate::config::X } }
";
    let mut found = BTreeMap::new();
    scan(text, "config", "x.rs", &modules, &mut found);
    let got: Vec<(&str, &str)> = found
        .iter()
        .map(|(m, at)| (m.as_str(), at.as_str()))
        .collect();
    assert_eq!(
        got,
        [("driver", "x.rs:4"), ("fix", "x.rs:2"), ("risk", "x.rs:7")]
    );
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn import_graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let top = |path: &Path| -> Option<String> {
        let first = path.strip_prefix(src).ok()?.components().next()?;
        let name = first.as_os_str().to_str()?;
        let name = name.strip_suffix(".rs").unwrap_or(name);
        (name != "lib" && name != "main").then(|| name.to_owned())
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top(f)).collect();
    let mut graph: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeMap::new()))
        .collect();
    for file in &files {
        let Some(module) = top(file) else { continue };
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let shown = file.strip_prefix(src).unwrap_or(file).display().to_string();
        let found = graph.get_mut(&module).expect("every module has an entry");
        scan(&text, &module, &format!("src/{shown}"), &modules, found);
    }
    graph
}

/// Adds to `found` the modules of `modules` (other than `module`) that `text` names as
/// `crate::m` or inside `crate::{...}`, with the first place each is named.
fn scan(
    text: &str,
    module: &str,
    file: &str,
    modules: &BTreeSet<String>,
    found: &mut BTreeMap<String, String>,
) {
    // Comment lines out, trailing comments cut; the line number of every byte kept.
    let mut code = String::new();
    let mut line_of = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = strip_comment(line);
        code.push_str(line);
        code.push('\n');
        line_of.extend(std::iter::repeat_n(n + 1, line.len() + 1));
    }
    let bytes = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut note = |name: &str, at: usize| {
        if name != module && modules.contains(name) {
            found
                .entry(name.to_owned())
                .or_insert_with(|| format!("{file}:{}", line_of[at]));
        }
    };
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::").map(|i| i + from) {
        from = i + "crate::".len();
        if i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == b'$') {
            continue; // `$crate::`, `my_crate::`
        }
        let rest = &code[from..];
        if rest.starts_with('{') {
            // A group: the first name of each of its top-level entries.
            let (mut depth, mut start) = (0usize, true);
            for (j, c) in rest.char_indices() {
                match c {
                    '{' => {
                        depth += 1;
                        start = depth == 1;
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => start = true,
                    c if start && (c.is_ascii_alphabetic() || c == '_') => {
                        let len = rest[j..].bytes().take_while(|&b| ident(b)).count();
                        note(&rest[j..j + len], from + j);
                        start = false;
                    }
                    c if c.is_whitespace() => {}
                    _ => start = false,
                }
            }
        } else {
            let len = rest.bytes().take_while(|&b| ident(b)).count();
            note(&rest[..len], i);
        }
    }
}

/// `line` without a `//` comment (outside string literals).
fn strip_comment(line: &str) -> &str {
    let b = line.as_bytes();
    let mut in_str = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if in_str => i += 1,
            // A quote as a char literal opens no string.
            b'\'' if !in_str && b.get(i + 1) == Some(&b'"') && b.get(i + 2) == Some(&b'\'') => {
                i += 2
            }
            b'"' => in_str = !in_str,
            b'/' if !in_str && b.get(i + 1) == Some(&b'/') => return &line[..i],
            _ => {}
        }
        i += 1;
    }
    line
}

/// A cycle of the graph (its modules in order), if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    fn visit<'g>(
        g: &'g Graph,
        m: &'g str,
        marks: &mut BTreeMap<&'g str, Mark>,
        path: &mut Vec<&'g str>,
    ) -> Option<Vec<String>> {
        marks.insert(m, Mark::OnPath);
        path.push(m);
        for next in g.get(m).into_iter().flat_map(BTreeMap::keys) {
            match marks.get(next.as_str()).copied().unwrap_or(Mark::New) {
                Mark::OnPath => {
                    let at = path.iter().position(|p| *p == next).expect("on the path");
                    return Some(path[at..].iter().map(|s| s.to_string()).collect());
                }
                Mark::New => {
                    if let Some(c) = visit(g, next, marks, path) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(m, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for m in graph.keys() {
        if marks.get(m.as_str()).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(graph, m, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn describe(graph: &Graph, cycle: &[String]) -> String {
    let mut names: Vec<&str> = cycle.iter().map(String::as_str).collect();
    names.push(&cycle[0]);
    let mut text = format!(
        "import cycle between top-level modules: {}\n(move what they share down into the \
         module that owns it, or into a small module of its own)\n",
        names.join(" -> ")
    );
    for pair in names.windows(2) {
        let at = &graph[pair[0]][pair[1]];
        text.push_str(&format!("  {} -> {}: {at}\n", pair[0], pair[1]));
    }
    text
}
