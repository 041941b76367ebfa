//! Plumbing every room may use: it imports nothing from the crate.

pub mod side;
pub mod text;

pub use side::Side;
