//! The whole gateway on arbitrary sequences of engine frames: well-formed requests built from
//! the input (numbered in order, re-sent, or unnumbered), raw and half-valid frames, engine
//! disconnects, kill switches, halts, FIX reconnects, checkpoints (journal segments), and
//! venue execution reports on the orders that made it out. After every call the invariants of
//! `order_gateway_fuzz::Harness::step`; at the end, a fresh gateway fed only the journal the
//! run produced must have the same orders, risk, request and response numbers per engine,
//! and FIX sequence numbers.
//!
//! Input: a sequence of operations, each an op byte (`op & 7` the kind, `op >> 3` picks the
//! engine) followed by the bytes its kind reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_gateway::proto::{msg_type, MassCancel, Request, Symbol, PRICE_SCALE};
use order_gateway::risk::KillScope;
use order_gateway_fuzz::{
    cancel, cancel_reject, exec_report, new_order, numbered, replace, symbols, venue_frame,
    Harness, Input, ACCOUNTS, ENGINES, REF_PX, SEC,
};

/// Request numbering as engines do it, and as they get it wrong.
struct Numbers {
    last: [u32; 3],
}

impl Numbers {
    fn next(&mut self, engine: usize, b: u8) -> u32 {
        let last = &mut self.last[engine];
        match b & 3 {
            0 => 0,
            // A re-send of something already numbered (or the same number again).
            3 => last.saturating_sub(u32::from(b >> 2)),
            _ => {
                // In order, or skipping some (requests the gateway never saw).
                *last += 1 + u32::from(b >> 2) / 48;
                *last
            }
        }
    }
}

/// A price near the reference: `b` steps of 0.1% either side (the collars are 5% and 10%),
/// or zero.
fn price(b: u8) -> i64 {
    match b {
        0x80 => 0,
        _ => REF_PX * PRICE_SCALE + i64::from(b as i8) * REF_PX * PRICE_SCALE / 1000,
    }
}

fn symbol(b: u8) -> Symbol {
    match b % 6 {
        4 => Symbol::new("BAD").expect("valid"),
        5 => Symbol([b' '; 8]),
        i => symbols()[usize::from(i)],
    }
}

fn account(b: u8) -> u32 {
    match b % 5 {
        0 | 1 => ACCOUNTS[0],
        2 | 3 => ACCOUNTS[1],
        _ => 9,
    }
}

/// Execution types the gateway acts on, and some it only has to survive.
const EXEC_TYPES: [u8; 12] = *b"0F458HGC126E";

