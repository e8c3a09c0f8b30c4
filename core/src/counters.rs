//! Shared-memory counters (in progress).
