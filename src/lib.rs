//! cursor-byok: run Cursor's Agent on your own model provider and API key.
//!
//! The flow is one-way: front door (`proxy`, `tls`) → routing → passthrough (`upstream`) or the
//! agent (`agent`, which calls `provider`); see README.md for the picture.

pub mod cli;
pub mod config;
pub mod connect;
pub mod proto;
pub mod secret;
pub mod tls;
