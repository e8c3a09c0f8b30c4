//! Offline inspection of captures: the full-depth book at a time of day (`feed-handler book`),
//! every top-of-book change as CSV (`feed-handler bbo`) and the decode + book pass alone, for
//! measuring it (`feed-handler throughput`).
//!
//! Owns the time-of-day syntax, the text layout of a printed book and the BBO CSV format. It
//! reads messages with [`crate::binaryfile::StreamReader`] and keeps state in
//! [`crate::book::Book`] only: there is no second ITCH reader or book here, so what these tools
//! show is what the service would have built from the same bytes. No file or terminal I/O:
//! callers hand in a stream of BinaryFILE bytes (read in chunks, so memory does not grow with
//! the capture) and a writer.

use crate::binaryfile::{ReaderCounters, StreamReader};
use crate::book::{Book, Event, EventSink, Level, Side, SymbolBook};
use crate::itch::Stock;
use std::fmt;
use std::io::{self, Read, Write};
use std::ops::ControlFlow;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A time of day that is not `HH:MM:SS[.nnnnnnnnn]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad time of day {input:?}: expected HH:MM:SS.nnnnnnnnn \
     (24-hour clock, up to 9 fraction digits, e.g. 09:30:00.000000000 or 14:05:59.5)"
)]
pub struct TimeOfDayError {
    /// What was given.
    pub input: String,
}

/// Parses `HH:MM:SS` with an optional fraction of 1 to 9 digits into nanoseconds since
/// midnight, the unit of ITCH timestamps.
pub fn parse_time_of_day(s: &str) -> Result<u64, TimeOfDayError> {
    let err = || TimeOfDayError {
        input: s.to_owned(),
    };
    let (hms, frac) = match s.split_once('.') {
        Some((hms, frac)) => (hms, Some(frac)),
        None => (s, None),
    };
    let digits = |p: &str, len: usize| -> Option<u64> {
        (p.len() == len && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    let mut parts = hms.split(':');
    let (Some(h), Some(m), Some(sec), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(err());
    };
    let (h, m, sec) = (
        digits(h, 2).ok_or_else(err)?,
        digits(m, 2).ok_or_else(err)?,
        digits(sec, 2).ok_or_else(err)?,
    );
    if h >= 24 || m >= 60 || sec >= 60 {
        return Err(err());
    }
    let nanos = match frac {
        None => 0,
        Some(f) if (1..=9).contains(&f.len()) => {
            digits(f, f.len()).ok_or_else(err)? * 10u64.pow(9 - f.len() as u32)
        }
        Some(_) => return Err(err()),
    };
    Ok(((h * 60 + m) * 60 + sec) * NANOS_PER_SEC + nanos)
}

/// Nanoseconds since midnight as `HH:MM:SS.nnnnnnnnn` (hours go past 23 for values beyond a
/// day, which a 48-bit ITCH timestamp can hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeOfDay(pub u64);

impl fmt::Display for TimeOfDay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0 / NANOS_PER_SEC;
        write!(
            f,
            "{:02}:{:02}:{:02}.{:09}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            self.0 % NANOS_PER_SEC
        )
    }
}

/// A Price(4) as a decimal with its 4 places.
fn price(raw: u32) -> String {
    crate::itch::Price4::new(raw).to_string()
}

/// The book after a prefix of a capture, from [`book_at`].
#[derive(Debug, Clone)]
pub struct BookAt {
    /// The books of every symbol seen.
    pub book: Book,
    /// Messages applied.
    pub applied: u64,
    /// Timestamp of the last message applied, if any.
    pub last_timestamp: Option<u64>,
    /// The reader's totals (bad records are skipped, as `feed-handler decode` does).
    pub reader: ReaderCounters,
}

/// Applies the messages of the BinaryFILE stream `input` (a file, or any capture through
/// [`crate::capture::open`]) to a fresh [`Book`] up to and including the last one whose
/// timestamp is at most `at` (all of them when `at` is `None`), reading it in chunks: memory
/// is the books and one chunk. Reading stops at the first later message: ITCH timestamps do
/// not go back within a day. A stream that is no BinaryFILE is an
/// [`io::ErrorKind::InvalidData`] error.
pub fn book_at(input: impl Read, at: Option<u64>) -> io::Result<BookAt> {
    let mut book = Book::new();
    let mut applied = 0;
    let mut last_timestamp = None;
    let mut discard = |_: &Event| {};
    let mut reader = StreamReader::new(input);
    reader.try_for_each(|m| {
        let Ok(m) = m else {
            return ControlFlow::Continue(());
        };
        let ts = m.header().timestamp.nanos();
        if at.is_some_and(|at| ts > at) {
            return ControlFlow::Break(());
        }
        book.apply(&m, &mut discard);
        applied += 1;
        last_timestamp = Some(ts);
        ControlFlow::Continue(())
    })?;
    Ok(BookAt {
        book,
        applied,
        last_timestamp,
        reader: *reader.counters(),
    })
}

/// Which symbols [`write_book`] prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symbols<'s> {
    /// Every symbol with at least one level on either side.
    NonEmpty,
    /// One symbol by name, printed even when its book is empty.
    Named(&'s str),
}

/// `--symbol` names a symbol the capture never mentioned (up to the requested time).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown symbol {name:?}: no stock directory or order for it in the capture{when}")]
pub struct UnknownSymbol {
    /// The name asked for.
    pub name: String,
    /// " up to HH:MM:SS..." when the book was cut at a time, else empty.
    pub when: String,
}

/// Prints the books selected by `symbols`, each with up to `depth` levels per side, best
/// first, bids and asks side by side:
///
/// ```text
/// AAPL (locate 1): 2 bid levels, 1 ask level
///    bid size  orders        price |        price  ask size  orders
///         300       2     100.0100 |     100.0200       100       1
///         100       1     100.0000 |
/// ```
pub fn write_book(
    out: &mut impl Write,
    book: &Book,
    symbols: Symbols<'_>,
    depth: usize,
) -> io::Result<()> {
    match symbols {
        Symbols::Named(name) => {
            // `book_at` callers check the name first; an unknown one prints nothing.
            if let Some((locate, b)) = book.symbol_by_name(name) {
                write_symbol(out, locate, b, depth)?;
            }
        }
        Symbols::NonEmpty => {
            let mut first = true;
            for (locate, b) in book.symbols() {
                if b.bbo() == (None, None) {
                    continue;
                }
                if !first {
                    writeln!(out)?;
                }
                first = false;
                write_symbol(out, locate, b, depth)?;
            }
        }
    }
    Ok(())
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn write_symbol(out: &mut impl Write, locate: u16, b: &SymbolBook, depth: usize) -> io::Result<()> {
    let name = b.stock.as_str().unwrap_or("?");
    let (nb, na) = (b.depth(Side::Bid).count(), b.depth(Side::Ask).count());
    let state = match b.state() {
        b' ' => String::new(),
        s => format!(", trading state {}", char::from(s)),
    };
    writeln!(
        out,
        "{name} (locate {locate}): {}, {}{state}",
        plural(nb, "bid level"),
        plural(na, "ask level")
    )?;
    if nb + na == 0 {
        return writeln!(out, "  (empty)");
    }
    writeln!(
        out,
        "  {:>9} {:>7} {:>12} | {:>12} {:>9} {:>7}",
        "bid size", "orders", "price", "price", "ask size", "orders"
    )?;
    let mut bids = b.depth(Side::Bid).take(depth);
    let mut asks = b.depth(Side::Ask).take(depth);
    loop {
        let (bid, ask) = (bids.next(), asks.next());
        if bid.is_none() && ask.is_none() {
            break;
        }
        let left = bid.map_or_else(
            || format!("{:>9} {:>7} {:>12}", "", "", ""),
            |l: &Level| format!("{:>9} {:>7} {:>12}", l.shares, l.orders, price(l.price)),
        );
        let right = ask.map_or_else(String::new, |l: &Level| {
            format!("{:>12} {:>9} {:>7}", price(l.price), l.shares, l.orders)
        });
        writeln!(out, "{}", format!("  {left} | {right}").trim_end())?;
    }
    if nb > depth || na > depth {
        writeln!(out, "  ({depth} of {nb} bid and {na} ask levels shown)")?;
    }
    Ok(())
}

/// Checks that `name` is a symbol of `book`.
pub fn check_symbol(book: &Book, name: &str, at: Option<u64>) -> Result<(), UnknownSymbol> {
    match book.symbol_by_name(name) {
        Some(_) => Ok(()),
        None => Err(UnknownSymbol {
            name: name.to_owned(),
            when: at.map_or_else(String::new, |t| format!(" up to {}", TimeOfDay(t))),
        }),
    }
}

/// The header line of the BBO CSV.
pub const BBO_HEADER: &str =
    "locate,symbol,timestamp,bid_price,bid_size,bid_orders,ask_price,ask_size,ask_orders";

/// A symbol as a CSV field: without its padding; empty before the stock directory named it
/// (all zero bytes) or when it is not UTF-8; quoted if it holds a comma or a quote.
fn symbol_field(stock: Stock) -> String {
    let s = stock
        .as_str()
        .unwrap_or("")
        .trim_end_matches('\0')
        .trim_end_matches(' ');
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// One BBO CSV row (without the newline): the locate and the symbol, prices with 4
/// decimals, an empty side as three empty fields.
pub fn bbo_row(
    locate: u16,
    stock: Stock,
    timestamp: u64,
    bid: Option<Level>,
    ask: Option<Level>,
) -> String {
    let side = |l: Option<Level>| {
        l.map_or_else(
            || ",,".to_owned(),
            |l| format!("{},{},{}", price(l.price), l.shares, l.orders),
        )
    };
    format!(
        "{locate},{},{timestamp},{},{}",
        symbol_field(stock),
        side(bid),
        side(ask)
    )
}

/// How far [`write_bbo`] got, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of the BinaryFILE stream consumed.
    pub bytes: u64,
    /// Size of the stream, if known (an uncompressed BinaryFILE's file size).
    pub total_bytes: Option<u64>,
    /// Messages applied.
    pub messages: u64,
    /// Rows written.
    pub rows: u64,
}

/// Messages between two calls of the progress callback of [`write_bbo`].
pub const PROGRESS_EVERY: u64 = 1 << 16;

/// Totals of a [`write_bbo`] run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BboTotals {
    /// Messages applied.
    pub messages: u64,
    /// Rows written (header not counted).
    pub rows: u64,
    /// The reader's totals.
    pub reader: ReaderCounters,
}

