//! `feed-handler book` and `feed-handler bbo` as a user runs them: help, output on a small
//! generated day, and the errors for a bad file, a bad time and an unknown symbol.

use feed_handler::generate::{generate_binaryfile, GenConfig};
use feed_handler::inspect;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn feed_handler(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_feed-handler"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run feed-handler")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn small_day(dir: &Path) -> (PathBuf, Vec<u8>) {
    let (bytes, _) = generate_binaryfile(&GenConfig {
        seed: 5,
        messages: 5_000,
        symbols: 4,
    });
    let path = dir.join("day.itch50");
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

#[test]
fn book_and_bbo_help_explain() {
    let text = String::from_utf8(feed_handler(&["book", "--help"]).stdout).unwrap();
    for word in [
        "--symbol",
        "--depth",
        "--at",
        "HH:MM:SS.nnnnnnnnn",
        "best first",
        "nanoseconds since midnight",
    ] {
        assert!(text.contains(word), "`book --help` lacks {word}:\n{text}");
    }
    let text = String::from_utf8(feed_handler(&["bbo", "--help"]).stdout).unwrap();
    for word in [
        "--output",
        inspect::BBO_HEADER,
        "4 places",
        "empty",
        "stderr",
    ] {
        assert!(text.contains(word), "`bbo --help` lacks {word}:\n{text}");
    }
    let text = String::from_utf8(feed_handler(&["--help"]).stdout).unwrap();
    assert!(text.contains("book") && text.contains("bbo"), "{text}");
}

#[test]
fn book_and_bbo_on_a_generated_day() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes) = small_day(dir.path());
    let file = path.to_str().unwrap();

    let out = feed_handler(&[
        "book",
        file,
        "--symbol",
        "B",
        "--depth",
        "3",
        "--at",
        "09:30:00.1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let at = inspect::parse_time_of_day("09:30:00.1").unwrap();
    let expected = inspect::book_at(&bytes[..], Some(at)).unwrap();
    let mut body = Vec::new();
    inspect::write_book(&mut body, &expected.book, inspect::Symbols::Named("B"), 3).unwrap();
    let body = String::from_utf8(body).unwrap();
    assert!(body.starts_with("B (locate 2): "), "{body}");
    assert!(text.ends_with(&body), "{text}");
    assert!(
        text.starts_with('#') && text.contains(&format!("after {} messages", expected.applied)),
        "{text}"
    );

    // All symbols at the end of the file.
    let out = feed_handler(&["book", file]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("A (locate 1)") && text.contains("D (locate 4)"),
        "{text}"
    );

    // bbo: -o writes the file, stdout by default, both as the library writes them.
    let mut expected = Vec::new();
    inspect::write_bbo(&bytes[..], None, &mut expected, |_| {}).unwrap();
    let csv = dir.path().join("bbo.csv");
    let out = feed_handler(&["bbo", file, "-o", csv.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    assert_eq!(std::fs::read(&csv).unwrap(), expected);
    let out = feed_handler(&["bbo", file]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, expected);
    assert!(String::from_utf8(expected).unwrap().lines().count() > 100);
}

#[test]
fn book_and_bbo_errors_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = small_day(dir.path());
    let file = path.to_str().unwrap();
    let text_file = dir.path().join("notes.txt");
    std::fs::write(&text_file, "these are not ITCH messages\n").unwrap();
    let text_file = text_file.to_str().unwrap();
    let missing = dir.path().join("missing.itch50");
    let missing = missing.to_str().unwrap();
    let csv = dir.path().join("out.csv");

    let cases: &[(&[&str], &[&str])] = &[
        (&["book", missing], &["cannot read", "missing.itch50"]),
        (&["bbo", missing], &["cannot read", "missing.itch50"]),
        (
            &["book", text_file],
            &["no ITCH message", "notes.txt", "BinaryFILE"],
        ),
        (
            &["bbo", text_file, "-o", csv.to_str().unwrap()],
            &["no ITCH message", "notes.txt"],
        ),
        (
            &["book", file, "--at", "9:30"],
            &["9:30", "HH:MM:SS.nnnnnnnnn"],
        ),
        (
            &["book", file, "--at", "09:30:00.1234567890"],
            &["HH:MM:SS.nnnnnnnnn"],
        ),
        (&["book", file, "--at", "25:00:00"], &["HH:MM:SS.nnnnnnnnn"]),
        (
            &["book", file, "--symbol", "NOPE"],
            &["unknown symbol \"NOPE\"", "A, B, C, D"],
        ),
        // The stock directory comes at 04:00: before it no symbol is known.
        (
            &["book", file, "--symbol", "A", "--at", "01:00:00"],
            &["unknown symbol \"A\"", "up to 01:00:00.000000000"],
        ),
        (&["book", file, "--depth", "0"], &["--depth"]),
    ];
    for (args, words) in cases {
        let out = feed_handler(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        for w in *words {
            assert!(err.contains(w), "{args:?}: stderr lacks {w:?}:\n{err}");
        }
        assert!(!err.contains("panicked"), "{args:?}:\n{err}");
    }
    // A rejected file leaves no half-written output behind.
    assert!(!csv.exists());
}

/// `bbo` rows carry the symbol beside the stock locate, on files written by other
/// implementations (tests/data/itch): each row's symbol is the one the file's Stock Directory
/// message gave its locate.
#[test]
fn bbo_rows_carry_the_symbol_on_the_itch_fixtures() {
    use feed_handler::binaryfile::Reader;
    use feed_handler::itch::Message;
    use std::collections::BTreeMap;

    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/itch");
    for (file, symbols) in [
        ("sample.itch50", Some(&["MEAT", "PYTH"][..])),
        ("ex20101224.TEST_ITCH_50", None),
    ] {
        let path = data.join(file);
        let bytes = std::fs::read(&path).unwrap();
        // The file's own directory: locate → symbol.
        let mut directory = BTreeMap::new();
        for m in Reader::new(&bytes).unwrap().flatten() {
            if let Message::StockDirectory(d) = m {
                directory.insert(
                    m.header().stock_locate.get(),
                    d.stock.as_str().unwrap().to_owned(),
                );
            }
        }
        assert!(!directory.is_empty(), "{file}: no stock directory");
        let out = feed_handler(&["bbo", path.to_str().unwrap()]);
        assert!(out.status.success(), "{file}: {}", stderr(&out));
        let csv = String::from_utf8(out.stdout).unwrap();
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some(inspect::BBO_HEADER), "{file}");
        assert!(inspect::BBO_HEADER.starts_with("locate,symbol,timestamp,"));
        let mut seen = std::collections::BTreeSet::new();
        let mut rows = 0;
        for row in lines {
            let f: Vec<&str> = row.split(',').collect();
            assert_eq!(f.len(), 9, "{file}: {row}");
            let locate: u16 = f[0].parse().unwrap();
            assert_eq!(
                Some(f[1]),
                directory.get(&locate).map(String::as_str),
                "{file}: {row}"
            );
            seen.insert(f[1].to_owned());
            rows += 1;
        }
        assert!(rows > 0, "{file}: no rows");
        if let Some(symbols) = symbols {
            assert_eq!(seen.iter().map(String::as_str).collect::<Vec<_>>(), symbols);
        }
    }
}
