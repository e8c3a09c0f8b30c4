//! What `rocebus stat` shows: snapshots of every counters file in a directory and of the RDMA
//! device's counters, rendered as a live table with rates (like `AeronStat`) or as the
//! Prometheus text exposition format.
//!
//! Kept out of the binary so it is tested here; it reads files and formats strings, and
//! never writes to a counters file.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::hw::{read_hw_counters, render_nic_prometheus, HwCounter};
use super::{CounterEntry, CountersReader, FileInfo, Kind, FILE_EXTENSION};

/// The counters files (`*.counters`) in `dir`, sorted by name.
pub fn discover(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == FILE_EXTENSION) && p.is_file())
        .collect();
    out.sort();
    Ok(out)
}

/// One counters file at one instant.
#[derive(Debug, Clone)]
pub struct FileSnapshot {
    /// The file.
    pub path: PathBuf,
    /// Its validated header.
    pub info: FileInfo,
    /// Whether the writer's process still runs.
    pub alive: bool,
    /// Its allocated counters.
    pub entries: Vec<CounterEntry>,
}

/// Everything `rocebus stat` shows, read at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When it was read.
    pub taken: Instant,
    /// Our counters, one entry per readable file.
    pub files: Vec<FileSnapshot>,
    /// Files that could not be read, with the reason.
    pub errors: Vec<(PathBuf, String)>,
    /// The RDMA device's counters (empty when there is no device).
    pub hw: Vec<HwCounter>,
}

impl Snapshot {
    /// Reads `paths` and the hardware counters under `hw_root`.
    pub fn take(paths: &[PathBuf], hw_root: &Path) -> Snapshot {
        let mut files = Vec::with_capacity(paths.len());
        let mut errors = Vec::new();
        for path in paths {
            match CountersReader::open(path) {
                Ok(reader) => files.push(FileSnapshot {
                    path: path.clone(),
                    info: reader.info().clone(),
                    alive: reader.writer_alive(),
                    entries: reader.iter().collect(),
                }),
                Err(e) => errors.push((path.clone(), error_chain(&e))),
            }
        }
        Snapshot {
            taken: Instant::now(),
            files,
            errors,
            hw: read_hw_counters(hw_root),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let _ = write!(s, ": {src}");
        cur = src.source();
    }
    s
}

/// Identity of one of our counters across snapshots: a restarted writer is a new series.
type OurKey<'a> = (&'a Path, u32, u64, u32);
/// Identity of a hardware counter across snapshots.
type HwKey<'a> = (&'a str, &'a str, &'a str, &'a str);

fn hw_key(c: &HwCounter) -> HwKey<'_> {
    (&c.device, &c.port, c.group, &c.name)
}

/// Per-second rate of a value between two reads; `None` without a usable earlier read.
fn rate(prev: Option<u64>, cur: u64, elapsed: Duration) -> Option<f64> {
    let prev = prev?;
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 || cur < prev {
        return None;
    }
    Some((cur - prev) as f64 / secs)
}

fn fmt_rate(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{r:.0}"))
}

