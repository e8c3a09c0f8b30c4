//! `feed-handler run`: MoldUDP64 (UDP multicast, or a capture file) → ITCH decode → books →
//! normalized messages on the rocebus market-data path.
//!
//! [`Pipeline`] is the I/O-free middle (decode, book, partitioned publishing through any
//! [`MdSink`]); [`Service`] is the thin busy-polling shell around it: the input socket or
//! file, the bus publishers ([`BusSink`]), the shared-memory counters, and the stop
//! conditions. It owns no protocol decisions: gap recovery is the
//! [`crate::moldudp64::GapTracker`]'s, bus sequencing and recovery are rocebus's.

use crate::badinput::RateLimitedLog;
use crate::binaryfile::{DetectError, StreamReader};
use crate::book::Book;
use crate::bus::BusSink;
use crate::capture::{self, CaptureReader};
use crate::config::Config;
use crate::ipcsink::IpcSink;
use crate::itch;
use crate::moldudp64::Loss;
use crate::normalized::FeedLoss;
use crate::pcap::WireFilter;
use crate::publish::{MdSink, PublishCounters, Publisher};
use crate::udp::{FeedSink, ReceiverConfig, UdpReceiver};
use rocebus::clock::{now_ns, Mono};
use rocebus::counters::{Counter, CountersError, CountersFile};
use rocebus::idle::Idler;
use rocebus::mcast::NetError;
use rocebus::rdma_settings::export::RdmaCountersExport;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

/// Decode → book → publish, for one input message at a time. Generic over the sink so the
/// same path runs on the bus, in tests and in latency harnesses.
#[derive(Debug)]
pub struct Pipeline<S> {
    book: Book,
    publisher: Publisher<S>,
    malformed: u64,
    /// Exchange time of the last message decoded (stamps a [`FeedLoss`]).
    last_timestamp: u64,
    feed_losses: u64,
    log: RateLimitedLog,
}

impl<S: MdSink> Pipeline<S> {
    /// Publishes through `sink` on `partitions` channels; at most `log_per_sec` lines per
    /// second about bad messages.
    pub fn new(sink: S, partitions: u16, log_per_sec: u32) -> Self {
        Self {
            book: Book::new(),
            publisher: Publisher::new(sink, partitions),
            malformed: 0,
            last_timestamp: 0,
            feed_losses: 0,
            log: RateLimitedLog::new(log_per_sec),
        }
    }

    /// Applies one ITCH message received at `received_ns` (handed to
    /// [`MdSink::on_input`]). A message that does not decode is counted, logged at a
    /// bounded rate and skipped.
    pub fn on_message(&mut self, received_ns: u64, bytes: &[u8]) {
        self.publisher.sink_mut().on_input(received_ns);
        match itch::decode_exact(bytes) {
            Ok(m) => {
                self.last_timestamp = m.header().timestamp.nanos();
                self.book.apply(&m, &mut self.publisher)
            }
            Err(error) => {
                self.malformed += 1;
                if let Some(suppressed) = self.log.allow(Instant::now()) {
                    tracing::warn!(%error, suppressed, "skipping undecodable ITCH message");
                }
            }
        }
    }

    /// The exchange feed lost `loss` for good (after the message last given to
    /// [`Self::on_message`]): publishes a [`FeedLoss`] on every channel so that subscribers
    /// stop trusting every symbol (the gateway's risk fails closed), counts and logs it.
    pub fn on_feed_loss(&mut self, received_ns: u64, loss: Loss) {
        self.feed_losses += 1;
        self.publisher.sink_mut().on_input(received_ns);
        let mut m = FeedLoss::new(loss.from, loss.to, self.last_timestamp);
        m.header.ts_recv = zerocopy::byteorder::little_endian::U64::new(self.publisher.ts_recv());
        self.publisher.broadcast(m.as_bytes());
        if let Some(suppressed) = self.log.allow(Instant::now()) {
            tracing::warn!(
                from = loss.from,
                to = loss.to,
                suppressed,
                "exchange messages lost for good: announced on the bus, every symbol is suspect"
            );
        }
    }

