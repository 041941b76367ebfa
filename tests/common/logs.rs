//! Log output captured for assertions: install with `tracing_subscriber::fmt().with_writer(…)`.
#![allow(dead_code)]

use std::io::Write;
use std::sync::{Arc, Mutex};

/// A `tracing` writer keeping everything written; clones share the buffer.
#[derive(Clone, Default)]
pub struct Logs(pub Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
