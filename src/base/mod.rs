//! Plumbing every room may use: cheap cancellation, one task per client connection, the
//! never-printing secret string and its scrubber, which side failed, text shaping, and the
//! process's open-files limit and memory, the listening socket a service manager hands over,
//! and values by id bounded in count and idle time. It imports nothing else from the crate.

pub mod activation;
pub(crate) mod cancel;
pub(crate) mod conn_tasks;
pub(crate) mod id_map;
pub mod process;
pub mod secret;
pub mod side;
pub mod text;

pub use side::Side;
