//! rocebus benchmarks and latency reporting.
//!
//! [`report`] turns HdrHistogram latency histograms (nanoseconds) into what the demo and the
//! benchmarks print and write: a percentile summary, the standard `.hgrm` percentile file,
//! percentile plots as PNG and SVG, and the fixed-rate schedule that keeps the numbers honest
//! (latency measured from the intended send time, so coordinated omission is corrected).
//!
//! # Quick start
//!
//! ```no_run
//! use hdrhistogram::Histogram;
//! use rocebus_bench::report::{plot_percentiles, write_hgrm_file, FixedRateSchedule, LatencyRecorder, PlotFormat, Summary};
//!
//! # fn now_ns() -> u64 { 0 }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut rec = LatencyRecorder::new()?;
//! let mut schedule = FixedRateSchedule::with_rate(now_ns(), 100_000)?;
//! for _ in 0..1_000 {
//!     let intended = schedule.next_send();
//!     while now_ns() < intended {} // spin until the intended time
//!     // ... send, wait for the reply ...
//!     rec.record(intended, now_ns());
//! }
//! println!("{}", Summary::of(rec.histogram()));
//! write_hgrm_file("out/rtt.hgrm", rec.histogram())?;
//! plot_percentiles("out/rtt.svg", PlotFormat::Svg, "order round trip", &[("rocebus", rec.histogram())])?;
//! # Ok(())
//! # }
//! ```

pub mod callgrind;
pub mod demo;
pub mod fanout;
pub mod flood;
pub mod ipc;
pub mod md;
pub mod pages;
pub mod rc;
pub mod report;
