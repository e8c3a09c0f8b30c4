//! Latency reports from HdrHistogram histograms of nanosecond values.
//!
//! This module owns how latency is summarised and written out: the percentile [`Summary`]
//! (struct and text table), the `.hgrm` percentile distribution file in the exact format of
//! HdrHistogram's `outputPercentileDistribution` (so HdrHistogram's plotter reads it), PNG and
//! SVG percentile plots with a log `1/(1-percentile)` x axis like that plotter, and the
//! coordinated-omission tools: [`FixedRateSchedule`] gives intended send times and
//! [`LatencyRecorder`] measures from them. It takes timestamps as arguments and never reads
//! a clock itself, so the caller names the clock in its report.
//!
//! Plots need a TrueType font to lay out text; it is loaded at run time from `$ROCEBUS_FONT`
//! or the usual system locations (Debian package `fonts-dejavu-core`), see [`FONT_ENV`].

use std::fmt::{self, Write as _};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hdrhistogram::Histogram;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Ticks per half distance of the percentile iteration in `.hgrm` files and plots; 5 is what
/// HdrHistogram's own tools use.
pub const TICKS_PER_HALF_DISTANCE: u32 = 5;
/// `.hgrm` values are written in microseconds (nanoseconds divided by this), the unit
/// HdrHistogram's tools conventionally show for nanosecond recordings.
pub const HGRM_UNIT_RATIO: f64 = 1000.0;
/// Environment variable naming a TrueType/OpenType font file for plots.
pub const FONT_ENV: &str = "ROCEBUS_FONT";
/// Where a font is looked for when [`FONT_ENV`] is unset: Debian/Ubuntu (`fonts-dejavu-core`,
/// `fonts-liberation`), Fedora and Arch locations.
pub const FONT_CANDIDATES: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];
/// Highest latency the default [`LatencyRecorder`] histogram holds: 60 s in nanoseconds.
pub const DEFAULT_HIGHEST_NS: u64 = 60_000_000_000;

/// Errors from writing or reading report files and from schedule set-up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// Writing a report file (or creating its folder) failed.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// No usable font for plot text.
    #[error(
        "no font for plot text: set {FONT_ENV} to a .ttf file or install the Debian package \
         fonts-dejavu-core (tried: {tried})"
    )]
    NoFont {
        /// Paths tried, comma separated.
        tried: String,
    },
    /// Drawing the plot failed.
    #[error("cannot draw plot {path}: {message}")]
    Plot {
        /// The file.
        path: PathBuf,
        /// The plotting library's error.
        message: String,
    },
    /// A `.hgrm` text did not parse.
    #[error("bad .hgrm line {line}: {what}")]
    Hgrm {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// A schedule rate or period of zero, or a rate above one per nanosecond.
    #[error("schedule rate must be 1..=1e9 per second and period at least 1 ns (got {0})")]
    Rate(u64),
    /// Creating a histogram failed (bad bounds).
    #[error("cannot create histogram")]
    Histogram(#[source] hdrhistogram::CreationError),
}

// ---------------------------------------------------------------------------------------
// Summary

/// Percentile summary of one latency histogram; values in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of recorded values.
    pub count: u64,
    /// Mean.
    pub mean_ns: f64,
    /// Smallest recorded value.
    pub min_ns: u64,
    /// 50th percentile.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// 99.99th percentile.
    pub p9999_ns: u64,
    /// Largest recorded value (to histogram precision).
    pub max_ns: u64,
}

/// The figures a harness reports, gathered for `rocebus-bench --json`'s final line: every
/// `RESULT` line goes through [`emit_result`], harnesses without one add theirs with
/// [`figure`].
static FIGURES: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// Prints a `RESULT key=value ...` line (what `cargo xtask bench` parses) and keeps its
/// pairs for [`json_line`].
pub fn emit_result(line: &str) {
    println!("{line}");
    let pairs = line.strip_prefix("RESULT").unwrap_or(line);
    for kv in pairs.split_whitespace() {
        if let Some((k, v)) = kv.split_once('=') {
            figure(k, v);
        }
    }
}

/// Keeps one figure for [`json_line`] (a later figure with the same key replaces it).
pub fn figure(key: &str, value: impl std::fmt::Display) {
    let mut f = FIGURES.lock().unwrap_or_else(|p| p.into_inner());
    let value = value.to_string();
    match f.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => f.push((key.to_owned(), value)),
    }
}

/// The final line of `rocebus-bench --json`: one JSON object, `{"bench": NAME, "figures":
/// {...}}`, numbers as JSON numbers and anything else as strings.
pub fn json_line(bench: &str) -> String {
    let f = FIGURES.lock().unwrap_or_else(|p| p.into_inner());
    json_of(bench, &f)
}

fn json_of(bench: &str, figures: &[(String, String)]) -> String {
    let escape = |s: &str| {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => out.push(c),
            }
        }
        out.push('"');
        out
    };
    let mut out = format!("{{\"bench\":{},\"figures\":{{", escape(bench));
    for (i, (k, v)) in figures.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let number = v.parse::<f64>().is_ok_and(f64::is_finite)
            && !v.starts_with('+')
            && !v.starts_with('.')
            && !v.ends_with('.');
        if number {
            let _ = write!(out, "{}:{v}", escape(k));
        } else {
            let _ = write!(out, "{}:{}", escape(k), escape(v));
        }
    }
    out.push_str("}}");
    out
}

