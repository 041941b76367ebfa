//! Helpers shared by integration tests (`mod common;` in a test file).

pub mod agent_client;
pub mod client;
pub mod cursor_upstream;
pub mod fake_cursor;
pub mod fake_provider;
