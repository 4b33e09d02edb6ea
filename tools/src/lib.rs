//! The code behind fulcrum's binaries: argument parsing, progress and printing. The work itself
//! is in the `fulcrum` crate; this stays thin.

pub mod args;
pub mod board_bench;
pub mod cmd;
pub mod logger;
pub mod output_file;
pub mod progress;
pub mod signals;
pub mod stdout;
pub mod system;

/// The error and its causes, leaving out causes the message already quotes (the runtime's
/// errors usually include their source's text).
pub fn describe(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

/// A command's exit status: its own, or 2 with the error logged; then 1 if a print to stdout
/// failed meanwhile (the work went on, see [`stdout`]).
pub fn exit_code(result: anyhow::Result<std::process::ExitCode>) -> std::process::ExitCode {
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            log::error!("{}", describe(&e));
            std::process::ExitCode::from(2)
        }
    };
    match stdout::finish() {
        Ok(()) => code,
        Err(message) => {
            log::error!("{message}");
            std::process::ExitCode::from(1)
        }
    }
}