impl Summary {
    /// The machine-readable line a latency harness ends with, which
    /// `cargo xtask bench` parses: `RESULT p50_ns=.. p90_ns=.. p99_ns=..
    /// p999_ns=.. max_ns=.. count=..`.
    pub fn result_line(&self) -> String {
        format!(
            "RESULT p50_ns={} p90_ns={} p99_ns={} p999_ns={} max_ns={} count={}",
            self.p50_ns, self.p90_ns, self.p99_ns, self.p999_ns, self.max_ns, self.count
        )
    }

    /// Summarises `h` (values in nanoseconds). An empty histogram gives all zeros.
    pub fn of(h: &Histogram<u64>) -> Summary {
        if h.is_empty() {
            return Summary {
                count: 0,
                mean_ns: 0.0,
                min_ns: 0,
                p50_ns: 0,
                p90_ns: 0,
                p99_ns: 0,
                p999_ns: 0,
                p9999_ns: 0,
                max_ns: 0,
            };
        }
        Summary {
            count: h.len(),
            mean_ns: h.mean(),
            min_ns: h.min(),
            p50_ns: h.value_at_quantile(0.5),
            p90_ns: h.value_at_quantile(0.9),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            p9999_ns: h.value_at_quantile(0.9999),
            max_ns: h.max(),
        }
    }
}

const TABLE_COLUMNS: [&str; 8] = [
    "count", "mean", "p50", "p90", "p99", "p99.9", "p99.99", "max",
];

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn table_row(out: &mut String, name: &str, s: &Summary) {
    let _ = write!(
        out,
        "{name:<20} {:>10} {:>10.3}",
        s.count,
        s.mean_ns / 1000.0
    );
    for v in [
        s.p50_ns, s.p90_ns, s.p99_ns, s.p999_ns, s.p9999_ns, s.max_ns,
    ] {
        let _ = write!(out, " {:>10.3}", us(v));
    }
    out.push('\n');
}

fn table_header(out: &mut String) {
    let _ = write!(out, "{:<20}", "latency (us)");
    for c in TABLE_COLUMNS {
        let _ = write!(out, " {c:>10}");
    }
    out.push('\n');
}

/// A text table of several named summaries, one row each, latencies in microseconds.
pub fn summary_table(rows: &[(&str, Summary)]) -> String {
    let mut out = String::new();
    table_header(&mut out);
    for (name, s) in rows {
        table_row(&mut out, name, s);
    }
    out
}

impl fmt::Display for Summary {
    /// The one-row table of [`summary_table`], without a name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&summary_table(&[("", *self)]))
    }
}

// ---------------------------------------------------------------------------------------
// .hgrm

/// `SubBuckets` as HdrHistogram computes it for `sigfig` significant digits (the Rust crate
/// keeps it private): the power of two at or above `2 * 10^sigfig`.
fn sub_bucket_count(sigfig: u8) -> u64 {
    (2 * 10u64.pow(u32::from(sigfig))).next_power_of_two()
}

/// Writes `h` as an HdrHistogram percentile distribution (`outputPercentileDistribution`):
/// values divided by `unit_ratio`, [`TICKS_PER_HALF_DISTANCE`] ticks per half distance.
pub fn write_hgrm<W: io::Write>(mut out: W, h: &Histogram<u64>, unit_ratio: f64) -> io::Result<()> {
    let digits = usize::from(h.sigfig());
    writeln!(
        out,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    )?;
    let mut total = 0u64;
    if !h.is_empty() {
        for v in h.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
            total += v.count_since_last_iteration();
            let value = v.value_iterated_to() as f64 / unit_ratio;
            let q = v.quantile_iterated_to();
            if q < 1.0 {
                writeln!(
                    out,
                    "{value:12.digits$} {q:2.12} {total:10} {:14.2}",
                    1.0 / (1.0 - q)
                )?;
            } else {
                writeln!(out, "{value:12.digits$} {q:2.12} {total:10}")?;
            }
        }
    }
    let (mean, stdev) = if h.is_empty() {
        (0.0, 0.0)
    } else {
        (h.mean(), h.stdev())
    };
    writeln!(
        out,
        "#[Mean    = {:12.digits$}, StdDeviation   = {:12.digits$}]",
        mean / unit_ratio,
        stdev / unit_ratio
    )?;
    writeln!(
        out,
        "#[Max     = {:12.digits$}, Total count    = {:12}]",
        h.max() as f64 / unit_ratio,
        h.len()
    )?;
    writeln!(
        out,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        h.buckets(),
        sub_bucket_count(h.sigfig())
    )?;
    Ok(())
}

fn create_parent(path: &Path) -> Result<(), ReportError> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            std::fs::create_dir_all(dir).map_err(|source| ReportError::Write {
                path: path.to_owned(),
                source,
            })
        }
        _ => Ok(()),
    }
}

/// Writes `h` (nanoseconds) to `path` as a `.hgrm` file in microseconds, creating the folder.
pub fn write_hgrm_file(path: impl AsRef<Path>, h: &Histogram<u64>) -> Result<(), ReportError> {
    let path = path.as_ref();
    create_parent(path)?;
    let write_err = |source| ReportError::Write {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::create(path).map_err(write_err)?;
    let mut out = io::BufWriter::new(file);
    write_hgrm(&mut out, h, HGRM_UNIT_RATIO).map_err(write_err)?;
    out.flush().map_err(write_err)
}

/// One percentile line of a `.hgrm` file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HgrmLine {
    /// Value, in the file's unit.
    pub value: f64,
    /// Quantile (0..=1).
    pub quantile: f64,
    /// Number of values at or below `value`.
    pub total_count: u64,
}

