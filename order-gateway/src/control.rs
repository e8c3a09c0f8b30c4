//! The operator's control socket (SEC 15c3-5 style controls on a running gateway).
//!
//! A Unix stream socket, mode 0600 by default (`service.control_socket` in the config). A
//! client connects, writes one command line, and reads the answer until the gateway closes
//! the connection: `order-gateway control kill --account 7` does exactly that. Commands:
//!
//! - `kill [--account A]`: turns the global (or the account's) kill switch on, cancels the
//!   open orders in its scope at the venue, and rejects new ones with `KillSwitch*`.
//!   Journaled: it survives a restart. With the venue session down, its cancels go out at
//!   the next logon (the gateway cancels what a kill switch covers at every logon).
//! - `resume [--account A]`: turns it off again.
//! - `cancel-all [--account A]`: cancels the open orders in scope, without blocking new ones.
//!   Refused while the venue session is down (nothing would be cancelled).
//! - `venue-reconnect`: lets the gateway log on to the venue again after the venue logged
//!   it out for a MsgSeqNum too low (it does not retry by itself: the same Logon would be
//!   refused the same way). Sequence numbers are not changed here: settle them with the
//!   venue first (there is no command to set ours).
//! - `stop`: a clean stop, as SIGTERM: FIX Logout to the venue (its answer awaited a
//!   moment), a checkpoint, engines disconnected, exit 0. Answered before it starts.
//! - `status`: venue session (and how often and why the venue refused our Logon, if it
//!   did), journal, engines, open orders, kill switches, firm-wide exposure against the firm
//!   limits, and per account open orders and notional against the credit limit and what
//!   its throttle windows hold.
//!
//! Commands that change state (`kill`, `resume`, `cancel-all`) are answered `ok` only once
//! their journal records are durable ([`FixDriver::operator_command`]): when the journal
//! cannot be written the answer is an `error` and nothing changed (no request is taken
//! meanwhile either), and the operator sends the command again once `status` shows the
//! journal ok. `venue-reconnect` changes nothing the journal holds (it lifts a hold that
//! lives in memory; a restart logs on anyway).
//!
//! The server side never blocks the service thread: accepts and reads are non-blocking and
//! polled from the loop; a client that sends no full line within [`CLIENT_TIMEOUT`] is
//! dropped; at most [`MAX_CLIENTS`] are served at once.
//!
//! # Who may talk to it
//! - The socket lives in a directory only the gateway's user can write: created 0700 when
//!   missing, refused when it is a symlink, belongs to another user (root aside), or group
//!   or others can write it. Nobody else can then put a file at the path, or swap it.
//! - Every connection's peer credentials (`SO_PEERCRED`) are checked against an allow-list
//!   of uids (by default the gateway's own and root): anyone else is answered an error and
//!   nothing it sends is run.
//! - A file found at the path is removed only if it is a socket of the gateway's user that
//!   nobody answers on (a crashed gateway's); anything else (another user's socket, a plain
//!   file, a symlink) is refused and left in place. On exit the socket is removed only if
//!   the path is still the one the gateway bound.
//! - The client ([`request`]) checks the server's credentials the same way (its uid must
//!   be the client's own or root, or one of those it is told to trust) before it sends a
//!   command: a squatter cannot answer `kill` with a fake "ok".

use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::driver::{FixDriver, VenueLink};
use crate::fix::SessionState;
use crate::risk::KillScope;

/// How long a client may take to send its command line.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// Control connections served at once; more wait in the listen backlog.
pub const MAX_CLIENTS: usize = 8;
/// Longest command line accepted.
const MAX_LINE: usize = 256;

/// This process's user.
fn my_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// The uid of the process at the other end of `s` (`SO_PEERCRED`: for a client, the
/// server's at the time it listened; for the server, the client's at connect).
fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    Ok(rustix::net::sockopt::socket_peercred(s)?.uid.as_raw())
}

/// Whether a client of uid `peer` may use a control socket that allows `allowed` (an
/// empty list allows the gateway's own user `me` and root).
pub fn peer_allowed(peer: u32, me: u32, allowed: &[u32]) -> bool {
    if allowed.is_empty() {
        peer == me || peer == 0
    } else {
        allowed.contains(&peer)
    }
}

/// Whether a client of uid `me` may believe a control server of uid `server`: its own user
/// or root, or one of `trusted` when given (replacing that default).
pub fn server_trusted(server: u32, me: u32, trusted: &[u32]) -> bool {
    peer_allowed(server, me, trusted)
}

