//! feed-handler: NASDAQ TotalView-ITCH 5.0 over MoldUDP64 into order books and normalized market data.
//!
//! Layers, each usable alone: [`itch`] (zerocopy message views), [`binaryfile`] and
//! [`moldudp64`] (framing; the gap tracker is I/O-free), [`capture`] (any capture file as
//! BinaryFILE bytes: gzip, and [`pcap`] for pcap/pcapng captures of MoldUDP64 on the wire), [`book`] (full-depth books, L2, BBO,
//! snapshots), [`normalized`] and [`publish`] (what goes on the bus, through the [`publish::MdSink`]
//! seam), [`generate`] (synthetic days), [`udp`] (host-stack sockets for replay and receive),
//! [`bus`] (the seam implemented over rocebus market-data publishers, books as snapshots),
//! [`view`] (the subscriber side: per-symbol price levels rebuilt from the bus),
//! [`service`] (`feed-handler run`), and [`inspect`] (`feed-handler book` and `bbo`: a
//! capture's book at a time of day, its top-of-book changes as CSV), and [`dbnexport`]
//! (`feed-handler export`: a capture as Databento's DBN).
//!
//! ```no_run
//! use feed_handler::binaryfile::Reader;
//! use feed_handler::book::{Book, Event};
//!
//! // BinaryFILE, pcap or pcapng, gzipped or not: BinaryFILE bytes.
//! let data = feed_handler::capture::load("capture.itch50".as_ref(), &Default::default())?.data;
//! let mut book = Book::new();
//! for message in Reader::new(&data)?.flatten() {
//!     book.apply(&message, &mut |event: &Event| println!("{event:?}"));
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod badinput;
pub mod binaryfile;
pub mod book;
pub mod bus;
pub mod busrecord;
pub mod busreplay;
pub mod capture;
pub mod config;
pub mod dbnexport;
pub mod generate;
pub mod inspect;
pub mod ipcsink;
pub mod itch;
pub mod moldudp64;
pub mod normalized;
pub mod pcap;
pub mod publish;
pub mod service;
pub mod udp;
pub mod view;