/// A parsed `.hgrm` file: its percentile lines and the totals of its footer.
#[derive(Debug, Clone, PartialEq)]
pub struct Hgrm {
    /// Percentile lines in file order.
    pub lines: Vec<HgrmLine>,
    /// `Mean` from the footer.
    pub mean: f64,
    /// `Max` from the footer.
    pub max: f64,
    /// `Total count` from the footer.
    pub total_count: u64,
}

/// Parses the text of a `.hgrm` file (as written by [`write_hgrm`] or HdrHistogram).
pub fn parse_hgrm(text: &str) -> Result<Hgrm, ReportError> {
    let mut lines = Vec::new();
    let (mut mean, mut max, mut total_count) = (None, None, None);
    let mut seen_header = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let err = |what| ReportError::Hgrm { line: i + 1, what };
        if line.is_empty() {
            continue;
        }
        if let Some(footer) = line.strip_prefix("#[").and_then(|l| l.strip_suffix(']')) {
            for field in footer.split(',') {
                let (key, value) = field
                    .split_once('=')
                    .ok_or_else(|| err("footer field without '='"))?;
                let value = value.trim();
                match key.trim() {
                    "Mean" => mean = Some(value.parse().map_err(|_| err("bad Mean"))?),
                    "Max" => max = Some(value.parse().map_err(|_| err("bad Max"))?),
                    "Total count" => {
                        total_count = Some(value.parse().map_err(|_| err("bad Total count"))?)
                    }
                    _ => {}
                }
            }
            continue;
        }
        if line.starts_with("Value") {
            seen_header = true;
            continue;
        }
        if !seen_header {
            return Err(err("data before the header line"));
        }
        let mut cols = line.split_whitespace();
        let mut next = |what| cols.next().ok_or_else(|| err(what));
        let value = next("missing value")?
            .parse()
            .map_err(|_| err("bad value"))?;
        let quantile: f64 = next("missing percentile")?
            .parse()
            .map_err(|_| err("bad percentile"))?;
        let total = next("missing total count")?
            .parse()
            .map_err(|_| err("bad total count"))?;
        if !(0.0..=1.0).contains(&quantile) {
            return Err(err("percentile outside 0..=1"));
        }
        lines.push(HgrmLine {
            value,
            quantile,
            total_count: total,
        });
    }
    let missing = |what| ReportError::Hgrm { line: 0, what };
    Ok(Hgrm {
        lines,
        mean: mean.ok_or_else(|| missing("no Mean footer"))?,
        max: max.ok_or_else(|| missing("no Max footer"))?,
        total_count: total_count.ok_or_else(|| missing("no Total count footer"))?,
    })
}

// ---------------------------------------------------------------------------------------
// Plots

/// Image format of a plot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotFormat {
    /// PNG bitmap.
    Png,
    /// SVG vector image.
    Svg,
}

/// Plot size in pixels.
const PLOT_SIZE: (u32, u32) = (1200, 700);
/// Font family name the plots register their font under.
const FONT_FAMILY: &str = "sans-serif";

/// Finds, loads and registers the plot font once per process.
fn ensure_font() -> Result<(), ReportError> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let mut tried = Vec::new();
        let env = std::env::var_os(FONT_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        for path in env
            .into_iter()
            .chain(FONT_CANDIDATES.iter().map(PathBuf::from))
        {
            if let Ok(bytes) = std::fs::read(&path) {
                // plotters keeps fonts for the life of the process and wants `'static`
                // bytes; this runs once, so leaking one font file is the intended cost.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
            tried.push(path.display().to_string());
        }
        Err(tried.join(", "))
    })
    .clone()
    .map_err(|tried| ReportError::NoFont { tried })
}

/// Axis label for x = 1/(1-q): the percentile, with as many decimals as the tick needs.
fn percentile_label(x: f64) -> String {
    if x <= 1.0 {
        return "0%".to_string();
    }
    let pct = 100.0 * (1.0 - 1.0 / x);
    let decimals = (x.log10().ceil() as i32 - 2).max(0) as usize;
    format!("{pct:.decimals$}%")
}

/// The unit of a plot's latency axis, chosen from the data so the largest value reads as a
/// number below a thousand (`250 ms`, not `250000.0` µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimeUnit {
    Ns,
    Us,
    Ms,
    S,
}

impl TimeUnit {
    /// The unit in which `max_ns` nanoseconds is at least 1 and below 1000 (seconds above).
    fn for_max_ns(max_ns: f64) -> TimeUnit {
        match max_ns {
            m if m < 1e3 => TimeUnit::Ns,
            m if m < 1e6 => TimeUnit::Us,
            m if m < 1e9 => TimeUnit::Ms,
            _ => TimeUnit::S,
        }
    }

    /// Nanoseconds in one of this unit.
    fn ns(self) -> f64 {
        match self {
            TimeUnit::Ns => 1.0,
            TimeUnit::Us => 1e3,
            TimeUnit::Ms => 1e6,
            TimeUnit::S => 1e9,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TimeUnit::Ns => "ns",
            TimeUnit::Us => "µs",
            TimeUnit::Ms => "ms",
            TimeUnit::S => "s",
        }
    }
}

/// A latency tick label for `ns` nanoseconds in the unit that reads it best (`2 µs`,
/// `250 ms`, `1.5 s`), never `250000.0`.
fn latency_label(ns: f64) -> String {
    let unit = TimeUnit::for_max_ns(ns * 1.000_001);
    format!("{} {}", value_label(ns / unit.ns()), unit.name())
}

