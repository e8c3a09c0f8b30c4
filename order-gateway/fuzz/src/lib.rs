//! What the gateway fuzz targets share: a fixed risk and session configuration, a gateway
//! logged on to a venue the harness plays, FIX frames built the way a venue frames them, and
//! the invariants checked after every step.
//!
//! Everything here is deterministic: a target's input alone decides what happens, so every
//! crash reproduces from its input file.

use order_gateway::fix::{MessageWriter, SessionConfig, SessionCounters, SessionState};
use order_gateway::gateway::{EngineId, Gateway, GatewayCounters, Order, OrderStatus, Outputs};
use order_gateway::journal::{decode_record, encode_record};
use order_gateway::proto::{
    Cancel, NewOrder, Replace, Request, Side, Symbol, TimeInForce, PRICE_SCALE,
};
use order_gateway::risk::RiskConfig;

/// One second in nanoseconds.
pub const SEC: u64 = 1_000_000_000;
/// 2024-01-02 15:00:00 UTC: the start of every run.
pub const T0: u64 = 1_704_207_600 * SEC;
/// Engines the targets talk as: 1 and 2 are configured, 3 is not.
pub const ENGINES: [EngineId; 3] = [1, 2, 3];
/// Accounts of the risk configuration (engine 1 trades 7, engine 2 trades 7 and 8).
pub const ACCOUNTS: [u32; 2] = [7, 8];
/// Reference price of every symbol, whole units.
pub const REF_PX: i64 = 100;

/// The symbols orders use; `HALT` is halted at start, `NOREF` has no reference price.
pub fn symbols() -> [Symbol; 4] {
    ["AAPL", "MSFT", "HALT", "NOREF"].map(|s| Symbol::new(s).expect("valid symbol"))
}

/// Limits loose enough that orders get through, tight enough that every check can trip
/// (parsed once: it would cost more than a whole run).
pub fn risk_config() -> &'static RiskConfig {
    static CONFIG: std::sync::OnceLock<RiskConfig> = std::sync::OnceLock::new();
    CONFIG.get_or_init(parse_risk_config)
}

fn parse_risk_config() -> RiskConfig {
    toml::from_str(
        r#"
        reference_max_age_ms = 60000
        throttle_interval_ms = 1000
        restricted_symbols = ["BAD"]
        max_identical_orders = 4
        max_malformed_frames = 20
        [firm]
        max_open_orders = 45
        max_gross_notional = 2000000
        [[accounts]]
        id = 7
        max_order_qty = 1000
        max_order_notional = 1000000
        credit_limit = 10000000
        max_position = 5000
        max_open_orders = 40
        max_orders_per_interval = 50
        collar_bps = 500
        [[accounts]]
        id = 8
        max_order_qty = 500
        max_order_notional = 50000
        credit_limit = 200000
        max_position = 800
        max_open_orders = 10
        max_orders_per_interval = 20
        max_cancels_per_interval = 8
        max_replaces_per_interval = 6
        collar_bps = 1000
        [[engines]]
        id = 1
        accounts = [7]
        token = "e1"
        [[engines]]
        id = 2
        accounts = [7, 8]
        token = "e2"
        "#,
    )
    .expect("the fuzz risk config parses")
}

/// Our side is `GW`, the venue `VENUE`, 30 s heartbeats.
pub fn session_config() -> SessionConfig {
    SessionConfig {
        sender_comp_id: "GW".into(),
        target_comp_id: "VENUE".into(),
        heartbeat_secs: 30,
        resend_timeout_ms: 0,
        ..Default::default()
    }
}

/// A fresh gateway with the fuzz configuration (no references, nothing journaled).
pub fn new_gateway() -> Gateway {
    Gateway::new(session_config(), risk_config())
        .expect("the fuzz risk config is valid")
        .with_response_history(256)
}

/// A venue frame of type `ty` with the standard header (sequence `seq`) and `fields`, a run
/// of `tag=value\x01` fields.
pub fn venue_frame(ty: &[u8], seq: u64, now: u64, fields: &[u8]) -> Vec<u8> {
    let mut w = MessageWriter::default();
    w.start(ty)
        .field(49, b"VENUE")
        .field(56, b"GW")
        .uint(34, seq)
        .timestamp(52, now)
        .raw_fields(fields);
    let mut out = Vec::new();
    w.finish(&mut out);
    out
}

