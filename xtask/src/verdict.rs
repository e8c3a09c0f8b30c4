//! The lines a benchmark ends with (`NAME: p50 ratio X, p99 ratio Y`, `NAME: ratio X`, ...),
//! printed as they come and kept for `cargo xtask bench --json`, whose last line is one
//! JSON object holding them and the figures read from them:
//!
//! ```json
//! {"bench": "rc-latency", "lines": ["rc-latency: p50 ratio 1.02, p99 ratio 1.01"],
//!  "figures": {"rc-latency": {"p50 ratio": 1.02, "p99 ratio": 1.01}}}
//! ```
//!
//! A line is `HEAD: ITEM, ITEM, ...` (a remark in parentheses ignored); an item's figure is
//! its first number, named by the words before it (`p50 ratio 1.02`: `p50 ratio`;
//! `rocebus 6135`: `rocebus`) or, first, after it (`2 subscribers`: `subscribers`). A head
//! seen before gets a number (`md-repair (2)`).

use std::sync::Mutex;

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Prints one of the benchmark's closing lines and keeps it for [`json`].
pub(crate) fn line(text: impl Into<String>) {
    let text = text.into();
    println!("{text}");
    LINES.lock().unwrap_or_else(|p| p.into_inner()).push(text);
}

/// The JSON object `--json` prints last, over the lines kept so far.
pub(crate) fn json(bench: &str) -> String {
    let lines = LINES.lock().unwrap_or_else(|p| p.into_inner());
    json_of(bench, &lines)
}

fn json_of(bench: &str, lines: &[String]) -> String {
    let mut figures = serde_json::Map::new();
    for l in lines {
        let Some((head, rest)) = l.split_once(": ") else {
            continue;
        };
        // A head seen before (md-repair's line per subscriber count) gets a number.
        let mut key = head.to_owned();
        let mut n = 1;
        while figures.contains_key(&key) {
            n += 1;
            key = format!("{head} ({n})");
        }
        let mut m = serde_json::Map::new();
        // `(...)` remarks are words, not figures of their own.
        let rest = rest.split(" (").next().unwrap_or(rest);
        for item in rest.split(", ") {
            let words: Vec<&str> = item.split_whitespace().collect();
            let Some(i) = words.iter().position(|w| w.parse::<f64>().is_ok()) else {
                continue;
            };
            // `p50 ratio 1.02`: named before; `2 subscribers`: named after.
            let name = if i == 0 {
                words[1..].join(" ")
            } else {
                words[..i].join(" ")
            };
            let v: f64 = words[i].parse().unwrap_or(f64::NAN);
            if let Some(n) = serde_json::Number::from_f64(v) {
                m.insert(name, serde_json::Value::Number(n));
            }
        }
        figures.insert(key, serde_json::Value::Object(m));
    }
    serde_json::json!({ "bench": bench, "lines": lines, "figures": figures }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_lines_become_named_figures() {
        let lines = [
            "rc-latency: p50 ratio 1.02, p99 ratio 1.01".to_owned(),
            "rc-latency -s 80: p50 ratio 1.12, p99 ratio 1.17".to_owned(),
            "ipc-throughput: ratio 0.93 (lowest round 0.88)".to_owned(),
            "md-instructions: rocebus 6135, perftest 3500 per one-way message".to_owned(),
            "md-repair: 1 subscribers, 1.20 repair datagrams per lost datagram (9 repairs)"
                .to_owned(),
            "md-repair: 2 subscribers, 1.10 repair datagrams per lost datagram".to_owned(),
            "not a figure line".to_owned(),
        ];
        let v: serde_json::Value = serde_json::from_str(&json_of("rc-latency", &lines)).unwrap();
        assert_eq!(v["bench"], "rc-latency");
        assert_eq!(v["lines"].as_array().unwrap().len(), 7);
        let f = &v["figures"];
        assert_eq!(f["rc-latency"]["p50 ratio"], 1.02);
        assert_eq!(f["rc-latency"]["p99 ratio"], 1.01);
        assert_eq!(f["rc-latency -s 80"]["p99 ratio"], 1.17);
        assert_eq!(f["ipc-throughput"]["ratio"], 0.93);
        assert_eq!(f["ipc-throughput"].as_object().unwrap().len(), 1);
        assert_eq!(f["md-instructions"]["rocebus"], 6135.0);
        assert_eq!(f["md-instructions"]["perftest"], 3500.0);
        assert_eq!(f["md-repair"]["subscribers"], 1.0);
        assert_eq!(f["md-repair"]["repair datagrams per lost datagram"], 1.2);
        assert_eq!(f["md-repair (2)"]["subscribers"], 2.0);
    }
}