fn fmt_uptime(start_unix_ns: u64, now_unix_ns: u64) -> String {
    let s = now_unix_ns.saturating_sub(start_unix_ns) / 1_000_000_000;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// Renders `cur` as the human table: one block per file, then the hardware counters.
/// Rates per second come from `prev` (the earlier snapshot), shown as `-` without one.
/// `now_unix_ns` is the wall clock, for uptimes.
pub fn render_table(
    cur: &Snapshot,
    prev: Option<&Snapshot>,
    now_unix_ns: u64,
    hw_root: &Path,
) -> String {
    let elapsed = prev.map_or(Duration::ZERO, |p| {
        cur.taken.saturating_duration_since(p.taken)
    });
    let mut prev_ours: HashMap<OurKey<'_>, u64> = HashMap::new();
    let mut prev_hw: HashMap<HwKey<'_>, u64> = HashMap::new();
    if let Some(p) = prev {
        for f in &p.files {
            for e in &f.entries {
                prev_ours.insert((&f.path, f.info.pid, f.info.start_unix_ns, e.id), e.value);
            }
        }
        for c in &p.hw {
            prev_hw.insert(hw_key(c), c.value);
        }
    }

    let mut out = String::new();
    if cur.files.is_empty() && cur.errors.is_empty() {
        out.push_str("no rocebus counters files found\n");
    }
    for f in &cur.files {
        let _ = writeln!(
            out,
            "{}  pid {} ({})  up {}  {}",
            f.info.component,
            f.info.pid,
            if f.alive { "running" } else { "exited" },
            fmt_uptime(f.info.start_unix_ns, now_unix_ns),
            f.path.display()
        );
        let _ = writeln!(
            out,
            "  {:>4}  {:<48} {:>20} {:>14}",
            "id", "label", "value", "rate/s"
        );
        for e in &f.entries {
            let key = (f.path.as_path(), f.info.pid, f.info.start_unix_ns, e.id);
            let r = match e.kind {
                Kind::Gauge => None,
                _ => rate(prev_ours.get(&key).copied(), e.value, elapsed),
            };
            let label = if e.kind == Kind::Gauge {
                format!("{} (gauge)", e.label)
            } else {
                e.label.to_string()
            };
            // A gauge labelled `.ipv4` holds an address (a publisher's
            // subscriber rows): shown dotted.
            let value = if e.kind == Kind::Gauge && e.label.ends_with(".ipv4") && e.value != 0 {
                std::net::Ipv4Addr::from(e.value as u32).to_string()
            } else {
                e.value.to_string()
            };
            let _ = writeln!(
                out,
                "  {:>4}  {:<48} {:>20} {:>14}",
                e.id,
                label,
                value,
                fmt_rate(r)
            );
        }
    }
    for (path, err) in &cur.errors {
        let _ = writeln!(out, "{}: unreadable: {err}", path.display());
    }
    if cur.hw.is_empty() {
        let _ = writeln!(
            out,
            "RDMA hardware counters: none (no device under {})",
            hw_root.display()
        );
    } else {
        let mut last: Option<(&str, &str)> = None;
        for c in &cur.hw {
            if last != Some((&c.device, &c.port)) {
                let _ = writeln!(out, "RDMA device {} port {}", c.device, c.port);
                last = Some((&c.device, &c.port));
            }
            let r = rate(prev_hw.get(&hw_key(c)).copied(), c.value, elapsed);
            let name = format!("{}/{}", c.group, c.name);
            let _ = writeln!(
                out,
                "  {:>4}  {:<48} {:>20} {:>14}",
                "",
                name,
                c.value,
                fmt_rate(r)
            );
        }
    }
    out
}

/// Turns arbitrary text into a Prometheus metric-name fragment: `[a-zA-Z0-9_]`, runs of
/// anything else become one `_`, lower-cased, trimmed of `_`.
pub fn sanitize_metric_name(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    out.trim_matches('_').to_string()
}

/// Escapes a Prometheus label value (`\`, `"` and newline).
pub fn escape_label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A counter label split into a stable metric name and its label pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricId {
    /// The name fragment after `rocebus_` (sanitized, without `_total`).
    pub base: String,
    /// The words the name came from (the label without what became label pairs), for
    /// `# HELP`.
    pub text: String,
    /// `channel`, `peer` and `reason` pairs taken out of the label, in that order.
    pub labels: Vec<(&'static str, String)>,
}

/// Splits a counter label into a stable metric name and labels, so that a channel, a
/// subscriber slot or a reason never makes a new metric name:
///
/// - dot-separated parts `ch<N>` become `channel="N"` and `sub<N>` become `peer="N"` (the
///   part itself reads `subscriber` in the name): `md.ch3.delivered` is
///   `md_delivered{channel="3"}`, `md.pub.ch0.sub1.lag` is
///   `md_pub_subscriber_lag{channel="0",peer="1"}`;
/// - `WHAT: REASON` and `WHAT[REASON]` become `WHAT` with `reason="REASON"`:
///   `engines disconnected: silent past engine_timeout_ms` is `engines_disconnected`
///   with `reason="silent past engine_timeout_ms"`.
pub fn metric_id(label: &str) -> MetricId {
    let mut labels = Vec::new();
    let (what, reason) = match label.split_once(": ") {
        Some((what, reason)) if !what.is_empty() && !reason.is_empty() => (what, Some(reason)),
        _ => match label.strip_suffix(']').and_then(|l| l.split_once('[')) {
            Some((what, reason)) if !what.is_empty() && !reason.is_empty() => (what, Some(reason)),
            _ => (label, None),
        },
    };
    let numbered = |part: &str, prefix: &str| -> Option<String> {
        let n = part.strip_prefix(prefix)?;
        (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then(|| n.to_string())
    };
    let mut parts = Vec::new();
    let (mut channel, mut peer) = (None, None);
    for part in what.split('.') {
        if channel.is_none() {
            if let Some(n) = numbered(part, "ch") {
                channel = Some(n);
                continue;
            }
        }
        if peer.is_none() {
            if let Some(n) = numbered(part, "sub") {
                peer = Some(n);
                parts.push("subscriber");
                continue;
            }
        }
        parts.push(part);
    }
    if let Some(c) = channel {
        labels.push(("channel", c));
    }
    if let Some(p) = peer {
        labels.push(("peer", p));
    }
    if let Some(r) = reason {
        labels.push(("reason", r.to_string()));
    }
    let text = parts.join(".");
    MetricId {
        base: sanitize_metric_name(&text),
        text,
        labels,
    }
}

struct Sample {
    name: String,
    kind: &'static str,
    help: String,
    labels: String,
    value: u64,
}

fn label_set(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        if !out.is_empty() {
            out.push(',');
        }
        let _ = write!(out, "{k}=\"{}\"", escape_label_value(v));
    }
    out
}

/// Renders `snap` in the Prometheus text exposition format (version 0.0.4).
///
/// Names are stable across restarts, channels and reasons (see [`metric_id`]): our counters
/// become `rocebus_<name>_total` (kind counter) or `rocebus_<name>` (gauge) with a
/// `component` label and the `channel`, `peer` and `reason` labels their counter label
/// carries; there is no `pid` label, so a restarted process continues its series (its
/// counters starting again from zero read as a counter reset). Every counters file adds
/// `rocebus_process_up{component}` (1 while its writer runs, 0 once it exited: the file
/// stays, with its final values) and `rocebus_process_start_time_seconds{component}`. The
/// device's are one metric, [`NIC_METRIC`](super::hw::NIC_METRIC), with labels `device`,
/// `port`, `group` and `counter` ([`render_nic_prometheus`]). Samples of one metric are grouped under one `# HELP`/`# TYPE`; if two series
/// would be identical (two counters of one process with one label), an `id` label keeps them
/// apart. Files that could not be read are listed as comments.
pub fn render_prometheus(snap: &Snapshot) -> String {
    let mut samples = Vec::new();
    for f in &snap.files {
        let component = f.info.component.as_str();
        samples.push(Sample {
            name: "rocebus_process_up".into(),
            kind: "gauge",
            help: "1 while the process writing the counters file runs, 0 once it exited".into(),
            labels: label_set(&[("component", component)]),
            value: u64::from(f.alive),
        });
        samples.push(Sample {
            name: "rocebus_process_start_time_seconds".into(),
            kind: "gauge",
            help: "Start time of the process writing the counters file, Unix seconds".into(),
            labels: label_set(&[("component", component)]),
            value: f.info.start_unix_ns / 1_000_000_000,
        });
        for e in &f.entries {
            let id = metric_id(&e.label);
            let base = if id.base.is_empty() {
                format!("counter_{}", e.id)
            } else {
                id.base
            };
            let (name, kind) = match e.kind {
                Kind::Gauge => (format!("rocebus_{base}"), "gauge"),
                _ if base.ends_with("_total") => (format!("rocebus_{base}"), "counter"),
                _ => (format!("rocebus_{base}_total"), "counter"),
            };
            let mut pairs: Vec<(&str, &str)> = vec![("component", component)];
            pairs.extend(id.labels.iter().map(|(k, v)| (*k, v.as_str())));
            samples.push(Sample {
                name,
                kind,
                help: format!("rocebus counter \"{}\"", id.text),
                labels: label_set(&pairs),
                value: e.value,
            });
        }
    }
    samples.sort_by(|a, b| a.name.cmp(&b.name));

    let mut out = String::new();
    for (path, err) in &snap.errors {
        let _ = writeln!(
            out,
            "# unreadable counters file {}: {}",
            path.display(),
            err.replace('\n', " ")
        );
    }
    let mut seen: HashMap<(&str, &str), u32> = HashMap::new();
    let mut current: Option<(&str, &str)> = None;
    for s in &samples {
        if current.map(|(n, _)| n) != Some(&s.name) {
            let help = s.help.replace('\\', "\\\\").replace('\n', "\\n");
            let _ = writeln!(out, "# HELP {} {help}", s.name);
            let _ = writeln!(out, "# TYPE {} {}", s.name, s.kind);
            current = Some((&s.name, s.kind));
        }
        let n = seen.entry((&s.name, &s.labels)).or_insert(0);
        *n += 1;
        if *n == 1 {
            let _ = writeln!(out, "{}{{{}}} {}", s.name, s.labels, s.value);
        } else {
            let _ = writeln!(
                out,
                "{}{{{},id=\"{}\"}} {}",
                s.name,
                s.labels,
                *n - 1,
                s.value
            );
        }
    }
    out.push_str(&render_nic_prometheus(&snap.hw));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::{counters_path, CountersFile};

    #[test]
    fn names_are_sanitized() {
        assert_eq!(
            sanitize_metric_name("Messages received"),
            "messages_received"
        );
        assert_eq!(
            sanitize_metric_name("risk.rejects[max-qty]"),
            "risk_rejects_max_qty"
        );
        assert_eq!(sanitize_metric_name("--"), "");
        assert_eq!(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    fn fixture() -> (tempfile::TempDir, CountersFile) {
        let dir = tempfile::tempdir().unwrap();
        let file = CountersFile::create(counters_path(dir.path(), "engine"), 8).unwrap();
        (dir, file)
    }

    #[test]
    fn ipv4_gauges_show_as_addresses() {
        let (dir, file) = fixture();
        let addr = file
            .allocate_with("md.pub.ch0.sub0.ipv4", Kind::Gauge, 0)
            .unwrap();
        addr.set(u64::from(u32::from(std::net::Ipv4Addr::new(198, 18, 0, 3))));
        let empty = file
            .allocate_with("md.pub.ch0.sub1.ipv4", Kind::Gauge, 0)
            .unwrap();
        empty.set(0);
        let hw_root = dir.path().join("no-sysfs");
        let snap = Snapshot::take(&discover(dir.path()).unwrap(), &hw_root);
        let text = render_table(&snap, None, snap.files[0].info.start_unix_ns, &hw_root);
        let cols = |label: &str| -> Vec<String> {
            let line = text.lines().find(|l| l.contains(label)).unwrap();
            line.split_whitespace().map(str::to_owned).collect()
        };
        assert_eq!(cols("sub0.ipv4")[3], "198.18.0.3", "{text}");
        assert_eq!(cols("sub1.ipv4")[3], "0", "{text}");
    }

    #[test]
    fn table_shows_values_and_rates() {
        let (dir, file) = fixture();
        let msgs = file.allocate("messages").unwrap();
        let depth = file.allocate_with("queue depth", Kind::Gauge, 0).unwrap();
        msgs.add(100);
        depth.set(5);
        let paths = discover(dir.path()).unwrap();
        assert_eq!(paths.len(), 1);
        let hw_root = dir.path().join("no-sysfs");
        let mut first = Snapshot::take(&paths, &hw_root);
        msgs.add(300);
        let mut second = Snapshot::take(&paths, &hw_root);
        // Make the interval exactly 2 s so the rate is a fixed number.
        first.taken = second.taken - Duration::from_secs(2);
        second.taken = first.taken + Duration::from_secs(2);
        let text = render_table(
            &second,
            Some(&first),
            second.files[0].info.start_unix_ns + 61_000_000_000,
            &hw_root,
        );
        assert!(text.contains("engine  pid"), "{text}");
        assert!(text.contains("up 00:01:01"), "{text}");
        let line = text.lines().find(|l| l.contains("messages")).unwrap();
        let cols: Vec<_> = line.split_whitespace().collect();
        assert_eq!(cols, ["0", "messages", "400", "150"]);
        let line = text.lines().find(|l| l.contains("queue depth")).unwrap();
        let cols: Vec<_> = line.split_whitespace().collect();
        assert_eq!(cols, ["1", "queue", "depth", "(gauge)", "5", "-"]);
        assert!(text.contains("RDMA hardware counters: none"), "{text}");
    }

    #[test]
    fn prometheus_groups_and_dedups() {
        let (dir, file) = fixture();
        file.allocate("gaps").unwrap().add(3);
        file.allocate("gaps").unwrap().add(4);
        file.allocate_with("rq low water", Kind::Gauge, 0)
            .unwrap()
            .set(9);
        let snap = Snapshot::take(&discover(dir.path()).unwrap(), &dir.path().join("none"));
        let text = render_prometheus(&snap);
        let start = snap.files[0].info.start_unix_ns / 1_000_000_000;
        let expected = format!(
            "# HELP rocebus_gaps_total rocebus counter \"gaps\"\n\
             # TYPE rocebus_gaps_total counter\n\
             rocebus_gaps_total{{component=\"engine\"}} 3\n\
             rocebus_gaps_total{{component=\"engine\",id=\"1\"}} 4\n\
             # HELP rocebus_process_start_time_seconds Start time of the process writing the counters file, Unix seconds\n\
             # TYPE rocebus_process_start_time_seconds gauge\n\
             rocebus_process_start_time_seconds{{component=\"engine\"}} {start}\n\
             # HELP rocebus_process_up 1 while the process writing the counters file runs, 0 once it exited\n\
             # TYPE rocebus_process_up gauge\n\
             rocebus_process_up{{component=\"engine\"}} 1\n\
             # HELP rocebus_rq_low_water rocebus counter \"rq low water\"\n\
             # TYPE rocebus_rq_low_water gauge\n\
             rocebus_rq_low_water{{component=\"engine\"}} 9\n"
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn channels_peers_and_reasons_are_labels_not_names() {
        let id = metric_id("md.ch3.delivered");
        assert_eq!(id.base, "md_delivered");
        assert_eq!(id.labels, [("channel", "3".to_string())]);
        let id = metric_id("md.pub.ch0.sub12.lag");
        assert_eq!(id.base, "md_pub_subscriber_lag");
        assert_eq!(
            id.labels,
            [("channel", "0".to_string()), ("peer", "12".to_string())]
        );
        // Not a number: part of the name.
        assert_eq!(
            metric_id("md.pub.ch0.subscribers").base,
            "md_pub_subscribers"
        );
        assert_eq!(metric_id("md.check.x").base, "md_check_x");
        let id = metric_id("engines disconnected: silent past engine_timeout_ms");
        assert_eq!(id.base, "engines_disconnected");
        assert_eq!(
            id.labels,
            [("reason", "silent past engine_timeout_ms".to_string())]
        );
        let id = metric_id("risk.rejects[max-qty]");
        assert_eq!(id.base, "risk_rejects");
        assert_eq!(id.labels, [("reason", "max-qty".to_string())]);
        assert_eq!(metric_id("open orders").labels, []);

        // Two channels and two reasons: one metric each, told apart by labels.
        let (dir, file) = fixture();
        file.allocate("md.ch1.delivered").unwrap().add(5);
        file.allocate("md.ch2.delivered").unwrap().add(6);
        file.allocate("engines disconnected: too many malformed frames")
            .unwrap()
            .add(1);
        file.allocate("engines disconnected: silent past engine_timeout_ms")
            .unwrap()
            .add(2);
        let snap = Snapshot::take(&discover(dir.path()).unwrap(), &dir.path().join("none"));
        let text = render_prometheus(&snap);
        assert_eq!(
            text.matches("# TYPE rocebus_md_delivered_total counter\n")
                .count(),
            1,
            "{text}"
        );
        assert!(
            text.contains("rocebus_md_delivered_total{component=\"engine\",channel=\"1\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("rocebus_md_delivered_total{component=\"engine\",channel=\"2\"} 6\n"),
            "{text}"
        );
        assert_eq!(
            text.matches("# TYPE rocebus_engines_disconnected_total counter\n")
                .count(),
            1,
            "{text}"
        );
        assert!(text.contains("rocebus_engines_disconnected_total{component=\"engine\",reason=\"silent past engine_timeout_ms\"} 2\n"), "{text}");
        assert!(!text.contains("pid="), "{text}");
        assert!(!text.contains("_ch1_"), "{text}");
    }

    #[test]
    fn hw_counters_appear_in_both_formats() {
        let (dir, _file) = fixture();
        let root = dir.path().join("sys");
        let port = root.join("rxe0/ports/1/hw_counters");
        std::fs::create_dir_all(&port).unwrap();
        std::fs::write(port.join("rcvd_pkts"), "12\n").unwrap();
        let snap = Snapshot::take(&[], &root);
        let table = render_table(&snap, None, 0, &root);
        assert!(table.contains("RDMA device rxe0 port 1"), "{table}");
        assert!(table.contains("hw_counters/rcvd_pkts"), "{table}");
        let prom = render_prometheus(&snap);
        assert!(
            prom.contains("# TYPE rocebus_nic_total counter\n"),
            "{prom}"
        );
        assert!(prom.contains("rocebus_nic_total{device=\"rxe0\",port=\"1\",group=\"hw_counters\",counter=\"rcvd_pkts\"} 12\n"), "{prom}");
    }

    #[test]
    fn unreadable_file_is_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.counters");
        std::fs::write(&bad, b"short").unwrap();
        let snap = Snapshot::take(&[bad], &dir.path().join("none"));
        assert!(snap.files.is_empty());
        assert_eq!(snap.errors.len(), 1);
        let text = render_table(&snap, None, 0, dir.path());
        assert!(
            text.contains("bad.counters: unreadable: counters file"),
            "{text}"
        );
    }
}