/// `fields` framed as they are, with a correct BodyLength and CheckSum: the fuzzer writes the
/// body, so the frame is not dropped for a checksum it could never guess.
pub fn frame_body(fields: &[u8]) -> Vec<u8> {
    let mut w = MessageWriter::default();
    w.raw_fields(fields);
    let mut out = Vec::new();
    w.finish(&mut out);
    out
}

/// `body` (ideally `35=X\x01` then other fields) framed with the header the gateway expects
/// next (CompIDs, the next inbound sequence number, SendingTime) inserted after MsgType.
pub fn frame_in_sequence(gw: &Gateway, body: &[u8], now: u64) -> Vec<u8> {
    let (ty, rest) = match body.strip_prefix(b"35=") {
        Some(b) => match b.iter().position(|&c| c == 1) {
            Some(end) => (&b[..end], &b[end + 1..]),
            None => (b, &b""[..]),
        },
        None => (&b"8"[..], body),
    };
    venue_frame(ty, gw.session().next_in(), now, rest)
}

/// A venue execution report for ClOrdID `cl` (a gateway request id).
#[allow(clippy::too_many_arguments)]
pub fn exec_report(
    seq: u64,
    now: u64,
    cl: u64,
    exec_id: u64,
    exec_type: u8,
    last: u32,
    px: i64,
    cum: u32,
    leaves: u32,
    exec_ref: Option<u64>,
) -> Vec<u8> {
    let mut f = format!(
        "37=V{cl}\x0117=X{exec_id}\x0111={cl}\x01150={}\x0139=0\x0155=AAPL\x0154=1\x01\
         32={last}\x0131={}.{:04}\x0114={cum}\x01151={leaves}\x016=0\x01",
        exec_type as char,
        px / PRICE_SCALE,
        px.rem_euclid(PRICE_SCALE),
    );
    if let Some(r) = exec_ref {
        f.push_str(&format!("19=X{r}\x01"));
    }
    venue_frame(b"8", seq, now, f.as_bytes())
}

/// A venue OrderCancelReject for request `cl` of order `orig`.
pub fn cancel_reject(seq: u64, now: u64, cl: u64, orig: u64) -> Vec<u8> {
    let f = format!("37=V{orig}\x0111={cl}\x0141={orig}\x0139=0\x01434=1\x0158=no\x01");
    venue_frame(b"9", seq, now, f.as_bytes())
}

/// Request frame bytes, numbered `seq` (0: unnumbered).
pub fn numbered(mut r: Request, seq: u32) -> Vec<u8> {
    r.set_seq(seq);
    r.as_bytes().to_vec()
}

/// A new order frame.
pub fn new_order(cl: u64, account: u32, symbol: Symbol, sell: bool, qty: u32, px: i64) -> Request {
    let side = if sell { Side::Sell } else { Side::Buy };
    Request::NewOrder(NewOrder::new(
        cl,
        account,
        symbol,
        side,
        qty,
        px,
        TimeInForce::Day,
    ))
}

/// A cancel frame.
pub fn cancel(cl: u64) -> Request {
    Request::Cancel(Cancel::new(cl))
}

/// A replace frame.
pub fn replace(cl: u64, qty: u32, px: i64) -> Request {
    Request::Replace(Replace::new(cl, qty, px))
}

/// A gateway plus what a driver would do with its outputs: journal bytes kept (they are the
/// replay input), everything else dropped, the venue transport closed when asked.
#[derive(Debug)]
pub struct Harness {
    /// The gateway under test.
    pub gw: Gateway,
    /// Outputs of the current step.
    pub out: Outputs,
    /// Every journal record produced since the gateway was built.
    pub journal: Vec<u8>,
    /// Records in `journal`.
    pub journal_records: u64,
    /// The clock.
    pub now: u64,
    seen: Seen,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// A gateway with fresh reference prices and the `HALT` symbol halted, not connected.
    pub fn new() -> Harness {
        let mut gw = new_gateway();
        let [aapl, msft, halt, _] = symbols();
        for s in [aapl, msft, halt] {
            gw.on_reference_price(s, REF_PX * PRICE_SCALE, T0);
        }
        gw.on_halt(halt, true);
        let seen = Seen::of(&gw);
        Harness {
            gw,
            out: Outputs::default(),
            journal: Vec::new(),
            journal_records: 0,
            now: T0,
            seen,
        }
    }