fuzz_target!(|data: &[u8]| {
    let mut h = Harness::new();
    h.logon();
    let mut input = Input::new(data);
    let mut numbers = Numbers { last: [0; 3] };
    let mut exec_id = 0u64;
    while !input.is_empty() {
        let op = input.u8();
        let e = usize::from(op >> 3) % ENGINES.len();
        let engine = ENGINES[e];
        match op & 7 {
            0 => {
                let (cl, acct, sym, qty, px) =
                    (input.u8(), input.u8(), input.u8(), input.u16(), input.u8());
                let r = new_order(
                    u64::from(cl % 32),
                    account(acct),
                    symbol(sym),
                    sym & 0x80 != 0,
                    u32::from(qty % 1200),
                    price(px),
                );
                let seq = numbers.next(e, input.u8());
                h.engine(engine, &numbered(r, seq));
            }
            1 => {
                let cl = u64::from(input.u8() % 32);
                let seq = numbers.next(e, input.u8());
                h.engine(engine, &numbered(cancel(cl), seq));
            }
            2 => {
                let (cl, qty, px) = (input.u8(), input.u16(), input.u8());
                let r = replace(u64::from(cl % 32), u32::from(qty % 1200), price(px));
                let seq = numbers.next(e, input.u8());
                h.engine(engine, &numbered(r, seq));
            }
            3 => {
                let (acct, sym) = (input.u8(), input.u8());
                let acct = if acct & 1 == 0 { 0 } else { account(acct >> 1) };
                let r = Request::MassCancel(MassCancel::new(acct, symbol(sym)));
                let seq = numbers.next(e, input.u8());
                h.engine(engine, &numbered(r, seq));
            }
            4 => {
                // Garbage, or garbage behind a header that passes the first checks.
                let mode = input.u8();
                let len = usize::from(mode & 63);
                let mut frame = input.bytes(len).to_vec();
                if mode & 64 != 0 && frame.len() >= 4 {
                    let (ty, size) = [
                        (msg_type::NEW_ORDER, 48u16),
                        (msg_type::CANCEL, 16),
                        (msg_type::REPLACE, 32),
                        (msg_type::MASS_CANCEL, 24),
                    ][usize::from(mode >> 7) * 2 + usize::from(frame[0] & 1)];
                    frame[0] = ty;
                    frame[1] = 1;
                    frame[2..4].copy_from_slice(&size.to_le_bytes());
                }
                h.engine(engine, &frame);
            }
            5 => {
                let b = input.u8();
                let on = b & 8 == 0;
                match b & 7 {
                    0 => {
                        h.gw.on_engine_disconnect(engine, h.now, &mut h.out);
                        h.step();
                    }
                    1..=3 => {
                        let scope = match b & 7 {
                            1 => KillScope::Global,
                            2 => KillScope::Engine(engine),
                            _ => KillScope::Account(account(b >> 4)),
                        };
                        h.gw.set_kill(scope, on, h.now, &mut h.out);
                        h.step();
                    }
                    4 => {
                        h.gw.on_halt(symbol(b >> 4), on);
                    }
                    5 if b & 0x80 != 0 => {
                        // The driver starts a journal segment from a checkpoint.
                        h.checkpoint();
                    }
                    5 => {
                        // References refreshed (or left to go stale by the timers).
                        for s in &symbols()[..3] {
                            h.gw.on_reference_price(*s, REF_PX * PRICE_SCALE, h.now);
                        }
                    }
                    6 => h.timer(u64::from(b >> 3) * 4 * SEC),
                    _ => {
                        // The venue link drops; the venue logs on again (b & 16: resetting
                        // both sides' numbers) unless b & 32.
                        h.reconnect();
                        if b & 32 == 0 {
                            let reset = b & 16 != 0;
                            let fields: &[u8] = if reset {
                                b"98=0\x01108=30\x01141=Y\x01"
                            } else {
                                b"98=0\x01108=30\x01"
                            };
                            let seq = if reset { 1 } else { h.gw.session().next_in() };
                            h.venue(&venue_frame(b"A", seq, h.now, fields));
                        }
                    }
                }
            }
            6 => {
                // An execution report on request id `cl` (gateway ids are small and dense).
                let (cl, ty, last, cum, leaves, px, flags) = (
                    input.u8(),
                    input.u8(),
                    input.u16(),
                    input.u16(),
                    input.u16(),
                    input.u8(),
                    input.u8(),
                );
                // A new ExecID, or a repeat of a recent one (flags & 1).
                if flags & 1 == 0 || exec_id == 0 {
                    exec_id += 1;
                }
                let exec_ref = exec_id.saturating_sub(u64::from(flags >> 1) % 8);
                let ty = EXEC_TYPES[usize::from(ty) % EXEC_TYPES.len()];
                let report = exec_report(
                    h.gw.session().next_in(),
                    h.now,
                    u64::from(cl % 48),
                    exec_id,
                    ty,
                    u32::from(last % 1200),
                    price(px),
                    u32::from(cum % 1200),
                    u32::from(leaves % 1200),
                    matches!(ty, b'G' | b'H').then_some(exec_ref),
                );
                h.venue(&report);
            }
            _ => {
                let (cl, orig) = (input.u8(), input.u8());
                let seq = h.gw.session().next_in();
                let r = cancel_reject(seq, h.now, u64::from(cl % 48), u64::from(orig % 48));
                h.venue(&r);
            }
        }
    }
    h.check_replay();
});