/// Writes [`BBO_HEADER`] and one row per top-of-book change: every [`Event::Bbo`] the book
/// emits, i.e. each time the best bid or ask of a symbol changes price, size or order count
/// (a replace that moves an order within the top level and leaves it as it was makes none).
/// Reads the BinaryFILE stream `input` in chunks (memory is the books and one chunk); the
/// header is written with the first message, so a stream without one writes nothing. Calls
/// `progress` about every [`PROGRESS_EVERY`] records, `total_bytes` being the stream's size
/// if known. A stream that is no BinaryFILE is an [`io::ErrorKind::InvalidData`] error.
pub fn write_bbo(
    input: impl Read,
    total_bytes: Option<u64>,
    out: &mut impl Write,
    mut progress: impl FnMut(Progress),
) -> io::Result<BboTotals> {
    let mut reader = StreamReader::new(input);
    let mut book = Book::new();
    let mut messages = 0u64;
    let mut rows = 0u64;
    let mut result = Ok(());
    loop {
        let n = reader.try_read_records(PROGRESS_EVERY as usize, |m| {
            // Bad records are counted by the reader and skipped, as `decode` does.
            let Ok(m) = m else {
                return ControlFlow::Continue(());
            };
            if messages == 0 {
                result = writeln!(out, "{BBO_HEADER}");
            }
            book.apply(&m, &mut |e: &Event| {
                if let Event::Bbo {
                    locate,
                    stock,
                    timestamp,
                    bid,
                    ask,
                } = *e
                {
                    if result.is_ok() {
                        result = writeln!(out, "{}", bbo_row(locate, stock, timestamp, bid, ask));
                        rows += 1;
                    }
                }
            });
            messages += 1;
            if result.is_ok() {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        })?;
        std::mem::replace(&mut result, Ok(()))?;
        if n == 0 {
            break;
        }
        progress(Progress {
            bytes: reader.position(),
            total_bytes,
            messages,
            rows,
        });
    }
    let reader = *reader.counters();
    Ok(BboTotals {
        messages,
        rows,
        reader,
    })
}

/// Bytes [`books_pass`] reads at a time: itch-book's default chunk too, so that both sides of
/// `cargo xtask bench books` hold the same amount of input.
pub const PASS_CHUNK: usize = 8 << 20;

/// Totals of a [`books_pass`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassTotals {
    /// Messages applied.
    pub messages: u64,
    /// Top-of-book changes the book reported ([`Event::Bbo`]).
    pub bbo_changes: u64,
    /// The reader's totals, summed over the chunks.
    pub reader: ReaderCounters,
}