    /// Stamps what the next input messages publish with the receive time of their exchange
    /// packet (UNIX nanoseconds; see [`crate::normalized::Header::ts_recv`]).
    pub fn set_ts_recv(&mut self, ts_recv: u64) {
        self.publisher.set_ts_recv(ts_recv);
    }

    /// Exchange losses announced with [`Self::on_feed_loss`].
    pub fn feed_losses(&self) -> u64 {
        self.feed_losses
    }

    /// The books.
    pub fn book(&self) -> &Book {
        &self.book
    }

    /// Published / refused totals.
    pub fn publish_counters(&self) -> &PublishCounters {
        self.publisher.counters()
    }

    /// Messages that did not decode.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    /// The sink.
    pub fn sink(&self) -> &S {
        self.publisher.sink()
    }

    /// The books and the sink at once (e.g. to poll bus publishers with the books as their
    /// snapshot source).
    pub fn parts_mut(&mut self) -> (&Book, &mut S) {
        (&self.book, self.publisher.sink_mut())
    }
}

impl<S: MdSink> FeedSink for Pipeline<S> {
    fn ts_recv(&mut self, ts_recv: u64) {
        self.set_ts_recv(ts_recv);
    }
    fn message(&mut self, received: u64, _sequence: u64, message: &[u8]) {
        self.on_message(received, message);
    }
    fn loss(&mut self, received: u64, loss: Loss) {
        self.on_feed_loss(received, loss);
    }
}