    /// Connects and answers our Logon with the venue's: the session is active.
    pub fn logon(&mut self) {
        self.gw.on_connect(self.now, &mut self.out);
        self.step();
        let seq = self.gw.session().next_in();
        let logon = venue_frame(b"A", seq, self.now, b"98=0\x01108=30\x01");
        self.gw.on_fix_bytes(&logon, self.now, &mut self.out);
        self.step();
        assert_eq!(self.gw.session().state(), SessionState::Active);
    }

    /// Venue bytes, as the driver feeds them: not while the transport is down.
    pub fn venue(&mut self, bytes: &[u8]) {
        if self.gw.session().state() != SessionState::Disconnected {
            self.gw.on_fix_bytes(bytes, self.now, &mut self.out);
        }
        self.step();
    }

    /// One engine frame.
    pub fn engine(&mut self, engine: EngineId, bytes: &[u8]) {
        self.gw
            .on_engine_message(engine, bytes, self.now, &mut self.out);
        self.step();
    }

    /// Timers, `advance` nanoseconds later.
    pub fn timer(&mut self, advance: u64) {
        self.now += advance;
        self.gw.on_timer(self.now, &mut self.out);
        self.step();
    }

    /// The venue transport drops and comes back (our Logon goes out; the venue's is up to the
    /// caller).
    pub fn reconnect(&mut self) {
        self.gw.on_disconnect();
        self.gw.on_connect(self.now, &mut self.out);
        self.step();
    }

    /// A checkpoint, as the driver takes one when it starts a journal segment: its record
    /// goes into the journal (so the final replay goes through it) and the gateway drops
    /// what it leaves out.
    pub fn checkpoint(&mut self) {
        let payload = self.gw.checkpoint().expect("a checkpoint encodes");
        encode_record(
            &mut self.journal,
            order_gateway::gateway::record::CHECKPOINT,
            &[&payload],
        );
        self.journal_records += 1;
        self.gw.checkpoint_written();
        check_state(&self.gw);
        // A gateway built from it is checked at the end: the final replay goes through
        // every checkpoint record, and one built afresh per checkpoint costs a whole
        // gateway (megabytes) per call.
    }

    /// After every gateway call: checks the outputs and the invariants, keeps the journal,
    /// and acts on a disconnect as the driver does.
    pub fn step(&mut self) {
        check_outputs(&self.out);
        self.journal.extend_from_slice(&self.out.journal);
        self.journal_records += u64::from(self.out.journal_records);
        check_responses(&self.gw, &self.out, &self.seen);
        check_state(&self.gw);
        self.seen.advance(&self.gw);
        let disconnect = self.out.disconnect;
        self.out.clear();
        if disconnect {
            self.gw.on_disconnect();
        }
    }

    /// A fresh gateway built from this one's journal only, compared with this one: the
    /// journal must rebuild orders, risk and every sequence number.
    pub fn check_replay(&self) {
        let mut r = new_gateway();
        let mut rest = &self.journal[..];
        let mut n = 0;
        while let Some((kind, payload, len)) = decode_record(rest) {
            r.replay_record(kind, payload);
            rest = &rest[len..];
            n += 1;
        }
        assert!(rest.is_empty(), "journal bytes left after its records");
        assert_eq!(n, self.journal_records);
        assert!(r.take_replay_error().is_none(), "every checkpoint reads back");
        check_state(&r);
        same_gateway(&self.gw, &r, self.now);
    }
}

