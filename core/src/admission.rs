//! Pre-authentication slots: how many handshakes that have proved nothing
//! yet a listener keeps at once, in total and per peer address. Every
//! listener that admits strangers (the orders listener, the recovery port,
//! RC fan-out through the orders listener) asks [`PendingCaps::check`]
//! before it spends anything on a connect request.
//!
//! The rule: the **per-address cap is checked first and is strictly less
//! than the total cap**, so one address can never hold every slot. A host
//! that floods connect requests and never completes a handshake holds at
//! most `per_address` slots; the other `total - per_address` stay free for
//! peers at other addresses, and a healthy peer gets one within one
//! handshake time. (Many addresses can still fill the total: that needs an
//! address-validating cookie before any slot is taken, which this module
//! does not do.)
//!
//! Pure values: the callers keep their pending handshakes and pass what
//! they hold; nothing here touches a device or a clock.

/// Why a pending slot was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingRefusal {
    /// This address already holds `per_address` pending handshakes.
    AddressFull,
    /// `total` pending handshakes are in progress.
    Full,
}

/// The caps on handshakes in progress (connect requests answered whose
/// peer has not proved knowledge of the secret yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingCaps {
    /// From one address at once; less than `total`.
    pub per_address: usize,
    /// From everyone at once.
    pub total: usize,
}

impl PendingCaps {
    /// Checks the caps' relation: `1 <= per_address < total`.
    pub fn validate(&self) -> Result<(), String> {
        if self.per_address == 0 || self.per_address >= self.total {
            return Err(format!(
                "{} per address must be at least 1 and less than the total of {} (one address must never hold every slot)",
                self.per_address, self.total
            ));
        }
        Ok(())
    }

    /// Whether a new handshake from `addr` may take a slot, given the
    /// addresses of the handshakes in progress. The address is checked
    /// before the total, so a refusal for a full listener is never charged
    /// to a peer whose own address holds nothing, and an address at its cap
    /// is told so even when the listener is also full.
    pub fn check<A: PartialEq>(
        &self,
        addr: &A,
        pending: impl IntoIterator<Item = A>,
    ) -> Result<(), PendingRefusal> {
        let (mut total, mut mine) = (0usize, 0usize);
        for a in pending {
            total += 1;
            if a == *addr {
                mine += 1;
            }
        }
        if mine >= self.per_address {
            return Err(PendingRefusal::AddressFull);
        }
        if total >= self.total {
            return Err(PendingRefusal::Full);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    const CAPS: PendingCaps = PendingCaps {
        per_address: 2,
        total: 8,
    };

    #[test]
    fn the_per_address_cap_must_be_below_the_total() {
        assert_eq!(CAPS.validate(), Ok(()));
        for (per_address, total) in [(0, 8), (8, 8), (9, 8), (1, 1)] {
            let c = PendingCaps { per_address, total };
            assert!(c.validate().is_err(), "{c:?}");
        }
    }

    #[test]
    fn an_address_at_its_cap_is_refused_before_the_total() {
        let a = IpAddr::from([198, 18, 0, 9]);
        let b = IpAddr::from([198, 18, 0, 1]);
        assert_eq!(CAPS.check(&a, [a, b]), Ok(()));
        assert_eq!(CAPS.check(&a, [a, a]), Err(PendingRefusal::AddressFull));
        // Full, and `a` holds its share: the address is what it is told.
        let full = [a, a, b, b, b, b, b, b];
        assert_eq!(CAPS.check(&a, full), Err(PendingRefusal::AddressFull));
        let c = IpAddr::from([198, 18, 0, 3]);
        assert_eq!(CAPS.check(&c, full), Err(PendingRefusal::Full));
    }

    /// A model of a listener (slots held for one handshake time, in ticks)
    /// under one address flooding a request every tick and never
    /// completing: a healthy peer at another address asking once, at any
    /// tick, is admitted at once. With the old order (total first, and a
    /// per-address cap of 16 above the total of 8) it never was.
    #[test]
    fn one_flooding_address_never_keeps_another_out() {
        let attacker = IpAddr::from([198, 18, 0, 101]);
        let healthy = IpAddr::from([198, 18, 0, 1]);
        let handshake_ticks = 25u64;
        let old = |addr: &IpAddr, held: &[(IpAddr, u64)]| {
            let mine = held.iter().filter(|(a, _)| a == addr).count();
            if held.len() >= 8 {
                Err(PendingRefusal::Full)
            } else if mine >= 16 {
                Err(PendingRefusal::AddressFull)
            } else {
                Ok(())
            }
        };
        for use_old in [false, true] {
            let mut held: Vec<(IpAddr, u64)> = Vec::new();
            let (mut healthy_in, mut attacker_in, mut asked) = (0, 0, 0);
            for now in 0..1000u64 {
                held.retain(|&(_, deadline)| now < deadline);
                // 100 requests from the attacker per tick.
                for _ in 0..100 {
                    let ok = if use_old {
                        old(&attacker, &held)
                    } else {
                        CAPS.check(&attacker, held.iter().map(|h| h.0))
                    };
                    if ok.is_ok() {
                        held.push((attacker, now + handshake_ticks));
                        attacker_in += 1;
                    }
                }
                if now % 7 == 3 {
                    asked += 1;
                    let ok = if use_old {
                        old(&healthy, &held)
                    } else {
                        CAPS.check(&healthy, held.iter().map(|h| h.0))
                    };
                    if ok.is_ok() {
                        healthy_in += 1;
                    }
                }
            }
            assert!(attacker_in > 0);
            if use_old {
                assert_eq!(healthy_in, 0, "the old order kept the healthy peer out");
            } else {
                assert_eq!(
                    healthy_in, asked,
                    "every attempt of the healthy peer got a slot"
                );
                assert!(held.iter().filter(|h| h.0 == attacker).count() <= 2);
            }
        }
    }
}