/// Why directory `dir` (owner `owner`, `mode`, `is_dir`) may not hold the control socket of
/// user `me`, if it may not: it must be a real directory of `me` or root that neither group
/// nor others can write (OpenSSH `StrictModes`).
pub fn dir_problem(is_dir: bool, owner: u32, mode: u32, me: u32) -> Option<String> {
    if !is_dir {
        return Some("is not a directory (a symlink?)".into());
    }
    if owner != me && owner != 0 {
        return Some(format!("belongs to uid {owner}, not to uid {me} or root"));
    }
    if mode & 0o022 != 0 {
        return Some(format!(
            "has mode {:o}: group or others can write it",
            mode & 0o7777
        ));
    }
    None
}

fn refuse(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("control socket {}: {why}", path.display()),
    )
}

/// Makes (0700) or checks the directory of the control socket `path`.
fn private_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if std::fs::symlink_metadata(dir).is_err() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let m = std::fs::symlink_metadata(dir)?;
    match dir_problem(m.is_dir(), m.uid(), m.mode(), my_uid()) {
        Some(why) => Err(refuse(
            path,
            format!(
                "its directory {} {why}: use a directory only the gateway's user can write \
                 (mode 0700)",
                dir.display()
            ),
        )),
        None => Ok(()),
    }
}

/// A control command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Kill switch on (global, or one account).
    Kill(Option<u32>),
    /// Kill switch off.
    Resume(Option<u32>),
    /// Cancel open orders, do not block new ones.
    CancelAll(Option<u32>),
    /// Report: text, or (`status --json`) one JSON object.
    Status {
        /// Answer `ok` then one line holding a JSON object ([`StatusReport`]).
        json: bool,
    },
    /// Allow logging on to the venue again after a "MsgSeqNum too low" Logout.
    VenueReconnect,
    /// Clean stop (as SIGTERM).
    Stop,
}

/// Parses a command line (`kill`, `kill --account 7`, `status`, ...).
pub fn parse(line: &str) -> Result<Command, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let account = |rest: &[&str]| -> Result<Option<u32>, String> {
        match rest {
            [] => Ok(None),
            ["--account", a] => a
                .parse()
                .map(Some)
                .map_err(|_| format!("--account takes an account number, not {a:?}")),
            other => Err(format!("unexpected {:?}: use --account A", other.join(" "))),
        }
    };
    match words.as_slice() {
        ["kill", rest @ ..] => Ok(Command::Kill(account(rest)?)),
        ["resume", rest @ ..] => Ok(Command::Resume(account(rest)?)),
        ["cancel-all", rest @ ..] => Ok(Command::CancelAll(account(rest)?)),
        ["status"] => Ok(Command::Status { json: false }),
        ["status", "--json"] => Ok(Command::Status { json: true }),
        ["venue-reconnect"] => Ok(Command::VenueReconnect),
        ["stop"] => Ok(Command::Stop),
        [] => Err("empty command".into()),
        [w, ..] => Err(format!(
            "unknown command {w:?}: kill [--account A], resume [--account A], \
             cancel-all [--account A], status [--json], venue-reconnect, stop"
        )),
    }
}

