//! Idle strategies for polling loops, and thread pinning.
//!
//! A busy-polling thread on an isolated core uses [`IdleStrategy::BusySpin`]
//! and never gives the core away; threads that share cores back off.

use std::time::Duration;

/// What a polling loop does when a poll found no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", deny_unknown_fields)]
pub enum IdleStrategy {
    /// Spin with a pause hint: lowest latency, burns the core.
    BusySpin,
    /// Yield the core to the scheduler between polls.
    Yield,
    /// Spin, then yield, then sleep with exponential back-off up to `max_park_us`.
    Backoff {
        /// Idle polls spent spinning.
        max_spins: u32,
        /// Idle polls spent yielding after the spins.
        max_yields: u32,
        /// Longest sleep, microseconds.
        max_park_us: u64,
    },
}

impl Default for IdleStrategy {
    fn default() -> Self {
        IdleStrategy::Backoff {
            max_spins: 10_000,
            max_yields: 100,
            max_park_us: 1000,
        }
    }
}

/// Per-loop idle state: call [`idle`](Idler::idle) with the work count of
/// each poll. No allocation, no system call while spinning.
#[derive(Debug, Clone)]
pub struct Idler {
    strategy: IdleStrategy,
    idle_polls: u64,
    park_us: u64,
}

impl Idler {
    /// A fresh idler.
    pub fn new(strategy: IdleStrategy) -> Self {
        Self {
            strategy,
            idle_polls: 0,
            park_us: 1,
        }
    }

    /// Call after each poll with how much work it did.
    #[inline]
    pub fn idle(&mut self, work: usize) {
        if work > 0 {
            self.idle_polls = 0;
            self.park_us = 1;
            return;
        }
        self.idle_polls += 1;
        match self.strategy {
            IdleStrategy::BusySpin => std::hint::spin_loop(),
            IdleStrategy::Yield => std::thread::yield_now(),
            IdleStrategy::Backoff {
                max_spins,
                max_yields,
                max_park_us,
            } => {
                if self.idle_polls <= max_spins as u64 {
                    std::hint::spin_loop();
                } else if self.idle_polls <= max_spins as u64 + max_yields as u64 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(self.park_us));
                    self.park_us = (self.park_us * 2).min(max_park_us.max(1));
                }
            }
        }
    }

    /// The current sleep length of the back-off (tests, diagnostics).
    pub fn park_us(&self) -> u64 {
        self.park_us
    }
}

/// Pins the calling thread to `core` (an index into the cores the process
/// may use). Returns false if the core does not exist or pinning failed.
pub fn pin_current_thread(core: usize) -> bool {
    pin_to(core).is_ok()
}

/// A configured core the thread could not be pinned to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot pin this thread to core {core}: this process may run on cores {allowed:?} \
     (taskset, cgroups or isolcpus decide): name one of those, or remove the core setting \
     to run unpinned"
)]
pub struct PinError {
    /// The core asked for.
    pub core: usize,
    /// The cores the process may run on.
    pub allowed: Vec<usize>,
}

/// Pins the calling thread to `core`; an error says which cores the process may use. A
/// service whose configuration names a core fails its start with it: a trading thread that
/// silently runs unpinned shares its core and its cache with whatever the scheduler puts
/// there, and its tail latency shows it.
pub fn pin_to(core: usize) -> Result<(), PinError> {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    match ids.iter().find(|c| c.id == core) {
        Some(&c) if core_affinity::set_for_current(c) => Ok(()),
        _ => Err(PinError {
            core,
            allowed: ids.iter().map(|c| c.id).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_escalates_and_resets() {
        let mut i = Idler::new(IdleStrategy::Backoff {
            max_spins: 2,
            max_yields: 1,
            max_park_us: 4,
        });
        for _ in 0..3 {
            i.idle(0);
        }
        assert_eq!(i.park_us(), 1);
        i.idle(0);
        i.idle(0);
        i.idle(0);
        assert_eq!(i.park_us(), 4);
        i.idle(1);
        assert_eq!(i.park_us(), 1);
    }

    #[test]
    fn idle_strategy_from_toml() {
        #[derive(serde::Deserialize)]
        struct W {
            idle: IdleStrategy,
        }
        let w: W = toml::from_str("idle = { kind = \"busy_spin\" }").unwrap();
        assert_eq!(w.idle, IdleStrategy::BusySpin);
        let w: W = toml::from_str(
            "idle = { kind = \"backoff\", max_spins = 1, max_yields = 2, max_park_us = 3 }",
        )
        .unwrap();
        assert_eq!(
            w.idle,
            IdleStrategy::Backoff {
                max_spins: 1,
                max_yields: 2,
                max_park_us: 3
            }
        );
        assert!(toml::from_str::<W>("idle = { kind = \"nap\" }").is_err());
    }

    #[test]
    fn pinning_to_a_missing_core_fails() {
        assert!(!pin_current_thread(100_000));
        let e = pin_to(100_000).unwrap_err();
        assert_eq!(e.core, 100_000);
        assert!(e.allowed.contains(&0), "{e}");
        assert!(
            e.to_string()
                .contains("cannot pin this thread to core 100000"),
            "{e}"
        );
        assert!(pin_current_thread(0));
    }
}
