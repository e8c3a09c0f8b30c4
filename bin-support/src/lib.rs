//! What every rocebus binary does at start and exit.
//!
//! - [`init_logging`]: `tracing` to stderr, filtered by `RUST_LOG` (a default when unset),
//!   coloured only when stderr is a terminal. `ROCEBUS_LOG_COLOR=always|never|auto` forces
//!   either; `NO_COLOR` (any value) means never, as <https://no-color.org> asks.
//! - [`main`]: runs the binary's body and reports an error as its message and causes on one
//!   line (`error: open journal x: No such file or directory`), never with a backtrace,
//!   whatever `RUST_BACKTRACE` says: a backtrace is for the developers of rocebus, not for
//!   the operator whose configuration names a missing file.
//!
//! This crate owns process start-up and exit only; it knows nothing of what a binary does.

use std::io::IsTerminal;
use std::process::ExitCode;

/// Whether log lines carry ANSI colour codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Color {
    /// When stderr is a terminal.
    Auto,
    /// Always (`ROCEBUS_LOG_COLOR=always`).
    Always,
    /// Never (`ROCEBUS_LOG_COLOR=never`, or `NO_COLOR` set).
    Never,
}

/// The environment variable that forces coloured or plain logs.
pub const COLOR_ENV: &str = "ROCEBUS_LOG_COLOR";

impl Color {
    /// The choice the environment makes: `ROCEBUS_LOG_COLOR` first, then `NO_COLOR`.
    /// An unknown value of `ROCEBUS_LOG_COLOR` is an error naming the values it takes.
    pub fn from_env() -> Result<Color, String> {
        Color::from_values(
            std::env::var(COLOR_ENV).ok().as_deref(),
            std::env::var_os("NO_COLOR").is_some(),
        )
    }

    fn from_values(forced: Option<&str>, no_color: bool) -> Result<Color, String> {
        match forced {
            Some("always") => Ok(Color::Always),
            Some("never") => Ok(Color::Never),
            Some("auto") | Some("") | None if no_color => Ok(Color::Never),
            Some("auto") | Some("") | None => Ok(Color::Auto),
            Some(other) => Err(format!(
                "{COLOR_ENV}={other:?}: expected always, never or auto"
            )),
        }
    }

    /// Whether to colour a stream that is (or is not) a terminal.
    pub fn ansi(self, is_terminal: bool) -> bool {
        match self {
            Color::Always => true,
            Color::Never => false,
            Color::Auto => is_terminal,
        }
    }
}

/// Installs the `tracing` subscriber: stderr, `RUST_LOG` or `default_filter`, colour per
/// [`Color::from_env`]. A bad `ROCEBUS_LOG_COLOR` is an error (before anything is logged).
pub fn init_logging(default_filter: &str) -> anyhow::Result<()> {
    let color = Color::from_env().map_err(anyhow::Error::msg)?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // try_init: a second call (a test harness, a library that set one) keeps the first.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(color.ansi(std::io::stderr().is_terminal()))
        .with_env_filter(filter)
        .try_init();
    Ok(())
}

/// The one-line report of an error: its message, then each cause after `": "`.
pub fn report(e: &anyhow::Error) -> String {
    format!("error: {e:#}")
}

/// Runs a binary's body: `Ok(code)` exits with it; an error is printed by [`report`] to
/// stderr and exits 1. Use as `fn main() -> ExitCode { rocebus_bin_support::main(run) }`.
pub fn main(body: impl FnOnce() -> anyhow::Result<ExitCode>) -> ExitCode {
    match body() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}", report(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn colour_is_forced_by_the_variable_and_off_under_no_color() {
        assert_eq!(Color::from_values(None, false), Ok(Color::Auto));
        assert_eq!(Color::from_values(None, true), Ok(Color::Never));
        assert_eq!(Color::from_values(Some("always"), true), Ok(Color::Always));
        assert_eq!(Color::from_values(Some("never"), false), Ok(Color::Never));
        assert!(Color::from_values(Some("yes"), false)
            .unwrap_err()
            .contains("expected always, never or auto"));
        assert!(!Color::Auto.ansi(false), "a pipe or a file gets plain text");
        assert!(Color::Auto.ansi(true));
        assert!(Color::Always.ansi(false));
    }

    #[test]
    fn an_error_is_its_message_and_causes_on_one_line_without_a_backtrace() {
        let e = Err::<(), _>(std::io::Error::other("disk on fire"))
            .context("open journal gw.journal")
            .unwrap_err();
        assert_eq!(report(&e), "error: open journal gw.journal: disk on fire");
    }
}