/// Runs `line` against the gateway; returns the answer (first word `ok` or `error`). A
/// command that changes state is answered `ok` only once it is durable in the journal.
/// `stop` is only answered here: the caller stops (see [`parse`]).
pub fn execute<L: VenueLink>(
    line: &str,
    driver: &mut FixDriver<L>,
    engines_connected: usize,
    now: u64,
) -> String {
    let cmd = match parse(line) {
        Ok(c) => c,
        Err(e) => return format!("error: {e}\n"),
    };
    let known = |a: Option<u32>, d: &FixDriver<L>| {
        a.is_none_or(|a| d.gateway().risk().account_ids().contains(&a))
    };
    let scope = |a: Option<u32>| a.map_or(KillScope::Global, KillScope::Account);
    let what = |a: Option<u32>| a.map_or("all accounts".to_owned(), |a| format!("account {a}"));
    match cmd {
        Command::Kill(a) | Command::Resume(a) | Command::CancelAll(a) if !known(a, driver) => {
            format!(
                "error: no account {} in the configuration\n",
                a.unwrap_or(0)
            )
        }
        Command::Kill(a) => {
            let before = driver.gateway().open_order_count();
            let venue_up = driver.gateway().session().state() == SessionState::Active;
            if let Err(e) = driver.operator_command(|gw, out| gw.set_kill(scope(a), true, now, out))
            {
                tracing::error!(scope = %what(a), error = %e, "kill switch NOT set (control socket)");
                return format!("error: kill switch not set: {e}\n");
            }
            tracing::warn!(scope = %what(a), venue_up, "kill switch ON (control socket)");
            let cancels = if venue_up {
                "cancelling open orders"
            } else {
                "the venue session is down: open orders are cancelled as soon as it logs on again"
            };
            format!(
                "ok: kill switch on for {}; {cancels} ({before} open in all); new orders are \
                 rejected until `resume`\n",
                what(a)
            )
        }
        Command::Resume(a) => {
            if let Err(e) =
                driver.operator_command(|gw, out| gw.set_kill(scope(a), false, now, out))
            {
                tracing::error!(scope = %what(a), error = %e, "resume NOT done (control socket)");
                return format!("error: kill switch still on: {e}\n");
            }
            tracing::warn!(scope = %what(a), "kill switch off (control socket)");
            format!("ok: kill switch off for {}\n", what(a))
        }
        Command::CancelAll(_) if driver.gateway().session().state() != SessionState::Active => {
            "error: the venue session is down: nothing cancelled; send `cancel-all` again once \
             it is up, or use `kill`, whose cancels go out as soon as it logs on again\n"
                .to_owned()
        }
        Command::CancelAll(a) => {
            if let Err(e) = driver.operator_command(|gw, out| gw.cancel_all(a, now, out)) {
                tracing::error!(scope = %what(a), error = %e, "cancel-all NOT done (control socket)");
                return format!("error: nothing cancelled: {e}\n");
            }
            tracing::warn!(scope = %what(a), "cancel-all (control socket)");
            format!("ok: cancelling the open orders of {}\n", what(a))
        }
        Command::Status { json: false } => status(driver, engines_connected, now),
        Command::Status { json: true } => {
            let report = StatusReport::of(driver, engines_connected, now);
            match serde_json::to_string(&report) {
                Ok(j) => format!("ok\n{j}\n"),
                Err(e) => format!("error: cannot encode the status: {e}\n"),
            }
        }
        Command::Stop => {
            tracing::warn!("clean stop requested (control socket)");
            "ok: stopping: FIX Logout to the venue, checkpoint, engines disconnected\n".into()
        }
        Command::VenueReconnect => match driver.gateway().reconnect_hold() {
            Some(expected) => {
                let ours = driver.gateway().session().next_out();
                driver.stage(|gw, _| gw.release_reconnect_hold());
                tracing::warn!(
                    venue_expects = expected,
                    our_next = ours,
                    "venue reconnect allowed (control socket)"
                );
                format!(
                    "ok: logging on to the venue again (it last said it expects MsgSeqNum \
                     {expected}; our next is {ours})\n"
                )
            }
            None => "ok: nothing held; the gateway reconnects by itself\n".into(),
        },
    }
}

/// What `status --json` answers (after its `ok` line): the facts of the text `status`, as
/// numbers and names.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StatusReport {
    /// `"active"` or `"down"`.
    pub venue_session: &'static str,
    /// Logons the venue refused, and the reason it gave for the last one.
    pub venue_logons_refused: u64,
    /// The last refusal's reason (`None`: no refusal; `""`: none given).
    pub venue_last_refusal: Option<String>,
    /// When the venue logged us out for a MsgSeqNum too low: the MsgSeqNum it expects.
    pub venue_logon_held_expects: Option<u64>,
    /// Our next outgoing MsgSeqNum.
    pub fix_next_out: u64,
    /// `false` when the journal is unwritable and requests are not taken.
    pub journal_ok: bool,
    /// Engines logged on.
    pub engines_connected: usize,
    /// Open orders, all accounts.
    pub open_orders: usize,
    /// New orders sent without a venue answer yet.
    pub unacknowledged_new: usize,
    /// Cancels or replaces sent without a venue answer yet.
    pub unacknowledged_changes: usize,
    /// The global kill switch.
    pub kill_global: bool,
    /// Engines whose kill switch is on.
    pub kill_engines: Vec<u32>,
    /// Accounts whose kill switch is on.
    pub kill_accounts: Vec<u32>,
    /// Firm-wide use and limits.
    pub firm: FirmStatus,
    /// Each configured account.
    pub accounts: Vec<AccountStatus>,
}

/// Firm-wide part of [`StatusReport`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FirmStatus {
    /// Open orders.
    pub open_orders: u64,
    /// Their limit.
    pub max_open_orders: u64,
    /// Open notional.
    pub open_notional: i64,
    /// Its limit.
    pub max_gross_notional: i64,
    /// Open plus executed notional.
    pub used_notional: i64,
    /// Its limit (credit).
    pub credit_limit: i64,
}

