//! The HTTP/2 relay's connection state machine: arbitrary frames from the client and the
//! origin, in memory; it never panics and its limits hold after every step.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cursor_byok::relay::fuzz_relay(data);
});
