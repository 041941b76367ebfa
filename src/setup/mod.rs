//! Set-up and daily-use helpers behind the CLI: wiring Cursor's settings (`cursor`, on the
//! JSONC editor `jsonc`), trusting the CA (`trust`), and the `doctor` checklist.

pub mod cursor;
pub mod diff;
pub mod doctor;
pub mod jsonc;
pub mod trust;
