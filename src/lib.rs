//! cursor-byok: run Cursor's Agent on your own model provider and API key.
//!
//! The flow is one-way: front door (`proxy`, `tls`) → routing → passthrough (`upstream`) or the
//! agent (`agent`, which calls `provider`); see README.md for the picture, and
//! docs/architecture-rooms.md for which module may use which (`tests/architecture.rs` checks it).

pub mod agent;
pub mod base;
pub mod capture;
pub mod cli;
pub mod config;
pub mod connect;
pub mod cursor;
pub mod http;
pub mod proto;
pub mod provider;
pub mod proxy;
#[doc(hidden)]
pub mod relay;
pub mod router;
pub mod setup;
pub mod status;
pub mod tls;
pub mod upstream;