/// Why the service failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// `service.core` names a core this thread cannot be pinned to.
    #[error("service.core")]
    Pin(#[source] rocebus::idle::PinError),
    /// Fewer bus subscribers than `--wait-subscribers` asked for connected in time.
    #[error(transparent)]
    NoSubscribers(#[from] crate::bus::NoSubscribers),
    /// The capture file could not be read.
    #[error("cannot read capture {path}")]
    ReadCapture {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The capture file is not a BinaryFILE.
    #[error("{path} is not a BinaryFILE capture")]
    CaptureFormat {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: DetectError,
    },
    /// The feed's UDP sockets could not be opened or failed.
    #[error("UDP feed {group} (interface {interface}) failed")]
    Udp {
        /// The group.
        group: std::net::SocketAddr,
        /// The interface.
        interface: std::net::Ipv4Addr,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The bus publishers could not be opened or failed.
    #[error("market-data bus on {local_ip} failed")]
    Bus {
        /// The local RDMA address.
        local_ip: std::net::IpAddr,
        /// Cause.
        #[source]
        source: NetError,
    },
    /// The counters file could not be created.
    #[error("cannot create the counters file")]
    Counters(#[source] CountersError),
    /// A shared-memory stream (`publish.ipc_stream`) could not be created.
    #[error("cannot create the shared-memory streams {prefix}.<channel id>")]
    Ipc {
        /// `publish.ipc_stream`.
        prefix: String,
        /// Cause.
        #[source]
        source: rocebus::ipc::IpcError,
    },
}

/// Where ITCH comes from.
#[derive(Debug)]
enum Source {
    Udp(Box<UdpReceiver>),
    Capture(Capture),
}

/// A capture read as a stream, a batch of records per loop pass: memory is one chunk of
/// BinaryFILE bytes (and, for a packet capture, the reader's buffers), whatever its size.
#[derive(Debug)]
struct Capture {
    reader: StreamReader<CaptureReader>,
    path: PathBuf,
    done: bool,
    messages: u64,
    bad_records: u64,
}

/// Records read from a capture per loop pass, so the bus is polled often.
const CAPTURE_BATCH: usize = 64;

impl Capture {
    fn open(path: &Path, filter: &WireFilter) -> Result<Self, ServiceError> {
        // Any supported capture (BinaryFILE, pcap, pcapng, gzipped) as BinaryFILE bytes.
        let input = capture::open(path, filter).map_err(|source| ServiceError::ReadCapture {
            path: path.into(),
            source,
        })?;
        let mut reader = StreamReader::new(input);
        // The first chunk tells the framing: a file that is no capture fails here.
        reader.start().map_err(|source| {
            match source
                .get_ref()
                .and_then(|e| e.downcast_ref::<DetectError>())
            {
                Some(&source) => ServiceError::CaptureFormat {
                    path: path.into(),
                    source,
                },
                None => ServiceError::ReadCapture {
                    path: path.into(),
                    source,
                },
            }
        })?;
        Ok(Self {
            reader,
            path: path.into(),
            done: false,
            messages: 0,
            bad_records: 0,
        })
    }

    fn done(&self) -> bool {
        self.done
    }

    /// Hands up to [`CAPTURE_BATCH`] messages to `deliver`; returns how many records it read.
    fn feed(&mut self, mut deliver: impl FnMut(&[u8])) -> usize {
        if self.done {
            return 0;
        }
        let read = self.reader.read_records(CAPTURE_BATCH, |record| {
            // Bad records are counted and logged (rate-limited) by the reader.
            if let Ok(m) = record {
                deliver(m.as_bytes());
            }
        });
        let c = self.reader.counters();
        (self.messages, self.bad_records) = (c.messages, c.bad_records);
        let n = match read {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e,
                    "capture read failed: the rest of it is not read");
                0
            }
        };
        if n == 0 {
            self.done = true;
            let input = self.reader.get_ref();
            if let Some(w) = input.wire_report() {
                tracing::info!(path = %self.path.display(), "{}: {w}", input.kind());
            }
        }
        n
    }
}

/// How long the service runs.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Stop once the feed's end of session was received and every message before it
    /// delivered (or the capture file read), after serving bus recovery as
    /// `service.linger_ms` says.
    pub exit_on_end_of_session: bool,
    /// Before reading the feed, serve the bus alone until this many subscribers are
    /// connected (at most [`WAIT_SUBSCRIBERS_LIMIT`](crate::bus::WAIT_SUBSCRIBERS_LIMIT)):
    /// a capture replayed to recorders that must see it from its first message.
    pub wait_subscribers: usize,
}

/// Totals of a run, as also exported in the counters file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// MoldUDP64 packets accepted (capture: records read).
    pub packets: u64,
    /// ITCH messages delivered in sequence.
    pub messages: u64,
    /// MoldUDP64 gaps detected.
    pub gaps: u64,
    /// Re-requests sent to the exchange's retransmission server.
    pub re_requests: u64,
    /// Messages recovered through re-requests.
    pub recovered: u64,
    /// Messages given up as lost after the retries.
    pub lost: u64,
    /// Gaps given up as lost, each announced on the bus as a feed loss.
    pub unrecoverable_gaps: u64,
    /// Datagrams from senders not allowed (`feed.sources`, or not the retransmission
    /// server on the request socket): dropped unparsed.
    pub foreign_source: u64,
    /// Packets of a session other than the one locked onto: dropped.
    pub wrong_session: u64,
    /// Packets beyond the sequence window: dropped.
    pub far_ahead: u64,
    /// Packets beyond the claim threshold held as an unconfirmed jump: dropped.
    pub claimed: u64,
    /// Bad input skipped: invalid packets, undecodable messages, bad capture records.
    pub malformed: u64,
    /// Normalized messages published on the bus.
    pub published: u64,
    /// Bus back-pressure: messages the bus refused plus datagrams overwritten in the
    /// publisher history before pacing let them out.
    pub bus_back_pressure: u64,
    /// Datagrams multicast on the bus.
    pub bus_datagrams: u64,
    /// Bus retransmit requests served.
    pub bus_retransmit_requests: u64,
    /// Bus snapshots served to late joiners.
    pub bus_snapshots_served: u64,
    /// Bus recovery connections open now.
    pub bus_connections: u64,
    /// Bus recovery connections refused or dropped before admission: connection cap, bad
    /// hello, wrong proof of the secret (or a replayed handshake), no proof in time.
    pub bus_recovery_refused: u64,
    /// Bus recovery requests refused by the per-client limits (rate limits, full outbox),
    /// plus clients dropped for taking nothing.
    pub bus_recovery_limited: u64,
    /// Credit words refused from RC fan-out subscribers (forged or corrupt: behind the
    /// credit taken, or beyond what was sent, which also closes the connection).
    pub bus_bad_credits: u64,
}

/// Reads one total.
type Field = fn(&Totals) -> u64;