/// One account of [`StatusReport`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AccountStatus {
    /// Account number.
    pub account: u32,
    /// Open orders.
    pub open_orders: u64,
    /// Open notional.
    pub open_notional: i64,
    /// Executed notional.
    pub executed_notional: i64,
    /// Credit limit (0: none).
    pub credit_limit: i64,
    /// New orders, cancels and replaces in the current throttle window.
    pub throttle_new: u64,
    /// Cancels in the window.
    pub throttle_cancels: u64,
    /// Replaces in the window.
    pub throttle_replaces: u64,
}

impl StatusReport {
    /// Reads the report off the gateway.
    pub fn of<L: VenueLink>(driver: &FixDriver<L>, engines_connected: usize, now: u64) -> Self {
        let gw = driver.gateway();
        let risk = gw.risk();
        let (global, engines, accounts) = risk.kills();
        let (new, changes) = gw.unacknowledged();
        let (orders, open, executed) = risk.firm_exposure();
        let (max_orders, max_gross, credit) = risk.firm_limits();
        StatusReport {
            venue_session: match gw.session().state() {
                SessionState::Active => "active",
                _ => "down",
            },
            venue_logons_refused: gw.session().counters().logons_refused,
            venue_last_refusal: gw.session().logon_refusal().map(str::to_owned),
            venue_logon_held_expects: gw.reconnect_hold(),
            fix_next_out: gw.session().next_out(),
            journal_ok: !driver.is_degraded(),
            engines_connected,
            open_orders: gw.open_order_count(),
            unacknowledged_new: new,
            unacknowledged_changes: changes,
            kill_global: global,
            kill_engines: engines.to_vec(),
            kill_accounts: accounts.to_vec(),
            firm: FirmStatus {
                open_orders: orders,
                max_open_orders: max_orders,
                open_notional: open,
                max_gross_notional: max_gross,
                used_notional: open + executed,
                credit_limit: credit,
            },
            accounts: risk
                .account_ids()
                .into_iter()
                .map(|a| {
                    let [new, cancels, replaces] = risk.throttle_usage(a, now);
                    let (open, executed) = risk.exposure(a);
                    AccountStatus {
                        account: a,
                        open_orders: u64::from(risk.open_orders(a)),
                        open_notional: open,
                        executed_notional: executed,
                        credit_limit: risk.credit_limit(a),
                        throttle_new: new,
                        throttle_cancels: cancels,
                        throttle_replaces: replaces,
                    }
                })
                .collect(),
        }
    }
}

fn status<L: VenueLink>(driver: &FixDriver<L>, engines_connected: usize, now: u64) -> String {
    let gw = driver.gateway();
    let risk = gw.risk();
    let (global, engines, accounts) = risk.kills();
    let mut s = String::from("ok\n");
    let session = match gw.session().state() {
        SessionState::Active => "active",
        _ => "down",
    };
    s.push_str(&format!("venue session       {session}\n"));
    let refused = gw.session().counters().logons_refused;
    match (refused, gw.session().logon_refusal()) {
        (0, _) | (_, None) => {}
        (_, Some("")) => s.push_str(&format!(
            "venue logons refused {refused}, the last with no reason given\n"
        )),
        (_, Some(reason)) => s.push_str(&format!(
            "venue logons refused {refused}, the last: {reason:?}\n"
        )),
    }
    if let Some(expected) = gw.reconnect_hold() {
        s.push_str(&format!(
            "venue logon held    the venue expects MsgSeqNum {expected}, our next is {}: \
             settle it with the venue, then `venue-reconnect`\n",
            gw.session().next_out()
        ));
    }
    s.push_str(&format!(
        "journal             {}\n",
        if driver.is_degraded() {
            "UNWRITABLE: requests are not taken"
        } else {
            "ok"
        }
    ));
    s.push_str(&format!("engines connected   {engines_connected}\n"));
    s.push_str(&format!("open orders         {}\n", gw.open_order_count()));
    let (new, changes) = gw.unacknowledged();
    s.push_str(&format!(
        "unacknowledged      {new} new orders, {changes} cancels or replaces (sent, no venue \
         answer yet)\n"
    ));
    s.push_str(&format!(
        "kill switches       global {}, engines {engines:?}, accounts {accounts:?}\n",
        if global { "ON" } else { "off" }
    ));
    let (orders, open, executed) = risk.firm_exposure();
    let (max_orders, max_gross, credit) = risk.firm_limits();
    s.push_str(&format!(
        "firm                open orders {orders} of {max_orders}, open notional {open} of \
         {max_gross}, open + executed notional {} of {credit}\n",
        open + executed
    ));
    for a in risk.account_ids() {
        let [new, cancels, replaces] = risk.throttle_usage(a, now);
        let (open, executed) = risk.exposure(a);
        let limit = risk.credit_limit(a);
        let used = if limit > 0 {
            (open + executed) as f64 * 100.0 / limit as f64
        } else {
            0.0
        };
        s.push_str(&format!(
            "account {a:<11} open orders {}, open notional {open}, executed notional \
             {executed}, credit limit {limit} ({used:.1}% used); in the throttle window \
             {new} new, {cancels} cancels, {replaces} replaces\n",
            risk.open_orders(a)
        ));
    }
    s
}

