//! Configurations from TOML text or a TOML file, with the same keys (and
//! the same checks) as the `[ipc]` and `[orders]` tables of the binaries'
//! configuration files (`docs/reference.md`).

use crate::error::{guard, out_arg, str_arg, Fail, RocebusStatus};
use rocebus::ipc::IpcConfig;
use rocebus::orders::OrdersConfig;
use std::ffi::{c_char, c_int};

/// An ipc stream's configuration (`rocebus_ipc_config_from_toml`).
#[derive(Debug)]
pub struct RocebusIpcConfig(pub(crate) IpcConfig);

/// An orders connection's configuration (`rocebus_orders_config_from_toml`).
#[derive(Debug)]
pub struct RocebusOrdersConfig(pub(crate) OrdersConfig);

/// Parses `text` as the config's own keys, or as a file whose `[table]`
/// holds them (an `[ipc]` section, say, beside other sections of a
/// binary's configuration file, which are then not read). Neither config
/// has a key named like its table, so the two readings cannot be confused.
fn parse<T: serde::de::DeserializeOwned>(text: &str, table: &str) -> Result<T, Fail> {
    let value: toml::Table = toml::from_str(text)
        .map_err(|e| Fail::owned(RocebusStatus::Config, format!("invalid TOML: {e}")))?;
    let value = match value.get(table) {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => value,
    };
    toml::Value::Table(value)
        .try_into()
        .map_err(|e| Fail::owned(RocebusStatus::Config, format!("[{table}]: {e}")))
}

fn read_file(path: *const c_char) -> Result<String, Fail> {
    // SAFETY: the public functions' callers promise a NUL-terminated path.
    let path = unsafe { str_arg(path, "path") }?;
    std::fs::read_to_string(path)
        .map_err(|e| Fail::owned(RocebusStatus::Config, format!("reading {path}: {e}")))
}

fn ipc_config(text: &str, out: *mut *mut RocebusIpcConfig) -> Result<c_int, Fail> {
    out_arg(out, c"out is NULL")?;
    let cfg: IpcConfig = parse(text, "ipc")?;
    cfg.validate()
        .map_err(|e| Fail::owned(RocebusStatus::Config, e))?;
    // SAFETY: checked not NULL; the caller promises it is writable.
    unsafe { *out = Box::into_raw(Box::new(RocebusIpcConfig(cfg))) };
    Ok(0)
}

fn orders_config(text: &str, out: *mut *mut RocebusOrdersConfig) -> Result<c_int, Fail> {
    out_arg(out, c"out is NULL")?;
    let cfg: OrdersConfig = parse(text, "orders")?;
    cfg.validate().map_err(|e| {
        Fail::owned(
            RocebusStatus::Config,
            format!("invalid orders configuration: {e}"),
        )
    })?;
    // SAFETY: checked not NULL; the caller promises it is writable.
    unsafe { *out = Box::into_raw(Box::new(RocebusOrdersConfig(cfg))) };
    Ok(0)
}

/// Makes an ipc configuration from TOML text: the keys of the `[ipc]`
/// table (`dir`, `ring_bytes`, `max_payload`, `max_subscribers`, `flow`,
/// `liveness_ms`; missing keys take their defaults), either at the top
/// level or inside an `[ipc]` table (other tables are then ignored, so a
/// binary's whole configuration file will do). An empty string gives the
/// defaults.
/// On success `*out` is a new configuration to free with
/// `rocebus_ipc_config_free`.
///
/// # Safety
/// `toml` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_config_from_toml(
    toml: *const c_char,
    out: *mut *mut RocebusIpcConfig,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let text = unsafe { str_arg(toml, "toml") }?;
        ipc_config(text, out)
    })
}

/// As `rocebus_ipc_config_from_toml`, reading the file at `path`.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_config_from_file(
    path: *const c_char,
    out: *mut *mut RocebusIpcConfig,
) -> c_int {
    guard(|| ipc_config(&read_file(path)?, out))
}

/// Frees an ipc configuration (NULL is ignored). Handles made from it do
/// not need it any more.
///
/// # Safety
/// `cfg` is NULL or a configuration not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_config_free(cfg: *mut RocebusIpcConfig) {
    guard(|| {
        if !cfg.is_null() {
            // SAFETY: made by Box::into_raw above, not freed yet (the caller's promise).
            drop(unsafe { Box::from_raw(cfg) });
        }
        Ok(0)
    });
}

/// Makes an orders configuration from TOML text: the keys of the
/// `[orders]` table (`token`, `ring_size`, `max_payload`,
/// `connect_timeout_ms`, `[rc]`, ...; missing keys take their defaults),
/// at the top level or inside an `[orders]` table (other tables are then
/// ignored). On success `*out` is a
/// new configuration to free with `rocebus_orders_config_free`.
///
/// # Safety
/// `toml` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_config_from_toml(
    toml: *const c_char,
    out: *mut *mut RocebusOrdersConfig,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let text = unsafe { str_arg(toml, "toml") }?;
        orders_config(text, out)
    })
}

/// As `rocebus_orders_config_from_toml`, reading the file at `path`.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_config_from_file(
    path: *const c_char,
    out: *mut *mut RocebusOrdersConfig,
) -> c_int {
    guard(|| orders_config(&read_file(path)?, out))
}

/// Frees an orders configuration (NULL is ignored).
///
/// # Safety
/// `cfg` is NULL or a configuration not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_config_free(cfg: *mut RocebusOrdersConfig) {
    guard(|| {
        if !cfg.is_null() {
            // SAFETY: made by Box::into_raw above, not freed yet (the caller's promise).
            drop(unsafe { Box::from_raw(cfg) });
        }
        Ok(0)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_at_the_top_or_in_their_table() {
        let a: IpcConfig = parse("ring_bytes = 131072\nflow = \"drop\"", "ipc").unwrap();
        let b: IpcConfig = parse("[ipc]\nring_bytes = 131072\nflow = \"drop\"", "ipc").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.ring_bytes, 131072);
        let c: IpcConfig = parse("[other]\nx = 1\n[ipc]\nring_bytes = 131072", "ipc").unwrap();
        assert_eq!(c.ring_bytes, 131072);
        let d: IpcConfig = parse("", "ipc").unwrap();
        assert_eq!(d, IpcConfig::default());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_config_errors() {
        let e = parse::<IpcConfig>("ring_byte = 1", "ipc").unwrap_err();
        assert_eq!(e.code, RocebusStatus::Config);
        let mut out = std::ptr::null_mut();
        let code = ipc_config("ring_bytes = 1000", &mut out);
        assert_eq!(code.unwrap_err().code, RocebusStatus::Config);
        assert!(out.is_null());
        let e = parse::<OrdersConfig>("token = 5", "orders").unwrap_err();
        assert_eq!(e.code, RocebusStatus::Config);
    }
}
