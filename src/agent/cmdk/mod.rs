//! Cmd+K on the user's models: the inline edit in the editor (`CmdKService/StreamCmdK`, and
//! `StreamHypermode`) and the prompt bar in the terminal (`StreamTerminalCmdK`).
//!
//! Sans-IO at the core, one way down: `call` (a decoded request) and `decide` (whose model it
//! runs on) at the bottom, `cache` (the items acknowledged by hash), `prompt` (request →
//! provider request) and `reply` (model text → response messages) above them, and `serve`,
//! the thin driver that calls the provider. `ledger` says what becomes of every request field.
//! The HTTP side is `agent::transport`'s.

mod cache;
mod call;
mod decide;
pub mod ledger;
mod prompt;
mod reply;
mod serve;

pub use cache::{item_hash, CacheLimits, Resolved};
pub use call::{CmdKCall, Surface};
pub use decide::{could_be_ours, refused, Whose, DEFAULT_MODEL};
pub use prompt::LineRange;
pub use reply::{CmdKResponse, Reply, Shape};
pub use serve::{CmdK, Step};