/// A latency tick label: at most three decimals and none that are zeros (`250`, `2.5`,
/// `0.125`), never `250000.0`.
fn value_label(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// Points (1/(1-q), latency in ns) of one histogram, as the HdrHistogram plotter draws them;
/// the 100% point (x infinite) is left out, its value is the summary's max.
fn percentile_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    h.iter_quantiles(TICKS_PER_HALF_DISTANCE)
        .filter(|v| v.quantile_iterated_to() < 1.0)
        .map(|v| {
            (
                1.0 / (1.0 - v.quantile_iterated_to()),
                v.value_iterated_to() as f64,
            )
        })
        .collect()
}

type Series<'a> = (&'a str, Vec<(f64, f64)>);

/// Pixels the latency axis keeps for its tick labels and, left of them, its title: wide
/// enough for the widest label at the label font's size so the two never overlap.
fn y_label_area(widest_label_chars: usize) -> u32 {
    // DejaVu Sans digits are 0.64 em wide; 16 px labels, a 20 px rotated title, margins.
    (widest_label_chars as f64 * 16.0 * 0.64).ceil() as u32 + 20 + 36
}

/// The median one-way latency, ns, in the output of a perftest latency tool
/// (`ib_write_lat`, `ib_send_lat`): the `t_typical[usec]` column of its result row.
pub fn perftest_p50_ns(output: &str) -> Option<u64> {
    let mut lines = output.lines();
    let header = lines.find(|l| l.contains("#bytes") && l.contains("t_typical"))?;
    let column = header
        .split_whitespace()
        .position(|w| w.starts_with("t_typical"))?;
    let row: Vec<f64> = lines
        .map(|l| {
            l.split_whitespace()
                .map_while(|w| w.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .find(|v| v.len() > column)?;
    let us = row[column];
    (us.is_finite() && us > 0.0).then(|| (us * 1000.0).round() as u64)
}

/// A horizontal reference line on a percentile plot: e.g. perftest's median round trip on
/// the same hosts, the floor the measured series are read against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reference<'a> {
    /// Legend text, e.g. `"ib_write_lat p50 (floor)"`.
    pub label: &'a str,
    /// The line's latency, nanoseconds.
    pub ns: u64,
}

struct Axes {
    x_max: f64,
    /// The latency range, nanoseconds (log scale: `y_min` > 0).
    y_min: f64,
    y_max: f64,
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    series: &[Series<'_>],
    reference: Option<Reference<'_>>,
    axes: &Axes,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let widest = "999.5 µs".chars().count();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT_FAMILY, 26))
        .margin(20)
        .margin_right(60)
        .x_label_area_size(60)
        .y_label_area_size(y_label_area(widest))
        .build_cartesian_2d(
            (1.0..axes.x_max).log_scale(),
            (axes.y_min..axes.y_max).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (log scale)")
        .label_style((FONT_FAMILY, 16))
        .axis_desc_style((FONT_FAMILY, 20))
        .x_label_formatter(&|x| percentile_label(*x))
        .y_label_formatter(&|ns| latency_label(*ns))
        .draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|&(x, ns)| (x, ns.max(axes.y_min))),
                color.stroke_width(2),
            ))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2))
            });
    }
    if let Some(r) = reference {
        let y = (r.ns as f64).max(axes.y_min);
        let style = BLACK.mix(0.7).stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new(
                [(1.0, y), (axes.x_max, y)],
                10,
                6,
                style,
            ))?
            .label(r.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT_FAMILY, 18))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()
}

/// Draws a percentile plot of one or more named histograms (nanoseconds) to `path`,
/// creating the folder. The x axis is `1/(1-percentile)` on a log scale, labelled as
/// percentiles, like HdrHistogram's plotter; the latency axis is in ns, µs, ms or s, whichever
/// reads the data best. E.g. series `("rocebus", &h1), ("ib_write_lat", &h2)`.
pub fn plot_percentiles(
    path: impl AsRef<Path>,
    format: PlotFormat,
    title: &str,
    series: &[(&str, &Histogram<u64>)],
) -> Result<(), ReportError> {
    plot_percentiles_with(path, format, title, series, None)
}

