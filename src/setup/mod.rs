//! Set-up and daily-use helpers behind the CLI: wiring Cursor's settings (`cursor`, on the
//! JSONC editor `jsonc`), trusting the CA (`trust`), the `doctor` checklist, the login service
//! (`service`, logging to `logfile`) and the OS's automatic proxy setting (`pac`).

pub mod cursor;
pub mod diff;
pub mod doctor;
pub mod jsonc;
pub mod logfile;
pub mod os;
pub mod pac;
pub mod service;
pub mod trust;