/// Decodes a capture and applies it to full-depth books, counting top-of-book changes and
/// nothing else: the work of `feed-handler bbo` without the CSV. Reads `input` in
/// [`PASS_CHUNK`] pieces, so memory is the books plus one chunk whatever the capture's size.
/// Bad records are counted and skipped as `bbo` does; a file that is no capture at all is an
/// [`io::ErrorKind::InvalidData`] error.
pub fn books_pass(input: impl Read) -> io::Result<PassTotals> {
    pass_in_chunks(input, PASS_CHUNK)
}

/// Messages read ahead of the one applied by [`books_pass`]: far enough for a prefetch to
/// arrive (a few hundred cycles of work in between), near enough to stay in L1.
const LOOKAHEAD: usize = 16;
/// The longest ITCH 5.0 message (NOII, 50 bytes), rounded up.
const MAX_MESSAGE: usize = 64;

/// A ring of the last [`LOOKAHEAD`] messages read, as copies of their bytes.
struct Lookahead {
    slots: [[u8; MAX_MESSAGE]; LOOKAHEAD],
    lens: [u8; LOOKAHEAD],
    /// Messages read so far; the ring holds the last `min(read, LOOKAHEAD)`.
    read: usize,
    /// Messages handed back so far.
    applied: usize,
}