struct Client {
    stream: UnixStream,
    line: Vec<u8>,
    since: Instant,
    /// The answer to a peer whose uid is not allowed: its line is read (closing on unread
    /// input would reset the connection and lose the answer) but never run.
    denied: Option<String>,
}

/// The listening side, polled from the service loop.
#[derive(Debug)]
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    /// Device and inode of the socket file bound: only that file is removed on exit.
    bound: (u64, u64),
    /// Uids allowed to connect (empty: the gateway's own and root).
    allowed: Vec<u32>,
    /// Connections refused for their peer credentials.
    refused: u64,
    clients: Vec<Client>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("since", &self.since)
            .finish()
    }
}

impl ControlServer {
    /// Binds `path` with mode 0600 in a private directory, for the gateway's own user and
    /// root (see the module docs). A leftover socket of ours nobody answers on is replaced;
    /// one a live process answers on is an error (another gateway?); anything else at the
    /// path is refused and left alone.
    pub fn bind(path: &Path) -> io::Result<ControlServer> {
        Self::bind_allowing(path, &[])
    }

    /// [`Self::bind`] for clients of the uids in `allowed` only (empty: the gateway's own
    /// and root).
    pub fn bind_allowing(path: &Path, allowed: &[u32]) -> io::Result<ControlServer> {
        private_dir(path)?;
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if !m.file_type().is_socket() {
                return Err(refuse(
                    path,
                    "something that is not a socket is in the way; the gateway did not \
                     create it and leaves it in place: remove it yourself if it is safe",
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{} is in use by a running process (another gateway?)",
                        path.display()
                    ),
                ));
            }
            if m.uid() != my_uid() {
                return Err(refuse(
                    path,
                    format!(
                        "a socket of uid {} is in the way; the gateway did not create it and \
                         leaves it in place: remove it yourself if it is safe",
                        m.uid()
                    ),
                ));
            }
            // Ours, in our private directory, and dead: a crashed gateway's.
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        // No window: nobody but us can enter the directory before this.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let m = std::fs::symlink_metadata(path)?;
        Ok(ControlServer {
            listener,
            path: path.to_owned(),
            bound: (m.dev(), m.ino()),
            allowed: allowed.to_vec(),
            refused: 0,
            clients: Vec::new(),
        })
    }

    /// Connections refused so far because of their peer's uid.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts, reads and answers without blocking: each complete command line goes to
    /// `handle`, whose answer is written back before the connection is closed. Returns the
    /// commands handled.
    pub fn poll(&mut self, mut handle: impl FnMut(&str) -> String) -> usize {
        while self.clients.len() < MAX_CLIENTS {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let denied = match peer_uid(&stream) {
                        Ok(uid) if peer_allowed(uid, my_uid(), &self.allowed) => None,
                        other => {
                            self.refused += 1;
                            let who = other.map_or("unknown".into(), |u| u.to_string());
                            tracing::warn!(uid = %who, "control connection refused: uid not allowed");
                            Some(format!(
                                "error: uid {who} may not use this control socket\n"
                            ))
                        }
                    };
                    if stream.set_nonblocking(true).is_ok() {
                        self.clients.push(Client {
                            stream,
                            line: Vec::new(),
                            since: Instant::now(),
                            denied,
                        });
                    }
                }
                Err(_) => break,
            }
        }
        let mut handled = 0;
        let mut i = 0;
        while i < self.clients.len() {
            let c = &mut self.clients[i];
            let mut buf = [0u8; 128];
            let done = match c.stream.read(&mut buf) {
                Ok(0) => true,
                Ok(n) => {
                    c.line.extend_from_slice(&buf[..n]);
                    c.line.contains(&b'\n') || c.line.len() > MAX_LINE
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.since.elapsed() > CLIENT_TIMEOUT
                }
                Err(_) => true,
            };
            if !done {
                i += 1;
                continue;
            }
            let mut c = self.clients.swap_remove(i);
            let end = c.line.iter().position(|&b| b == b'\n');
            let answer = match (end, std::str::from_utf8(&c.line[..end.unwrap_or(0)])) {
                (Some(_), _) if c.denied.is_some() => c.denied.take().unwrap_or_default(),
                (Some(_), Ok(line)) => {
                    handled += 1;
                    handle(line.trim())
                }
                (Some(_), Err(_)) => "error: the command is not UTF-8\n".to_owned(),
                (None, _) if c.line.len() > MAX_LINE => "error: command too long\n".to_owned(),
                (None, _) => continue, // gone or silent: nothing to answer
            };
            // The answer is small: it fits the socket buffer; a client that is not reading
            // simply loses it.
            let _ = c.stream.set_nonblocking(false);
            let _ = c.stream.set_write_timeout(Some(Duration::from_millis(10)));
            let _ = c.stream.write_all(answer.as_bytes());
        }
        handled
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        // Only the file we bound: not one someone put there since.
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.bound) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Client side: sends `line` to the gateway's control socket at `path` and returns its
/// answer, once the server's credentials show it runs as this user or root.
pub fn request(path: &Path, line: &str, timeout: Duration) -> io::Result<String> {
    request_trusting(path, line, timeout, &[])
}