const EXPORTED: &[(&str, Field)] = &[
    ("packets", |t| t.packets),
    ("messages", |t| t.messages),
    ("gaps", |t| t.gaps),
    ("re_requests", |t| t.re_requests),
    ("recovered", |t| t.recovered),
    ("lost", |t| t.lost),
    ("unrecoverable_gaps", |t| t.unrecoverable_gaps),
    ("foreign_source", |t| t.foreign_source),
    ("wrong_session", |t| t.wrong_session),
    ("far_ahead", |t| t.far_ahead),
    ("claimed", |t| t.claimed),
    ("malformed", |t| t.malformed),
    ("published", |t| t.published),
    ("bus_back_pressure", |t| t.bus_back_pressure),
    ("bus_datagrams", |t| t.bus_datagrams),
    ("bus_retransmit_requests", |t| t.bus_retransmit_requests),
    ("bus_snapshots_served", |t| t.bus_snapshots_served),
    ("bus_connections", |t| t.bus_connections),
    ("bus_recovery_refused", |t| t.bus_recovery_refused),
    ("bus_recovery_limited", |t| t.bus_recovery_limited),
    ("bus_bad_credits", |t| t.bus_bad_credits),
];

/// The feed handler service. See the module docs.
#[derive(Debug)]
pub struct Service {
    config: Config,
    pipeline: Pipeline<BusSink>,
    source: Source,
    counters: Vec<(Counter, Field)>,
    /// Per channel: the bus publisher's repair counters and subscriber rows
    /// (`md.pub.ch<i>.*`).
    bus_counters: Vec<rocebus::mcast::io::PublisherCountersExport>,
    /// The GID, traffic class and registered memory (`rdma.*`).
    rdma: Option<RdmaCountersExport>,
    _counters_file: Option<CountersFile>,
}

/// Subscriber rows each channel's publisher shows in the counters file.
const SUBSCRIBER_SLOTS: usize = 8;

impl Service {
    /// Opens the input (the capture in `config.feed.capture`, else the UDP feed) and the
    /// bus publishers, and allocates counters in `counters` if given
    /// (`rocebus::counters::counters_path(&default_dir(), "feed-handler")` in production).
    pub fn new(config: Config, counters: Option<&Path>) -> Result<Self, ServiceError> {
        let source = match &config.feed.capture {
            Some(path) => Source::Capture(Capture::open(
                path,
                &WireFilter {
                    dst_ports: config.feed.capture_dst_ports.clone(),
                    dst_addrs: config.feed.capture_dst_addrs.clone(),
                },
            )?),
            None => {
                let f = &config.feed;
                let udp_err = |source| ServiceError::Udp {
                    group: f.group,
                    interface: f.interface,
                    source,
                };
                if f.sources.is_empty() {
                    tracing::warn!(
                        group = %f.group,
                        "feed.sources is not set: MoldUDP64 is accepted from any sender; \
                         list the exchange's addresses to drop forged packets"
                    );
                }
                if f.retrans_server.is_none() {
                    tracing::warn!(
                        "feed.retrans_server is not set: every exchange gap is lost and \
                         announced on the bus"
                    );
                }
                Source::Udp(Box::new(
                    UdpReceiver::new(&ReceiverConfig {
                        group: f.group,
                        interface: f.interface,
                        sources: f.sources.clone(),
                        retrans_server: f.retrans_server,
                        gap: config.gap_config(),
                        recv_buffer: f.recv_buffer_bytes,
                    })
                    .map_err(udp_err)?,
                ))
            }
        };
        let session = match config.publish.session {
            0 => wall_clock_session(),
            s => s,
        };
        let bus = BusSink::new(&config.market_data, session, config.publish.local_ip).map_err(
            |source| ServiceError::Bus {
                local_ip: config.publish.local_ip,
                source,
            },
        )?;
        let bus = match &config.publish.ipc_stream {
            Some(prefix) => {
                let ids: Vec<u16> = config.market_data.channels.iter().map(|c| c.id).collect();
                let ipc =
                    IpcSink::create(prefix, &ids, &config.ipc_config()).map_err(|source| {
                        ServiceError::Ipc {
                            prefix: prefix.clone(),
                            source,
                        }
                    })?;
                tracing::info!(
                    streams = %format!("{prefix}.<channel id>"),
                    "publishing on shared memory too"
                );
                bus.with_ipc(ipc)
            }
            None => bus,
        };
        let pipeline = Pipeline::new(
            bus,
            config.partitions(),
            config.service.bad_input_log_per_sec,
        );
        let mut rdma = None;
        let (file, counters, bus_counters) = match counters {
            Some(path) => {
                let channels = pipeline.sink().channels();
                // Each channel: 8 totals and a row of 5 per subscriber slot.
                let per_channel = 8 + 5 * SUBSCRIBER_SLOTS as u32;
                let file = CountersFile::create(path, 80 + u32::from(channels) * per_channel)
                    .map_err(ServiceError::Counters)?;
                let c = EXPORTED
                    .iter()
                    .map(|(name, f)| Ok((file.allocate(&format!("feed.{name}"))?, *f)))
                    .collect::<Result<Vec<_>, CountersError>>()
                    .map_err(ServiceError::Counters)?;
                let b = (0..channels)
                    .map(|i| {
                        rocebus::mcast::io::PublisherCountersExport::new(
                            &file,
                            &format!("md.pub.ch{i}"),
                            SUBSCRIBER_SLOTS,
                        )
                    })
                    .collect::<Result<Vec<_>, CountersError>>()
                    .map_err(ServiceError::Counters)?;
                // The GID the bus sends from, logged too.
                rdma = Some(
                    RdmaCountersExport::for_address(
                        &file,
                        "rdma",
                        config.rdma.ud_class(),
                        config.publish.local_ip,
                        "bus",
                    )
                    .map_err(ServiceError::Counters)?,
                );
                (Some(file), c, b)
            }
            None => (None, Vec::new(), Vec::new()),
        };
        Ok(Self {
            config,
            pipeline,
            source,
            counters,
            bus_counters,
            rdma,
            _counters_file: file,
        })
    }

