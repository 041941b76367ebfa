//! The `cursor-byok` binary: see `cursor_byok::cli` for the commands.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cursor_byok::cli::Args::parse();
    if let Err(e) = cursor_byok::cli::init_logging(&args) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    match cursor_byok::cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