impl Default for Lookahead {
    fn default() -> Self {
        Self {
            slots: [[0; MAX_MESSAGE]; LOOKAHEAD],
            lens: [0; LOOKAHEAD],
            read: 0,
            applied: 0,
        }
    }
}

impl Lookahead {
    fn is_full(&self) -> bool {
        self.read - self.applied == LOOKAHEAD
    }

    /// Keeps a copy of `bytes`, one decoded message. The ring must not be full.
    fn push(&mut self, bytes: &[u8]) {
        debug_assert!(!self.is_full() && bytes.len() <= MAX_MESSAGE);
        let len = bytes.len().min(MAX_MESSAGE);
        let i = self.read % LOOKAHEAD;
        self.slots[i][..len].copy_from_slice(&bytes[..len]);
        self.lens[i] = len as u8;
        self.read += 1;
    }

    /// The oldest message kept, if any.
    fn oldest(&self) -> Option<&[u8]> {
        let i = self.applied % LOOKAHEAD;
        (self.applied < self.read).then(|| &self.slots[i][..usize::from(self.lens[i])])
    }

    fn drop_oldest(&mut self) {
        self.applied = (self.applied + 1).min(self.read);
    }
}

/// Applies a message kept by [`Lookahead`] (decoded once already, so it decodes again).
fn apply_kept(book: &mut Book, bytes: &[u8], sink: &mut impl EventSink) {
    if let Ok((m, _)) = crate::itch::decode(bytes) {
        book.apply(&m, sink);
    }
}

/// [`books_pass`] with `chunk` bytes at a time.
fn pass_in_chunks(input: impl Read, chunk: usize) -> io::Result<PassTotals> {
    let mut book = Book::new();
    let mut bbo_changes = 0u64;
    let mut sink = |e: &Event| {
        if let Event::Bbo { .. } = e {
            bbo_changes += 1;
        }
    };
    let reader = apply_ahead(input, chunk, &mut book, &mut sink)?;
    Ok(PassTotals {
        messages: book.counters().messages,
        bbo_changes,
        reader,
    })
}

/// Reads `input` `chunk` bytes at a time and applies every message to `book`, in order,
/// each [`LOOKAHEAD`] messages after it was read, its order prefetched when read: the
/// cache miss on an order added long ago (half of a pass's time without it) overlaps the
/// messages in between. The messages wait as copies of their bytes (the reader's chunk may
/// be refilled before they are applied). Bad records are counted by the reader and
/// skipped, as `bbo` does. Returns the reader's totals.
fn apply_ahead(
    input: impl Read,
    chunk: usize,
    book: &mut Book,
    sink: &mut impl EventSink,
) -> io::Result<ReaderCounters> {
    let mut reader = StreamReader::with_chunk(input, chunk);
    let mut ahead = Lookahead::default();
    reader.for_each(|m| {
        if let Ok(m) = m {
            book.prefetch(&m);
            if ahead.is_full() {
                if let Some(due) = ahead.oldest() {
                    apply_kept(book, due, sink);
                }
                ahead.drop_oldest();
            }
            ahead.push(m.as_bytes());
        }
    })?;
    while let Some(due) = ahead.oldest() {
        apply_kept(book, due, sink);
        ahead.drop_oldest();
    }
    Ok(*reader.counters())
}

#[cfg(test)]
mod tests;