    /// The pipeline (books, publish totals, bus publishers).
    pub fn pipeline(&self) -> &Pipeline<BusSink> {
        &self.pipeline
    }

    /// Totals so far.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        match &self.source {
            Source::Udp(r) => {
                let c = r.tracker().counters();
                t.packets = c.packets;
                t.messages = c.messages;
                t.gaps = c.gaps;
                t.re_requests = c.requests;
                t.recovered = c.recovered;
                t.lost = c.lost;
                t.unrecoverable_gaps = c.unrecoverable;
                t.wrong_session = c.wrong_session;
                t.far_ahead = c.far_ahead;
                t.claimed = c.claimed;
                t.foreign_source = r.ingress().foreign_source();
                t.malformed = c.malformed;
            }
            Source::Capture(c) => {
                t.packets = c.messages + c.bad_records;
                t.messages = c.messages;
                t.malformed = c.bad_records;
            }
        }
        t.malformed += self.pipeline.malformed();
        let p = self.pipeline.publish_counters();
        let io = self.pipeline.sink().io_stats();
        t.published = p.published;
        t.bus_back_pressure = p.failed + io.unsent_overwritten;
        t.bus_datagrams = io.datagrams_sent;
        t.bus_retransmit_requests = io.retransmit_requests;
        t.bus_snapshots_served = io.snapshots_served;
        t.bus_connections = self.pipeline.sink().connections() as u64;
        t.bus_recovery_refused = io.connections_refused + io.auth_failures + io.handshake_timeouts;
        t.bus_recovery_limited = io.requests_rate_limited
            + io.snapshots_rate_limited
            + io.requests_dropped
            + io.clients_stalled;
        t.bus_bad_credits = rocebus::orders::bad_credits_total();
        t
    }

    fn export(&self) {
        if self.counters.is_empty() {
            return;
        }
        let t = self.totals();
        for (c, f) in &self.counters {
            c.set(f(&t));
        }
        for (i, b) in self.bus_counters.iter().enumerate() {
            // The per-subscriber rows are multicast's; an RC channel's totals are in
            // the feed's own counters (`io_stats`).
            if let Some(p) = self.pipeline.sink().multicast(i as u16) {
                b.update(p);
            }
        }
        if let Some(r) = &self.rdma {
            r.update();
        }
    }

    fn input_ended(&self) -> bool {
        match &self.source {
            Source::Udp(r) => r.tracker().is_complete(),
            Source::Capture(c) => c.done(),
        }
    }

    /// Runs the busy-polling loop until `stop` is set (by a signal handler), `duration`
    /// passes, or, with `exit_on_end_of_session`, the feed ended and bus recovery was
    /// served. Pins the thread first if `service.core` says so.
    pub fn run(&mut self, opts: &RunOptions, stop: &AtomicBool) -> Result<Totals, ServiceError> {
        if let Some(core) = self.config.service.core {
            rocebus::idle::pin_to(core).map_err(ServiceError::Pin)?;
        }
        let local_ip = self.config.publish.local_ip;
        let bus_err = |source| ServiceError::Bus { local_ip, source };
        let (group, interface) = (self.config.feed.group, self.config.feed.interface);
        let udp_err = |source| ServiceError::Udp {
            group,
            interface,
            source,
        };
        let mut idler = Idler::new(self.config.service.idle);
        let start = Instant::now();
        let counters_every = self.config.service.counters_interval_ms * 1_000_000;
        let linger = Duration::from_millis(self.config.service.linger_ms);
        let mut next_export = 0;
        // Set once the feed has ended: (when, recovery work seen, last time it changed).
        let mut draining: Option<(u64, Instant)> = None;
        // The bus alone until the subscribers asked for are in (the feed is not read yet).
        crate::bus::wait_for_subscribers(opts.wait_subscribers, stop, |now| {
            let (book, bus) = self.pipeline.parts_mut();
            bus.set_now(now);
            bus.poll(now, book).map_err(bus_err)?;
            Ok::<_, ServiceError>(self.pipeline.sink().connections())
        })?;
        loop {
            // ORDERING: Relaxed: a flag with no data attached; the loop re-reads it each pass.
            if stop.load(Ordering::Relaxed) || opts.duration.is_some_and(|d| start.elapsed() >= d) {
                break;
            }
            let now = now_ns();
            let mut work = 0;
            let pipeline = &mut self.pipeline;
            pipeline.parts_mut().1.set_now(Mono::from_nanos(now));
            match &mut self.source {
                Source::Udp(r) => {
                    let got = r.poll_timed(&mut now_ns, pipeline).map_err(udp_err)?;
                    work += usize::from(got);
                }
                Source::Capture(c) => {
                    // A capture holds no receive time: the read time stands for it.
                    pipeline.set_ts_recv(crate::udp::unix_now_ns());
                    work += c.feed(|m| pipeline.on_message(now, m));
                }
            }
            let (book, bus) = pipeline.parts_mut();
            work += bus.poll(Mono::from_nanos(now), book).map_err(bus_err)?;
            if now >= next_export {
                next_export = now + counters_every;
                self.export();
            }
            if opts.exit_on_end_of_session && self.input_ended() {
                let io = self.pipeline.sink().io_stats();
                let served = io.retransmit_requests + io.snapshots_served;
                match &mut draining {
                    None => {
                        self.pipeline
                            .parts_mut()
                            .1
                            .flush(Mono::from_nanos(now))
                            .map_err(bus_err)?;
                        tracing::info!("feed ended; serving bus recovery before exit");
                        draining = Some((served, Instant::now()));
                    }
                    Some((seen, since)) => {
                        if *seen != served {
                            *seen = served;
                            *since = Instant::now();
                        }
                        if self.pipeline.sink().connections() == 0 || since.elapsed() >= linger {
                            break;
                        }
                    }
                }
            }
            idler.idle(work);
        }
        self.pipeline
            .parts_mut()
            .1
            .flush(Mono::now())
            .map_err(bus_err)?;
        self.export();
        Ok(self.totals())
    }
}

