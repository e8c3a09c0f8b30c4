//! What `rocebus stat` shows: snapshots of every counters file in a directory and of the RDMA
//! device's counters, rendered as a live table with rates (like `AeronStat`) or as the
//! Prometheus text exposition format.
//!
//! Kept out of the binary so it is tested here; it reads files and formats strings, and
//! never writes to a counters file.

use std::collections::{HashMap, HashSet};
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

struct Sample {
    name: String,
    kind: Kind,
    help: String,
    labels: String,
    /// Record id, added as a label only when two of a process's counters share a name.
    id: Option<u32>,
    value: u64,
}

/// Renders `snap` in the Prometheus text exposition format (version 0.0.4).
///
/// Our counters become `rocebus_<label>_total` (kind counter) or `rocebus_<label>` (gauge)
/// with labels `component` and `pid`; the device's are one metric,
/// [`NIC_METRIC`](super::hw::NIC_METRIC), with labels `device`, `port`, `group` and `counter`
/// ([`render_nic_prometheus`]). Samples of one metric are grouped under one
/// `# HELP`/`# TYPE`; if two counters of one process share a label, an `id` label keeps the
/// series distinct.
pub fn render_prometheus(snap: &Snapshot) -> String {
    let mut samples = Vec::new();
    for f in &snap.files {
        for e in &f.entries {
            let base = sanitize_metric_name(&e.label);
            let base = if base.is_empty() {
                format!("counter_{}", e.id)
            } else {
                base
            };
            let name = match e.kind {
                Kind::Gauge => format!("rocebus_{base}"),
                _ if base.ends_with("_total") => format!("rocebus_{base}"),
                _ => format!("rocebus_{base}_total"),
            };
            samples.push(Sample {
                name,
                kind: e.kind,
                help: format!("rocebus counter \"{}\"", e.label),
                labels: format!(
                    "component=\"{}\",pid=\"{}\"",
                    escape_label_value(&f.info.component),
                    f.info.pid
                ),
                id: Some(e.id),
                value: e.value,
            });
        }
    }
    samples.sort_by(|a, b| a.name.cmp(&b.name));

    let mut out = String::new();
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let mut current: Option<&str> = None;
    for s in &samples {
        if current != Some(&s.name) {
            let kind = if s.kind == Kind::Gauge {
                "gauge"
            } else {
                "counter"
            };
            let help = s.help.replace('\\', "\\\\").replace('\n', "\\n");
            let _ = writeln!(out, "# HELP {} {help}", s.name);
            let _ = writeln!(out, "# TYPE {} {kind}", s.name);
            current = Some(&s.name);
        }
        let dup_id = if seen.insert((&s.name, &s.labels)) {
            None
        } else {
            s.id
        };
        match dup_id {
            Some(id) => writeln!(out, "{}{{{},id=\"{id}\"}} {}", s.name, s.labels, s.value),
            None => writeln!(out, "{}{{{}}} {}", s.name, s.labels, s.value),
        }
        .expect("writing to a String cannot fail");
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
        let pid = std::process::id();
        let expected = format!(
            "# HELP rocebus_gaps_total rocebus counter \"gaps\"\n\
             # TYPE rocebus_gaps_total counter\n\
             rocebus_gaps_total{{component=\"engine\",pid=\"{pid}\"}} 3\n\
             rocebus_gaps_total{{component=\"engine\",pid=\"{pid}\",id=\"1\"}} 4\n\
             # HELP rocebus_rq_low_water rocebus counter \"rq low water\"\n\
             # TYPE rocebus_rq_low_water gauge\n\
             rocebus_rq_low_water{{component=\"engine\",pid=\"{pid}\"}} 9\n"
        );
        assert_eq!(text, expected);
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
            prom.contains("# TYPE rocebus_nic_counter_total counter\n"),
            "{prom}"
        );
        assert!(prom.contains("rocebus_nic_counter_total{device=\"rxe0\",port=\"1\",group=\"hw_counters\",counter=\"rcvd_pkts\"} 12\n"), "{prom}");
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
