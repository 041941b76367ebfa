//! Plumbing every room may use: it imports nothing from the crate.

pub mod text;
