//! Plumbing every room may use: cheap cancellation, one task per client connection, the
//! never-printing secret string and its scrubber, which side failed, text shaping, and the
//! process's open-files limit and memory, and the listening socket a service manager hands
//! over. It imports nothing else from the crate.

pub mod activation;
pub(crate) mod cancel;
pub(crate) mod conn_tasks;
pub mod process;
pub mod secret;
pub mod side;
pub mod text;

pub use side::Side;
