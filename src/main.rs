//! The `cursor-byok` binary: see `cursor_byok::cli` for the commands.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cursor_byok::cli::Args::parse();
    cursor_byok::cli::init_tracing(args.verbose);
    match cursor_byok::cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