/// [`request`] believing only servers of the uids in `trusted` (empty: this user and root).
pub fn request_trusting(
    path: &Path,
    line: &str,
    timeout: Duration,
    trusted: &[u32],
) -> io::Result<String> {
    let mut s = UnixStream::connect(path)?;
    let server = peer_uid(&s)?;
    if !server_trusted(server, my_uid(), trusted) {
        return Err(refuse(
            path,
            format!(
                "served by uid {server}, not by this user or root: refusing to send the \
                 command (someone else's process may be squatting the path)"
            ),
        ));
    }
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(line.trim().as_bytes())?;
    s.write_all(b"\n")?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_bad_ones_say_why() {
        assert_eq!(parse("kill"), Ok(Command::Kill(None)));
        assert_eq!(parse(" kill --account 7 "), Ok(Command::Kill(Some(7))));
        assert_eq!(parse("resume --account 7"), Ok(Command::Resume(Some(7))));
        assert_eq!(parse("cancel-all"), Ok(Command::CancelAll(None)));
        assert_eq!(parse("status"), Ok(Command::Status { json: false }));
        assert_eq!(parse("status --json"), Ok(Command::Status { json: true }));
        assert_eq!(parse("venue-reconnect"), Ok(Command::VenueReconnect));
        assert_eq!(parse("stop"), Ok(Command::Stop));
        assert!(parse("kil").unwrap_err().contains("unknown command"));
        assert!(parse("kill --account x")
            .unwrap_err()
            .contains("account number"));
        assert!(parse("kill 7").unwrap_err().contains("--account"));
        assert!(parse("").is_err());
    }

    /// Kill, cancel-all, resume and status against a gateway with the venue simulator.
    #[test]
    fn commands_act_on_the_gateway() {
        use crate::journal::FsyncPolicy;
        use crate::proto::{
            NewOrder, RejectReason, Response, Side, Symbol, TimeInForce, PRICE_SCALE,
        };
        use crate::sim::SimVenue;
        use crate::unix_nanos;
        use zerocopy::IntoBytes;
        let risk: crate::risk::RiskConfig = toml::from_str(
            r#"
            reference_max_age_ms = 600000
            throttle_interval_ms = 1000
            [[accounts]]
            id = 7
            max_order_qty = 100000
            max_order_notional = 100000000
            credit_limit = 1000000
            max_position = 1000000
            max_open_orders = 100
            max_orders_per_interval = 1000
            collar_bps = 500
            [[engines]]
            id = 1
            accounts = [7]
            token = "e1"
            "#,
        )
        .unwrap();
        let session = crate::gateway::tests::session();
        let dir = tempfile::tempdir().unwrap();
        let mut d = FixDriver::with_link(
            SimVenue::new(),
            session,
            &risk,
            &dir.path().join("j"),
            FsyncPolicy::Never,
        )
        .unwrap();
        let aapl = Symbol::new("AAPL").unwrap();
        d.stage(|gw, _| gw.on_reference_price(aapl, 100 * PRICE_SCALE, unix_nanos()));
        // Before the venue session is up: a kill says when its cancels go out, a
        // cancel-all that nothing was cancelled.
        let k = execute("kill --account 7", &mut d, 0, unix_nanos());
        assert!(
            k.starts_with("ok") && k.contains("as soon as it logs on"),
            "{k}"
        );
        assert!(execute("resume --account 7", &mut d, 0, unix_nanos()).starts_with("ok"));
        let c = execute("cancel-all", &mut d, 0, unix_nanos());
        assert!(c.starts_with("error: the venue session is down"), "{c}");
        d.connect().unwrap();
        d.poll_with(rocebus::clock::Now::read(), |_, _| {}).unwrap();
        let order = |d: &mut FixDriver<SimVenue>, id: u64| {
            let m = NewOrder::new(
                id,
                7,
                aapl,
                Side::Buy,
                10,
                100 * PRICE_SCALE,
                TimeInForce::Day,
            );
            let mut got = Vec::new();
            d.stage_engine_message(1, m.as_bytes(), rocebus::clock::Wall::now());
            d.flush_with(|_, r| got.push(*r)).unwrap();
            d.poll_with(rocebus::clock::Now::read(), |_, r| got.push(*r))
                .unwrap();
            got
        };
        assert!(order(&mut d, 1)
            .iter()
            .any(|r| matches!(r, Response::Fill(_))));
        let st = execute("status", &mut d, 3, unix_nanos());
        assert!(st.starts_with("ok"), "{st}");
        assert!(st.contains("venue session       active"), "{st}");
        assert!(st.contains("engines connected   3"), "{st}");
        assert!(
            st.contains("unacknowledged      0 new orders, 0 cancels or replaces"),
            "{st}"
        );
        assert!(
            st.contains("account 7") && st.contains("credit limit 1000000"),
            "{st}"
        );
        assert!(st.contains("firm                open orders 0 of "), "{st}");
        assert!(
            st.contains("in the throttle window 1 new, 0 cancels"),
            "{st}"
        );
        assert!(execute("kill --account 9", &mut d, 0, 0).starts_with("error"));
        let k = execute("kill --account 7", &mut d, 0, unix_nanos());
        assert!(
            k.starts_with("ok: kill switch on for account 7; cancelling"),
            "{k}"
        );
        let r = order(&mut d, 2);
        assert!(
            matches!(r[..], [Response::Reject(x)] if x.reason() == RejectReason::KillSwitchAccount),
            "{r:?}"
        );
        assert!(execute("status", &mut d, 0, 0).contains("accounts [7]"));
        assert!(execute("resume --account 7", &mut d, 0, unix_nanos()).starts_with("ok"));
        assert!(order(&mut d, 3)
            .iter()
            .any(|r| matches!(r, Response::Fill(_))));
        let c = execute("cancel-all", &mut d, 0, unix_nanos());
        assert!(c.starts_with("ok: cancelling"), "{c}");
        assert!(execute("bogus", &mut d, 0, 0).starts_with("error: unknown command"));
        assert!(execute("venue-reconnect", &mut d, 0, 0).contains("nothing held"));
        // `stop` is answered here; the service loop sees the command and stops.
        assert!(execute("stop", &mut d, 0, 0).starts_with("ok: stopping"));
    }

    #[test]
    fn the_socket_answers_commands_is_private_and_drops_silent_clients() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.control");
        let mut server = ControlServer::bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A second server on the same path is refused while the first one is there.
        assert_eq!(
            ControlServer::bind(&path).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        let silent = UnixStream::connect(&path).unwrap();
        let p = path.clone();
        let client = std::thread::spawn(move || request(&p, "status", Duration::from_secs(5)));
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = Vec::new();
        while seen.is_empty() {
            assert!(Instant::now() < deadline, "no command arrived");
            server.poll(|line| {
                seen.push(line.to_owned());
                "ok: fine\n".to_owned()
            });
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(seen, ["status"]);
        assert_eq!(client.join().unwrap().unwrap(), "ok: fine\n");
        // The silent client is dropped after the timeout, not waited for.
        let t = Instant::now();
        while !server.clients.is_empty() {
            assert!(t.elapsed() < CLIENT_TIMEOUT * 3, "silent client kept");
            server.poll(|_| unreachable!("the silent client sent nothing"));
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(silent);
        drop(server);
        assert!(!path.exists(), "socket file left behind");
    }

    #[test]
    fn credential_and_directory_rules_by_value() {
        // Default: the gateway's own user and root.
        assert!(peer_allowed(1000, 1000, &[]));
        assert!(peer_allowed(0, 1000, &[]));
        assert!(!peer_allowed(1001, 1000, &[]));
        // A list replaces the default.
        assert!(peer_allowed(1001, 1000, &[1001]));
        assert!(!peer_allowed(1000, 1000, &[1001]));
        assert!(server_trusted(0, 1000, &[]));
        assert!(!server_trusted(65534, 1000, &[]));
        assert!(!server_trusted(65534, 0, &[]));
        assert!(server_trusted(65534, 0, &[65534]));
        assert_eq!(dir_problem(true, 1000, 0o40700, 1000), None);
        assert_eq!(dir_problem(true, 0, 0o40755, 1000), None);
        assert!(dir_problem(true, 1000, 0o41777, 1000).is_some());
        assert!(dir_problem(true, 1000, 0o40770, 1000).is_some());
        assert!(dir_problem(true, 1001, 0o40700, 1000).is_some());
        assert!(dir_problem(false, 1000, 0o120777, 1000).is_some());
    }

    #[test]
    fn the_directory_is_made_private_and_one_others_can_write_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("run/gw.control");
        let server = ControlServer::bind(&path).unwrap();
        let mode = std::fs::metadata(base.path().join("run")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        drop(server);
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = ControlServer::bind(&open.join("gw.control")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(
            err.to_string().contains("group or others can write it"),
            "{err}"
        );
    }

    #[test]
    fn a_squatted_path_is_refused_with_a_clear_error_and_left_in_place() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("gw.control");
        // A plain file: never the gateway's.
        std::fs::write(&path, b"not yours").unwrap();
        let err = ControlServer::bind(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("leaves it in place"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"not yours");
        std::fs::remove_file(&path).unwrap();
        // A dead socket of another user (made with chown: these tests run as root).
        drop(UnixListener::bind(&path).unwrap());
        rustix::fs::chown(
            &path,
            Some(rustix::process::Uid::from_raw(65534)),
            Some(rustix::process::Gid::from_raw(65534)),
        )
        .expect("chown needs root");
        let err = ControlServer::bind(&path).unwrap_err();
        assert!(err.to_string().contains("a socket of uid 65534"), "{err}");
        assert!(path.exists(), "another user's socket was deleted");
        // Our own dead socket (a crashed gateway's) is replaced.
        std::fs::remove_file(&path).unwrap();
        drop(UnixListener::bind(&path).unwrap());
        let server = ControlServer::bind(&path).unwrap();
        // Replaced by someone meanwhile: not removed on exit.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"later").unwrap();
        drop(server);
        assert_eq!(std::fs::read(&path).unwrap(), b"later");
    }

    /// Polls `server` until `n` connections were refused or a command ran.
    fn serve_until(server: &mut ControlServer, refused: u64, ran: &mut Vec<String>) {
        let t = Instant::now();
        while server.refused() < refused && ran.is_empty() {
            assert!(t.elapsed() < Duration::from_secs(5), "nothing arrived");
            server.poll(|l| {
                ran.push(l.to_owned());
                "ok: done\n".into()
            });
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn a_client_of_a_uid_not_allowed_is_answered_an_error_and_not_obeyed() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("gw.control");
        // Only uid 4242 allowed: this test's own user (root) is not.
        let mut server = ControlServer::bind_allowing(&path, &[4242]).unwrap();
        let p = path.clone();
        let client = std::thread::spawn(move || request(&p, "kill", Duration::from_secs(5)));
        let mut ran = Vec::new();
        serve_until(&mut server, 1, &mut ran);
        let answer = client.join().unwrap().unwrap();
        assert!(answer.starts_with("error: uid 0 may not use"), "{answer}");
        assert_eq!(ran, Vec::<String>::new());
    }

    #[test]
    fn a_client_refuses_a_server_of_a_uid_it_does_not_trust() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("gw.control");
        let mut server = ControlServer::bind(&path).unwrap();
        // The real server runs as root; a client told to trust only uid 4242 refuses it
        // before sending anything.
        let err = request_trusting(&path, "kill", Duration::from_secs(5), &[4242]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("served by uid 0"), "{err}");
        let mut ran = Vec::new();
        for _ in 0..20 {
            server.poll(|l| {
                ran.push(l.to_owned());
                "ok\n".into()
            });
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(ran, Vec::<String>::new());
    }

    /// Child: a squatter of another user answering "ok" to anything (run as nobody).
    #[test]
    #[ignore = "child: run by a_squatter_of_another_user_is_not_believed"]
    fn child_squatter() {
        let path = std::env::var_os("ROCEBUS_SQUAT")
            .expect("child process of a_squatter_of_another_user_is_not_believed");
        let listener = UnixListener::bind(&path).unwrap();
        loop {
            let (mut s, _) = listener.accept().unwrap();
            let _ = s.write_all(b"ok: kill switch on (not really)\n");
        }
    }

    #[test]
    fn a_squatter_of_another_user_is_not_believed() {
        use std::os::unix::process::CommandExt;
        let base = tempfile::tempdir().unwrap();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let path = open.join("gw.control");
        let mut kid = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["control::tests::child_squatter", "--exact", "--ignored"])
            .env("ROCEBUS_SQUAT", &path)
            .uid(65534)
            .gid(65534)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("running the squatter as nobody needs root");
        let t = Instant::now();
        while !path.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the squatter never bound"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let got = request(&path, "kill", Duration::from_secs(5));
        let _ = kid.kill();
        let _ = kid.wait();
        let err = got.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains("served by uid 65534"), "{err}");
    }
}
