//! Thin std TCP driver for the FIX side: owns the socket and the journal file, moves bytes
//! between them and the I/O-free [`Gateway`], and applies the write-ahead order (journal,
//! then FIX, then engine responses). The RC engine side is fed in through
//! [`FixDriver::engine_message`] by whoever owns the engine transport.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use crate::config::Config;
use crate::fix::SessionConfig;
use crate::gateway::{EngineId, Gateway, Outputs};
use crate::journal::{FsyncPolicy, Journal, JournalError, RecoveryStats};
use crate::proto::Response;
use crate::risk::{RiskConfig, RiskConfigError};
use crate::unix_nanos;

/// Driver errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// Journal open/append failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// Risk configuration rejected.
    #[error(transparent)]
    Risk(#[from] RiskConfigError),
    /// Connecting to the venue failed.
    #[error("connect to FIX venue at {addr}")]
    Connect {
        /// Address.
        addr: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Socket read/write failed.
    #[error("FIX socket")]
    Io(#[source] io::Error),
}

/// The FIX TCP driver.
#[derive(Debug)]
pub struct FixDriver {
    gw: Gateway,
    journal: Journal,
    stream: Option<TcpStream>,
    addr: String,
    out: Outputs,
    responses: Vec<(EngineId, Response)>,
    rbuf: Vec<u8>,
    recovery: RecoveryStats,
}

impl FixDriver {
    /// Opens the journal from `cfg`, recovering state.
    pub fn open(cfg: &Config) -> Result<FixDriver, DriverError> {
        Self::open_with(
            &cfg.fix.venue_addr,
            cfg.fix.session(),
            &cfg.risk,
            &cfg.journal.path,
            cfg.journal.fsync,
        )
    }

    /// Opens with explicit parts (tests).
    pub fn open_with(
        addr: &str,
        session: SessionConfig,
        risk: &RiskConfig,
        journal: &Path,
        fsync: FsyncPolicy,
    ) -> Result<FixDriver, DriverError> {
        let mut gw = Gateway::new(session, risk)?;
        if let Some(dir) = journal.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(dir);
        }
        let (journal, recovery) = Journal::open(journal, fsync, |k, p| gw.replay_record(k, p))?;
        Ok(FixDriver {
            gw,
            journal,
            stream: None,
            addr: addr.to_owned(),
            out: Outputs::default(),
            responses: Vec::new(),
            rbuf: vec![0; 1 << 16],
            recovery,
        })
    }

    /// What recovery found in the journal.
    pub fn recovery(&self) -> RecoveryStats {
        self.recovery
    }

    /// The gateway core.
    pub fn gateway(&self) -> &Gateway {
        &self.gw
    }

    /// Runs `f` against the core with the driver's outputs, then flushes them.
    pub fn with_gateway<R>(
        &mut self,
        f: impl FnOnce(&mut Gateway, &mut Outputs) -> R,
    ) -> Result<R, DriverError> {
        let r = f(&mut self.gw, &mut self.out);
        self.flush()?;
        Ok(r)
    }

    /// True while a TCP connection exists.
    pub fn is_connected(&self) -> bool {
        self.stream.is_some()
    }

    /// Connects to the venue and sends Logon.
    pub fn connect(&mut self) -> Result<(), DriverError> {
        let s = TcpStream::connect(&self.addr).map_err(|source| DriverError::Connect {
            addr: self.addr.clone(),
            source,
        })?;
        s.set_nodelay(true).map_err(DriverError::Io)?;
        self.stream = Some(s);
        self.gw.on_connect(unix_nanos(), &mut self.out);
        self.flush()
    }

    /// Closes the connection without a logout (as a crash would).
    pub fn drop_connection(&mut self) {
        self.stream = None;
        self.gw.on_disconnect();
    }

    /// One engine frame.
    pub fn engine_message(&mut self, engine: EngineId, bytes: &[u8]) -> Result<(), DriverError> {
        self.gw
            .on_engine_message(engine, bytes, unix_nanos(), &mut self.out);
        self.flush()
    }

    /// Waits up to `timeout` for venue bytes, processes them and the timers.
    pub fn poll(&mut self, timeout: Duration) -> Result<(), DriverError> {
        if let Some(s) = &mut self.stream {
            s.set_read_timeout(Some(timeout.max(Duration::from_micros(10))))
                .map_err(DriverError::Io)?;
            match s.read(&mut self.rbuf) {
                Ok(0) => {
                    self.drop_connection();
                }
                Ok(n) => self
                    .gw
                    .on_fix_bytes(&self.rbuf[..n], unix_nanos(), &mut self.out),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => self.drop_connection(),
            }
        } else {
            std::thread::sleep(timeout);
        }
        self.gw.on_timer(unix_nanos(), &mut self.out);
        self.flush()
    }

    /// Write-ahead: journal first, then FIX, then engine responses.
    fn flush(&mut self) -> Result<(), DriverError> {
        self.journal
            .append(&self.out.journal, self.out.journal_records)?;
        if !self.out.fix.is_empty() {
            if let Some(s) = &mut self.stream {
                if s.write_all(&self.out.fix).is_err() {
                    self.stream = None;
                    self.gw.on_disconnect();
                }
            }
        }
        self.responses.append(&mut self.out.engine);
        if self.out.disconnect {
            self.stream = None;
            self.gw.on_disconnect();
        }
        self.out.clear();
        Ok(())
    }

    /// Takes the engine responses produced so far.
    pub fn take_engine_responses(&mut self) -> Vec<(EngineId, Response)> {
        std::mem::take(&mut self.responses)
    }

    /// Forces the journal to disk.
    pub fn sync(&mut self) -> Result<(), DriverError> {
        Ok(self.journal.sync()?)
    }
}