/// [`plot_percentiles`] with a horizontal [`Reference`] line (perftest's floor), drawn
/// dashed and named in the legend.
pub fn plot_percentiles_with(
    path: impl AsRef<Path>,
    format: PlotFormat,
    title: &str,
    series: &[(&str, &Histogram<u64>)],
    reference: Option<Reference<'_>>,
) -> Result<(), ReportError> {
    let path = path.as_ref();
    ensure_font()?;
    create_parent(path)?;
    let series: Vec<Series<'_>> = series
        .iter()
        .map(|(name, h)| (*name, percentile_points(h)))
        .collect();
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(x, _)| x))
        .fold(10.0_f64, f64::max);
    // Round the x range up to a power of ten so the last tick is a clean percentile.
    let x_max = 10f64.powf(x_max.log10().ceil()).min(1e12);
    let values = || {
        series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
            .chain(reference.map(|r| r.ns as f64))
            .filter(|&y| y > 0.0)
    };
    let (lo, hi) = values().fold((f64::INFINITY, 0.0_f64), |(lo, hi), y| {
        (lo.min(y), hi.max(y))
    });
    // A log scale from a power of ten at or below the fastest value to one at or above the
    // slowest: the body and the tail both readable, the floor line among them.
    let (y_min, y_max) = if hi > 0.0 {
        (
            10f64.powf(lo.log10().floor()),
            10f64.powf((hi * 1.0001).log10().ceil()),
        )
    } else {
        (1.0, 1000.0)
    };
    let axes = Axes {
        x_max,
        y_min,
        y_max,
    };
    let plot_err = |message: String| ReportError::Plot {
        path: path.to_owned(),
        message,
    };
    match format {
        PlotFormat::Png => {
            let root = BitMapBackend::new(path, PLOT_SIZE).into_drawing_area();
            draw(&root, title, &series, reference, &axes).map_err(|e| plot_err(e.to_string()))
        }
        PlotFormat::Svg => {
            let root = SVGBackend::new(path, PLOT_SIZE).into_drawing_area();
            draw(&root, title, &series, reference, &axes).map_err(|e| plot_err(e.to_string()))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Coordinated omission

/// Intended send times of a fixed-rate load, for measuring latency without coordinated
/// omission.
///
/// A sender that waits for each reply before sending the next, or that stalls, sends fewer
/// messages exactly when the system is slow, and the slow period is under-represented in the
/// histogram ("coordinated omission", Gil Tene). With a schedule the sender sends message `i`
/// at its intended time `start + i * period` (or at once if it is late), and the latency is
/// measured from the intended time, so a stall shows as the latency every scheduled message
/// would have seen. Times are nanoseconds from any one clock the caller chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedRateSchedule {
    start_ns: u64,
    /// The period is `num / den` nanoseconds, exact for any integer rate per second.
    num: u64,
    den: u64,
    next: u64,
}

impl FixedRateSchedule {
    /// `per_second` sends per second from `start_ns`; 1..=1e9.
    pub fn with_rate(start_ns: u64, per_second: u64) -> Result<FixedRateSchedule, ReportError> {
        if per_second == 0 || per_second > 1_000_000_000 {
            return Err(ReportError::Rate(per_second));
        }
        Ok(FixedRateSchedule {
            start_ns,
            num: 1_000_000_000,
            den: per_second,
            next: 0,
        })
    }

    /// One send every `period_ns` nanoseconds from `start_ns`.
    pub fn with_period(start_ns: u64, period_ns: u64) -> Result<FixedRateSchedule, ReportError> {
        if period_ns == 0 {
            return Err(ReportError::Rate(0));
        }
        Ok(FixedRateSchedule {
            start_ns,
            num: period_ns,
            den: 1,
            next: 0,
        })
    }

    /// Intended time of send number `i` (saturating at `u64::MAX`).
    pub fn intended(&self, i: u64) -> u64 {
        let offset = u128::from(i) * u128::from(self.num) / u128::from(self.den);
        u64::try_from(u128::from(self.start_ns) + offset).unwrap_or(u64::MAX)
    }

    /// Intended time of the next send, without advancing.
    pub fn peek(&self) -> u64 {
        self.intended(self.next)
    }

    /// Intended time of the next send; advances to the one after.
    pub fn next_send(&mut self) -> u64 {
        let t = self.peek();
        self.next += 1;
        t
    }

    /// Number of sends handed out so far.
    pub fn sent(&self) -> u64 {
        self.next
    }

    /// How long to wait at `now_ns` before the next send (0 when it is due or late).
    pub fn wait_ns(&self, now_ns: u64) -> u64 {
        self.peek().saturating_sub(now_ns)
    }

    /// How far behind schedule the next send is at `now_ns` (0 when on time).
    pub fn lag_ns(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.peek())
    }

    /// The average period in nanoseconds (rounded down), for [`LatencyRecorder::record_correct`].
    pub fn period_ns(&self) -> u64 {
        self.num / self.den
    }
}

/// A latency histogram (nanoseconds) that records from intended times and counts, rather
/// than hides, values it cannot record.
#[derive(Debug, Clone)]
pub struct LatencyRecorder {
    hist: Histogram<u64>,
    early: u64,
    clamped: u64,
}

impl LatencyRecorder {
    /// 1 ns .. 60 s at 3 significant digits (0.1% value error).
    pub fn new() -> Result<LatencyRecorder, ReportError> {
        let hist =
            Histogram::new_with_bounds(1, DEFAULT_HIGHEST_NS, 3).map_err(ReportError::Histogram)?;
        Ok(LatencyRecorder::with_histogram(hist))
    }

    /// Records into `hist` (which must hold nanoseconds).
    pub fn with_histogram(hist: Histogram<u64>) -> LatencyRecorder {
        LatencyRecorder {
            hist,
            early: 0,
            clamped: 0,
        }
    }

    /// Records `done_ns - intended_ns`. A completion before its intended time (a clock or
    /// caller bug) is counted in [`early`](Self::early) and not recorded; a value above the
    /// histogram's range is recorded as its highest value and counted in
    /// [`clamped`](Self::clamped).
    pub fn record(&mut self, intended_ns: u64, done_ns: u64) {
        match done_ns.checked_sub(intended_ns) {
            Some(latency) => self.record_value(latency),
            None => self.early += 1,
        }
    }

    /// Records one latency value.
    pub fn record_value(&mut self, latency_ns: u64) {
        if self.hist.record(latency_ns).is_err() {
            self.hist.saturating_record(latency_ns);
            self.clamped += 1;
        }
    }

    /// For loops that cannot hold a schedule: records `latency_ns` and, like HdrHistogram's
    /// `recordValueWithExpectedInterval`, the values that sends every `expected_interval_ns`
    /// would have seen while this one was stuck.
    pub fn record_correct(&mut self, latency_ns: u64, expected_interval_ns: u64) {
        if self
            .hist
            .record_correct(latency_ns, expected_interval_ns)
            .is_err()
        {
            self.hist.saturating_record(latency_ns);
            self.clamped += 1;
        }
    }