/// A bus session id that grows across restarts: microseconds since the Unix epoch.
fn wall_clock_session() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binaryfile::{self, Reader};
    use crate::generate::{generate, GenConfig};
    use crate::view::{book_l2, MarketView};

    /// A sink that applies what it is given to one view per partition, the way subscribers
    /// of each channel would.
    struct Views(Vec<MarketView>, u64);
    impl MdSink for Views {
        type Error = std::convert::Infallible;
        fn publish(&mut self, channel: u16, message: &[u8]) -> Result<(), Self::Error> {
            self.0[usize::from(channel)]
                .apply(message)
                .expect("valid normalized message");
            Ok(())
        }
        fn on_input(&mut self, received_ns: u64) {
            self.1 = received_ns;
        }
    }

    /// Every message published from an input carries the receive stamp set before it, and a
    /// feed loss the stamp of the moment it was declared.
    #[test]
    fn published_messages_carry_ts_recv() {
        struct Stamps(Vec<(u8, u64)>);
        impl MdSink for Stamps {
            type Error = ();
            fn publish(&mut self, _channel: u16, message: &[u8]) -> Result<(), ()> {
                let ts = u64::from_le_bytes(message[20..28].try_into().unwrap());
                self.0.push((message[0], ts));
                Ok(())
            }
        }
        let mut p = Pipeline::new(Stamps(Vec::new()), 2, 1);
        let mut stamp = 1_700_000_000_000_000_000u64;
        generate(
            &GenConfig {
                seed: 4,
                messages: 500,
                symbols: 4,
            },
            |m| {
                stamp += 1000;
                p.set_ts_recv(stamp);
                let before = p.sink().0.len();
                p.on_message(0, m);
                assert!(p.sink().0[before..].iter().all(|&(_, t)| t == stamp));
            },
        );
        assert!(p.sink().0.len() > 100);
        p.set_ts_recv(42);
        p.on_feed_loss(0, Loss { from: 5, to: 9 });
        let tail = &p.sink().0[p.sink().0.len() - 2..];
        assert_eq!(tail, &[(crate::normalized::KIND_FEED_LOSS, 42); 2]);
    }

    #[test]
    fn pipeline_counts_bad_messages_and_publishes_the_rest() {
        let mut p = Pipeline::new(Views(vec![MarketView::new(), MarketView::new()], 0), 2, 1);
        let mut n = 0;
        generate(
            &GenConfig {
                seed: 2,
                messages: 3_000,
                symbols: 8,
            },
            |m| {
                n += 1;
                p.on_message(n, m);
                // Truncated and unknown-type messages between the good ones.
                p.on_message(n, &m[..m.len() - 1]);
                p.on_message(n, b"?junk");
            },
        );
        assert_eq!(p.malformed(), 2 * n);
        assert_eq!(p.sink().1, n, "on_input saw the receive time");
        assert_eq!(p.book().counters().messages, n);
        for c in 0..2u16 {
            assert_eq!(
                p.sink().0[usize::from(c)].l2(),
                book_l2(p.book(), |l| l % 2 == c)
            );
        }
        assert!(p.publish_counters().published > 0 && p.publish_counters().failed == 0);
    }

    #[test]
    fn feed_loss_is_published_on_every_channel_in_order() {
        let mut p = Pipeline::new(Views(vec![MarketView::new(), MarketView::new()], 0), 2, 1);
        let mut before = 0;
        generate(
            &GenConfig {
                seed: 3,
                messages: 200,
                symbols: 4,
            },
            |m| {
                before += 1;
                p.on_message(1, m);
            },
        );
        let published = p.publish_counters().published;
        // Through the feed socket's sink interface, as the UDP receiver hands it over.
        FeedSink::loss(&mut p, 7, Loss { from: 201, to: 260 });
        assert_eq!(p.feed_losses(), 1);
        assert_eq!(p.sink().1, 7, "stamped with the timeout's time");
        assert_eq!(
            p.publish_counters().published,
            published + 2,
            "one per channel"
        );
        for v in &p.sink().0 {
            assert_eq!(v.counters().feed_losses, 1);
        }
    }

    #[test]
    fn feed_loss_carries_the_range_and_last_exchange_time() {
        struct Last(Vec<(u16, Vec<u8>)>);
        impl MdSink for Last {
            type Error = std::convert::Infallible;
            fn publish(&mut self, channel: u16, message: &[u8]) -> Result<(), Self::Error> {
                self.0.push((channel, message.to_vec()));
                Ok(())
            }
        }
        let mut p = Pipeline::new(Last(Vec::new()), 3, 1);
        let mut last_ts = 0;
        generate(
            &GenConfig {
                seed: 1,
                messages: 50,
                symbols: 2,
            },
            |m| {
                last_ts = itch::decode_exact(m).unwrap().header().timestamp.nanos();
                p.on_message(0, m);
            },
        );
        let n = p.sink().0.len();
        p.on_feed_loss(0, Loss { from: 51, to: 53 });
        let tail = &p.sink().0[n..];
        assert_eq!(tail.len(), 3);
        for (i, (channel, bytes)) in tail.iter().enumerate() {
            assert_eq!(usize::from(*channel), i);
            let Ok(crate::normalized::Normalized::FeedLoss(l)) = crate::normalized::decode(bytes)
            else {
                panic!("feed loss expected")
            };
            assert_eq!(
                (l.from.get(), l.to.get(), l.header.timestamp.get()),
                (51, 53, last_ts)
            );
            assert_eq!(l.header.stock, [b' '; 8]);
        }
    }

    #[test]
    fn capture_is_read_in_batches_with_bad_records_counted() {
        let mut data = Vec::new();
        let mut messages = 0u64;
        generate(
            &GenConfig {
                seed: 4,
                messages: 500,
                symbols: 4,
            },
            |m| {
                messages += 1;
                binaryfile::push_record(&mut data, m);
            },
        );
        // An unknown type in the middle: one bad record, reading goes on.
        let mut bad = Vec::new();
        binaryfile::push_record(&mut bad, b"?12345");
        let mid = data.len() / 2;
        let mid = {
            // Cut at a record boundary.
            let mut r = Reader::new(&data).unwrap();
            for _ in r.by_ref().take(200) {}
            let _ = mid;
            r.position()
        };
        data.splice(mid..mid, bad);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("day.itch");
        std::fs::write(&path, &data).unwrap();
        let mut c = Capture::open(&path, &WireFilter::default()).unwrap();
        let mut got = 0u64;
        let mut passes = 0;
        while !c.done() {
            assert!(c.feed(|_| got += 1) <= CAPTURE_BATCH);
            passes += 1;
        }
        assert_eq!((got, c.messages, c.bad_records), (messages, messages, 1));
        assert!(passes > 500 / CAPTURE_BATCH);
        assert!(matches!(
            Capture::open(&dir.path().join("missing"), &WireFilter::default()),
            Err(ServiceError::ReadCapture { .. })
        ));
    }
    #[test]
    fn capture_may_be_a_gzipped_pcap_of_two_feeds_filtered_by_port() {
        use crate::moldudp64::session;
        use crate::pcap::synth::{self, Frame, PcapFile};
        use std::io::Write as _;
        let mut messages = Vec::new();
        generate(
            &GenConfig {
                seed: 4,
                messages: 500,
                symbols: 4,
            },
            |m| messages.push(m.to_vec()),
        );
        let packets = synth::moldudp64_packets(session("S"), 1, &messages, 500);
        let mut pcap = PcapFile::new(1, false, false);
        for (i, (_, p)) in packets.iter().enumerate() {
            for port in [26477, 26478] {
                // Packet 2 only on port 26478.
                if i != 2 || port == 26478 {
                    let f = Frame {
                        dst_port: port,
                        ..Frame::default()
                    };
                    pcap.record(i as u64 * 1000, &synth::udp_frame(&f, p), None);
                }
            }
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&pcap.into_bytes()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("day.pcap.gz");
        std::fs::write(&path, gz.finish().unwrap()).unwrap();
        let read = |filter: &WireFilter| {
            let mut c = Capture::open(&path, filter).unwrap();
            let mut got = Vec::new();
            while !c.done() {
                c.feed(|m| got.push(m.to_vec()));
            }
            got
        };
        assert_eq!(
            read(&WireFilter::default()),
            messages,
            "A/B duplicates once"
        );
        let only_a = read(&WireFilter {
            dst_ports: vec![26477],
            dst_addrs: vec![],
        });
        let lost = packets[3].0 - packets[2].0;
        assert_eq!(only_a.len() as u64, messages.len() as u64 - lost);
    }
}