/// Two gateways hold the same orders, risk, request and response numbers per engine, and
/// FIX sequence numbers.
pub fn same_gateway(live: &Gateway, rebuilt: &Gateway, now: u64) {
    {
        assert_eq!(live.open_order_count(), rebuilt.open_order_count());
        for e in ENGINES {
            assert_eq!(
                live.last_request_seq(e),
                rebuilt.last_request_seq(e),
                "engine {e}"
            );
            assert_eq!(
                live.last_response_seq(e),
                rebuilt.last_response_seq(e),
                "engine {e}"
            );
        }
        let (ls, rs) = (live.session(), rebuilt.session());
        assert_eq!((ls.next_out(), ls.next_in()), (rs.next_out(), rs.next_in()));
        let mut a: Vec<(u64, &Order)> = live.orders().collect();
        let mut b: Vec<(u64, &Order)> = rebuilt.orders().collect();
        a.sort_unstable_by_key(|(id, _)| *id);
        b.sort_unstable_by_key(|(id, _)| *id);
        assert_eq!(a.len(), b.len());
        for ((ia, oa), (ib, ob)) in a.iter().zip(&b) {
            assert_eq!(ia, ib);
            assert_eq!(
                (
                    oa.engine,
                    oa.cl_ord_id,
                    oa.cum_qty,
                    oa.status,
                    oa.venue_cl_ord_id
                ),
                (
                    ob.engine,
                    ob.cl_ord_id,
                    ob.cum_qty,
                    ob.status,
                    ob.venue_cl_ord_id
                ),
                "order {ia}"
            );
            let (pa, pb) = (oa.params, ob.params);
            assert_eq!(
                (pa.account, pa.symbol, pa.side, pa.qty, pa.price),
                (pb.account, pb.symbol, pb.side, pb.qty, pb.price),
                "order {ia}"
            );
        }
        let (lr, rr) = (live.risk(), rebuilt.risk());
        assert_eq!(lr.firm_exposure(), rr.firm_exposure());
        for acct in ACCOUNTS {
            assert_eq!(lr.open_orders(acct), rr.open_orders(acct), "account {acct}");
            assert_eq!(lr.exposure(acct), rr.exposure(acct), "account {acct}");
            assert_eq!(
                lr.throttle_usage(acct, now),
                rr.throttle_usage(acct, now),
                "throttles of account {acct}"
            );
            for s in symbols() {
                assert_eq!(lr.position(acct, s), rr.position(acct, s), "{acct} {s}");
            }
        }
        for (_, o) in &a {
            assert_eq!(
                lr.identical_count(&o.params, now),
                rr.identical_count(&o.params, now),
                "repeated-order count of {:?}",
                o.params
            );
        }
        for e in ENGINES {
            assert_eq!(
                live.malformed_since_logon(e),
                rebuilt.malformed_since_logon(e),
                "malformed frames of engine {e}"
            );
        }
    }
}

/// Every journal record decodes, and `journal_records` counts them.
fn check_outputs(out: &Outputs) {
    let mut rest = &out.journal[..];
    let mut n = 0u32;
    while let Some((kind, _, len)) = decode_record(rest) {
        assert_ne!(kind, 0, "kind 0 is the journal's own");
        rest = &rest[len..];
        n += 1;
    }
    assert!(rest.is_empty(), "a journal record does not decode");
    assert_eq!(n, out.journal_records);
}

/// Numbered responses continue each engine's numbers without a gap or repeat.
fn check_responses(gw: &Gateway, out: &Outputs, seen: &Seen) {
    let mut last = seen.last_response;
    for (engine, r) in &out.engine {
        let i = ENGINES.iter().position(|e| e == engine);
        let i = i.expect("responses only go to engines that spoke");
        last[i] += 1;
        assert_eq!(r.seq(), last[i], "response numbers of engine {engine}");
    }
    for (i, e) in ENGINES.iter().enumerate() {
        assert_eq!(gw.last_response_seq(*e), last[i]);
    }
    for (_, r) in &out.info {
        assert_eq!(r.seq(), 0, "informational responses are unnumbered");
    }
}

/// What the gateway's state must satisfy after any call.
pub fn check_state(gw: &Gateway) {
    // One pass over the order map (it is allocated for a day of orders, so every pass costs).
    let mut open = 0;
    let mut per_account = [(0usize, 0i128); ACCOUNTS.len()];
    for (id, o) in gw.orders() {
        let found = gw.order(o.engine, o.cl_ord_id);
        assert!(
            found.is_some_and(|f| std::ptr::eq(f, o)),
            "order {id} not found under its engine's id"
        );
        if o.status == OrderStatus::Done {
            continue;
        }
        open += 1;
        if let Some(i) = ACCOUNTS.iter().position(|&a| a == o.params.account) {
            // What is reserved: the unexecuted part of a live order, on its confirmed terms.
            let leaves = o.params.qty.saturating_sub(o.cum_qty);
            per_account[i].0 += 1;
            per_account[i].1 += i128::from(leaves) * i128::from(o.params.price.abs());
        }
    }
    assert_eq!(gw.open_order_count(), open, "kept open-order count");
    for (acct, (orders, reserved)) in ACCOUNTS.into_iter().zip(per_account) {
        let risk = gw.risk();
        assert_eq!(
            risk.open_orders(acct) as usize,
            orders,
            "risk's open orders of account {acct}"
        );
        let (open_notional, _) = risk.exposure(acct);
        assert!(
            open_notional >= 0,
            "open notional of account {acct} below zero"
        );
        assert_eq!(
            i128::from(open_notional),
            reserved / i128::from(PRICE_SCALE),
            "open notional of account {acct} is not what its live orders reserve"
        );
    }
}