    /// The histogram.
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }

    /// The histogram, consuming the recorder.
    pub fn into_histogram(self) -> Histogram<u64> {
        self.hist
    }

    /// Completions reported before their intended time (not recorded).
    pub fn early(&self) -> u64 {
        self.early
    }

    /// Values above the histogram's range (recorded as its highest value).
    pub fn clamped(&self) -> u64 {
        self.clamped
    }

    /// Summary of the histogram.
    pub fn summary(&self) -> Summary {
        Summary::of(&self.hist)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1..=10_000 ns, one value each: percentiles are known exactly up to histogram precision.
    fn uniform() -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, DEFAULT_HIGHEST_NS, 3).unwrap();
        for v in 1..=10_000 {
            h.record(v).unwrap();
        }
        h
    }

    #[test]
    fn json_line_holds_the_figures() {
        let line = json_of(
            "rc-latency",
            &[
                ("p50_ns".into(), "5003".into()),
                ("msgs_per_sec".into(), "1234.5".into()),
                ("label".into(), "rocebus \"x\"".into()),
                ("odd".into(), "1e999".into()),
            ],
        );
        assert_eq!(
            line,
            r#"{"bench":"rc-latency","figures":{"p50_ns":5003,"msgs_per_sec":1234.5,"label":"rocebus \"x\"","odd":"1e999"}}"#
        );
    }

    #[test]
    fn result_line_is_what_xtask_bench_parses() {
        let s = Summary::of(&uniform());
        assert_eq!(
            s.result_line(),
            "RESULT p50_ns=5003 p90_ns=9007 p99_ns=9903 p999_ns=9991 max_ns=10007 count=10000"
        );
    }

    #[test]
    fn summary_of_known_histogram() {
        let s = Summary::of(&uniform());
        assert_eq!(s.count, 10_000);
        assert!((s.mean_ns - 5000.5).abs() < 5.0, "{}", s.mean_ns);
        assert_eq!(s.min_ns, 1);
        // Values above 2048 are stored in buckets of 2, 4, 8 ns (3 significant digits);
        // the histogram reports the highest equivalent value.
        assert_eq!(s.p50_ns, 5003);
        assert_eq!(s.p90_ns, 9007);
        assert_eq!(s.p99_ns, 9903);
        assert_eq!(s.p999_ns, 9991);
        assert_eq!(s.p9999_ns, 9999);
        assert_eq!(s.max_ns, 10007);
        let empty = Histogram::<u64>::new(3).unwrap();
        assert_eq!(Summary::of(&empty).count, 0);
        assert_eq!(Summary::of(&empty).max_ns, 0);
    }

    #[test]
    fn summary_table_layout() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        h.record(1500).unwrap();
        let t = summary_table(&[("order rtt", Summary::of(&h))]);
        let lines: Vec<_> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["latency", "(us)", "count", "mean", "p50", "p90", "p99", "p99.9", "p99.99", "max"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["order", "rtt", "1", "1.500", "1.500", "1.500", "1.500", "1.500", "1.500", "1.500"]
        );
    }

    #[test]
    fn hgrm_has_fixed_format() {
        let mut h = Histogram::<u64>::new_with_bounds(1, DEFAULT_HIGHEST_NS, 3).unwrap();
        for v in [1000, 2000, 3000, 4000] {
            h.record(v).unwrap();
        }
        let mut buf = Vec::new();
        write_hgrm(&mut buf, &h, HGRM_UNIT_RATIO).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "       Value     Percentile TotalCount 1/(1-Percentile)"
        );
        assert_eq!(lines[1], "");
        assert_eq!(
            lines[2],
            "       1.000 0.000000000000          1           1.00"
        );
        assert!(
            lines.contains(&"       4.001 1.000000000000          4"),
            "{text}"
        );
        let n = lines.len();
        // The mean uses each bucket's middle value, hence 2.501 rather than 2.500.
        assert_eq!(
            lines[n - 3],
            "#[Mean    =        2.501, StdDeviation   =        1.118]"
        );
        assert_eq!(
            lines[n - 2],
            "#[Max     =        4.001, Total count    =            4]"
        );
        assert_eq!(
            lines[n - 1],
            format!(
                "#[Buckets = {:12}, SubBuckets     =         2048]",
                h.buckets()
            )
        );

        let parsed = parse_hgrm(&text).unwrap();
        assert_eq!(parsed.total_count, 4);
        assert_eq!(parsed.max, 4.001);
        assert_eq!(parsed.mean, 2.501);
        let first = parsed.lines[0];
        assert_eq!(
            (first.value, first.quantile, first.total_count),
            (1.0, 0.0, 1)
        );
        let last = *parsed.lines.last().unwrap();
        assert_eq!(
            (last.value, last.quantile, last.total_count),
            (4.001, 1.0, 4)
        );
        // Quantiles and counts never go down.
        for w in parsed.lines.windows(2) {
            assert!(w[0].quantile <= w[1].quantile && w[0].total_count <= w[1].total_count);
        }
    }

    #[test]
    fn hgrm_file_round_trip_and_bad_input() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out/md.hgrm");
        write_hgrm_file(&path, &uniform()).unwrap();
        let parsed = parse_hgrm(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(parsed.total_count, 10_000);
        assert_eq!(parsed.lines.last().unwrap().total_count, 10_000);
        assert_eq!(parsed.max, 10.007);

        assert!(matches!(
            parse_hgrm("1.0 0.5 3\n"),
            Err(ReportError::Hgrm { line: 1, .. })
        ));
        assert!(matches!(
            parse_hgrm("Value\n x 0.5 3\n"),
            Err(ReportError::Hgrm {
                line: 2,
                what: "bad value"
            })
        ));
        assert!(matches!(
            parse_hgrm("Value\n 1 7.0 3\n"),
            Err(ReportError::Hgrm { line: 2, .. })
        ));
        assert!(matches!(
            parse_hgrm("Value\n"),
            Err(ReportError::Hgrm { line: 0, .. })
        ));
        let empty = Histogram::<u64>::new(3).unwrap();
        let mut buf = Vec::new();
        write_hgrm(&mut buf, &empty, HGRM_UNIT_RATIO).unwrap();
        let parsed = parse_hgrm(std::str::from_utf8(&buf).unwrap()).unwrap();
        assert!(parsed.lines.is_empty());
        assert_eq!(parsed.total_count, 0);
    }

    #[test]
    fn percentile_labels() {
        assert_eq!(percentile_label(1.0), "0%");
        assert_eq!(percentile_label(2.0), "50%");
        assert_eq!(percentile_label(10.0), "90%");
        assert_eq!(percentile_label(100.0), "99%");
        assert_eq!(percentile_label(1000.0), "99.9%");
        assert_eq!(percentile_label(1e5), "99.999%");
    }

    #[test]
    fn plots_are_written_png_and_svg() {
        let dir = tempfile::tempdir().unwrap();
        let a = uniform();
        let mut b = Histogram::<u64>::new_with_bounds(1, DEFAULT_HIGHEST_NS, 3).unwrap();
        for v in 1..=5_000 {
            b.record(v * 3).unwrap();
        }
        let series = [("rocebus", &a), ("ib_write_lat", &b)];
        let png = dir.path().join("plots/rtt.png");
        let svg = dir.path().join("plots/rtt.svg");
        plot_percentiles(&png, PlotFormat::Png, "order round trip", &series).unwrap();
        plot_percentiles(&svg, PlotFormat::Svg, "order round trip", &series).unwrap();
        let png_bytes = std::fs::read(&png).unwrap();
        assert!(png_bytes.len() > 1000, "{}", png_bytes.len());
        assert_eq!(&png_bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR carries the size we asked for.
        assert_eq!(&png_bytes[12..16], b"IHDR");
        assert_eq!(
            u32::from_be_bytes(png_bytes[16..20].try_into().unwrap()),
            PLOT_SIZE.0
        );
        assert_eq!(
            u32::from_be_bytes(png_bytes[20..24].try_into().unwrap()),
            PLOT_SIZE.1
        );
        let svg_text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            svg_text.starts_with("<svg"),
            "{}",
            &svg_text[..80.min(svg_text.len())]
        );
        assert!(svg_text.contains("ib_write_lat") && svg_text.contains("99.9%"));
        assert!(svg_text.contains("<polyline"));
        // An empty series still gives a plot (axes only).
        let empty = Histogram::<u64>::new(3).unwrap();
        let svg2 = dir.path().join("empty.svg");
        plot_percentiles(&svg2, PlotFormat::Svg, "empty", &[("none", &empty)]).unwrap();
        assert!(std::fs::metadata(&svg2).unwrap().len() > 0);
    }

    #[test]
    fn the_latency_axis_reads_in_the_unit_of_the_data_without_spurious_decimals() {
        assert_eq!(TimeUnit::for_max_ns(900.0), TimeUnit::Ns);
        assert_eq!(TimeUnit::for_max_ns(2_500.0), TimeUnit::Us);
        assert_eq!(TimeUnit::for_max_ns(250e6), TimeUnit::Ms);
        assert_eq!(TimeUnit::for_max_ns(3e9), TimeUnit::S);
        assert_eq!(value_label(250.0), "250");
        assert_eq!(value_label(250000.0), "250000");
        assert_eq!(value_label(2.5), "2.5");
        assert_eq!(value_label(0.125), "0.125");
        assert_eq!(value_label(1.0 / 3.0), "0.333");
        assert_eq!(value_label(0.0), "0");
        assert_eq!(value_label(-0.0001), "0");
    }

    /// The texts of an SVG plot: (x, font size, rotated, text).
    fn svg_texts(svg: &str) -> Vec<(f64, f64, bool, String)> {
        let mut out = Vec::new();
        for part in svg.split("<text").skip(1) {
            let (attrs, rest) = part.split_once('>').unwrap();
            let text = rest.split("</text>").next().unwrap().trim().to_string();
            let attr = |name: &str| {
                let at = attrs.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
                attrs[at..]
                    .split('"')
                    .next()
                    .unwrap()
                    .parse::<f64>()
                    .unwrap()
            };
            out.push((
                attr("x"),
                attr("font-size"),
                attrs.contains("rotate("),
                text,
            ));
        }
        out
    }

    /// A body at a few microseconds and a tail at a quarter second (the issue's
    /// "250000.0" µs): the latency axis is logarithmic, every tick names its unit with no
    /// decimal it does not need, the axis title stays clear of the ticks, and the reference
    /// line is named in the legend.
    #[test]
    fn a_long_tailed_plot_reads_in_units_with_its_title_clear_of_the_ticks() {
        assert_eq!(latency_label(2_000.0), "2 µs");
        assert_eq!(latency_label(250e6), "250 ms");
        assert_eq!(latency_label(100.0), "100 ns");
        assert_eq!(latency_label(1e9), "1 s");
        assert_eq!(latency_label(1e6), "1 ms");
        let dir = tempfile::tempdir().unwrap();
        let mut h = Histogram::<u64>::new_with_bounds(1, DEFAULT_HIGHEST_NS, 3).unwrap();
        for v in 1..=10_000u64 {
            h.record(2_000 + v % 500).unwrap();
        }
        h.record(250_000_000).unwrap();
        let svg = dir.path().join("q.svg");
        let floor = Reference {
            label: "ib_write_lat p50 (floor)",
            ns: 1_800,
        };
        plot_percentiles_with(
            &svg,
            PlotFormat::Svg,
            "tail",
            &[("rocebus", &h)],
            Some(floor),
        )
        .unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        let texts = svg_texts(&text);
        let title = texts
            .iter()
            .find(|t| t.3.starts_with("latency"))
            .expect("a latency axis title");
        assert!(title.2, "the latency title is rotated");
        // The y ticks: a number and a unit.
        let ticks: Vec<_> = texts
            .iter()
            .filter(|t| {
                !t.2 && t.3.split_once(' ').is_some_and(|(n, u)| {
                    n.parse::<f64>().is_ok() && ["ns", "µs", "ms", "s"].contains(&u)
                })
            })
            .collect();
        let shown: Vec<&str> = ticks.iter().map(|t| t.3.as_str()).collect();
        for want in ["1 µs", "1 ms", "1 s"] {
            assert!(shown.contains(&want), "no tick {want}: {shown:?}");
        }
        for t in &ticks {
            let n: f64 = t.3.split_once(' ').unwrap().0.parse().unwrap();
            assert!(n < 1000.0, "{t:?}");
            assert!(!t.3.contains(".0 "), "a spurious decimal: {t:?}");
        }
        // Each tick's left edge (end-anchored: x minus its width at 0.64 em a character)
        // is right of the rotated title's extent (its x plus one line of its font).
        let title_right = title.0 + title.1;
        for t in &ticks {
            let left = t.0 - t.3.chars().count() as f64 * 0.64 * t.1;
            assert!(
                left > title_right + 4.0,
                "tick {t:?} runs into the title {title:?}"
            );
        }
        assert!(
            text.contains("ib_write_lat p50 (floor)"),
            "the reference line's legend"
        );
    }

    #[test]
    fn perftest_median_is_read_from_its_result_row() {
        let out = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 64      2000          20.68          40856.47      22.14    \t       242.62      \t1211.23\t\t6156.63 \t\t23394.54\n";
        assert_eq!(perftest_p50_ns(out), Some(22_140));
        assert_eq!(
            perftest_p50_ns("ib_write_lat is not installed (perftest)"),
            None
        );
        assert_eq!(perftest_p50_ns(""), None);
    }

    #[test]
    fn schedule_gives_exact_intended_times() {
        let mut s = FixedRateSchedule::with_rate(1_000, 3).unwrap();
        // 3 per second: 333_333_333.33 ns period, no drift.
        assert_eq!(s.next_send(), 1_000);
        assert_eq!(s.next_send(), 1_000 + 333_333_333);
        assert_eq!(s.next_send(), 1_000 + 666_666_666);
        assert_eq!(s.next_send(), 1_000 + 1_000_000_000);
        assert_eq!(s.intended(3_000_000_000), 1_000 + 1_000_000_000_000_000_000);
        assert_eq!(s.sent(), 4);
        assert_eq!(s.wait_ns(1_000), 1_333_333_333);
        assert_eq!(s.lag_ns(1_333_334_333 + 10), 10);
        assert_eq!(s.period_ns(), 333_333_333);
        assert!(matches!(
            FixedRateSchedule::with_rate(0, 0),
            Err(ReportError::Rate(0))
        ));
        assert!(matches!(
            FixedRateSchedule::with_period(0, 0),
            Err(ReportError::Rate(0))
        ));
        let s = FixedRateSchedule::with_period(u64::MAX - 5, 10).unwrap();
        assert_eq!(s.intended(1), u64::MAX);
    }

    /// A sender stalls for 100 ms once in a 1 kHz run. Measured from the actual send time
    /// only one message looks slow; measured from the intended time the 100 messages that
    /// should have gone out during the stall all carry it, as they must.
    #[test]
    fn recording_from_intended_time_corrects_coordinated_omission() {
        let mut schedule = FixedRateSchedule::with_period(0, 1_000_000).unwrap();
        let mut corrected = LatencyRecorder::new().unwrap();
        let mut naive = LatencyRecorder::new().unwrap();
        let service_ns = 10_000;
        let mut now = 0u64;
        for i in 0..1_000u64 {
            let intended = schedule.next_send();
            now = now.max(intended);
            let sent = now;
            let stall = if i == 500 { 100_000_000 } else { 0 };
            now = sent + service_ns + stall;
            corrected.record(intended, now);
            naive.record(sent, now);
        }
        assert_eq!(
            naive.summary().p90_ns,
            naive.histogram().highest_equivalent(10_000)
        );
        assert!(naive.summary().p99_ns < 20_000);
        // ~10% of the intended sends waited behind the stall.
        assert!(
            corrected.summary().p90_ns > 1_000_000,
            "{:?}",
            corrected.summary()
        );
        assert_eq!(corrected.early(), 0);
        assert_eq!(corrected.clamped(), 0);

        // record_correct synthesises the missing samples for a loop without a schedule.
        let mut rc = LatencyRecorder::new().unwrap();
        rc.record_correct(100_000_000, 1_000_000);
        assert_eq!(rc.histogram().len(), 100);

        let mut r = LatencyRecorder::new().unwrap();
        r.record(10, 5);
        r.record_value(DEFAULT_HIGHEST_NS * 10);
        assert_eq!((r.early(), r.clamped(), r.histogram().len()), (1, 1, 1));
    }
}
