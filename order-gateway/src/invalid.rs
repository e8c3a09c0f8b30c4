//! A configuration value that parses but cannot be used, as `(key, problem)`: what the
//! validators of the config sections return. Its own module so a section's owner (e.g.
//! [`crate::market`]) can validate without importing [`crate::config`], which imports the
//! sections. Imports nothing from the crate.

/// A value problem: (key, problem).
pub type Invalid = (String, String);