/// The monotonic part of the state, as of the previous step.
#[derive(Debug)]
struct Seen {
    gateway: [u64; 21],
    session: [u64; 18],
    last_response: [u32; 3],
    last_request: [u32; 3],
}

fn gateway_counters(c: GatewayCounters) -> [u64; 21] {
    // Destructured without `..`: a new counter has to be added here.
    let GatewayCounters {
        malformed_engine,
        malformed_fix,
        rejected_app,
        unknown_exec,
        resent_requests,
        duplicate_execs,
        overfills,
        late_fills,
        trade_cancels,
        trade_corrections,
        trade_refs_unknown,
        late_answers,
        deferred_cancel_on_disconnect,
        venue_refused,
        not_sent,
        status_requests,
        status_fills,
        status_mismatch,
        malformed_disconnects,
        frames_after_cutoff,
        inconsistent_fills,
    } = c;
    [
        malformed_engine,
        malformed_fix,
        rejected_app,
        unknown_exec,
        resent_requests,
        duplicate_execs,
        overfills,
        late_fills,
        trade_cancels,
        trade_corrections,
        trade_refs_unknown,
        late_answers,
        deferred_cancel_on_disconnect,
        venue_refused,
        not_sent,
        status_requests,
        status_fills,
        status_mismatch,
        malformed_disconnects,
        frames_after_cutoff,
        inconsistent_fills,
    ]
}

fn session_counters(c: SessionCounters) -> [u64; 18] {
    let SessionCounters {
        garbled,
        rejects_sent,
        rejects_received,
        resend_requests_sent,
        messages_resent,
        gap_fills_sent,
        duplicates_ignored,
        gap_filled_unavailable,
        too_long_to_keep,
        resets_received,
        resend_timeouts,
        queued,
        queue_overflow,
        sending_time_problems,
        logons_refused,
        seq_too_low_logouts,
        out_of_state,
        wrong_begin_string,
    } = c;
    [
        garbled,
        rejects_sent,
        rejects_received,
        resend_requests_sent,
        messages_resent,
        gap_fills_sent,
        duplicates_ignored,
        gap_filled_unavailable,
        too_long_to_keep,
        resets_received,
        resend_timeouts,
        queued,
        queue_overflow,
        sending_time_problems,
        logons_refused,
        seq_too_low_logouts,
        out_of_state,
        wrong_begin_string,
    ]
}

impl Seen {
    fn of(gw: &Gateway) -> Seen {
        Seen {
            gateway: gateway_counters(gw.counters()),
            session: session_counters(gw.session().counters()),
            last_response: ENGINES.map(|e| gw.last_response_seq(e)),
            last_request: ENGINES.map(|e| gw.last_request_seq(e)),
        }
    }

    /// Takes the new values, checking that none went down.
    fn advance(&mut self, gw: &Gateway) {
        let now = Seen::of(gw);
        let pairs = |a: &[u64], b: &[u64]| a.iter().zip(b).all(|(x, y)| x <= y);
        assert!(
            pairs(&self.gateway, &now.gateway),
            "a gateway counter went down: {:?} -> {:?}",
            self.gateway,
            now.gateway
        );
        assert!(
            pairs(&self.session, &now.session),
            "a session counter went down: {:?} -> {:?}",
            self.session,
            now.session
        );
        for i in 0..ENGINES.len() {
            assert!(self.last_response[i] <= now.last_response[i]);
            assert!(self.last_request[i] <= now.last_request[i]);
        }
        *self = now;
    }
}

/// Reads the fuzz input front to back; past the end every read is zero.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Wraps `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    /// True when everything was read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// One byte.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// Two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// Up to `n` bytes.
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.data.split_at(n.min(self.data.len()));
        self.data = b;
        a
    }
}
