//! The commands' printing to stdout without `println!`'s panic on a failed write (`fulcrum
//! inspect DATA > /dev/full`). The first failed write is remembered and later ones skipped, so
//! a command still finishes its real work (a pack still writes its shards); [`finish`] turns
//! it into the exit status at the end. A reader that went away (EPIPE, `fulcrum infer DIR |
//! head`) ends the process quietly by SIGPIPE as other Unix tools do
//! ([`crate::signals::end_quietly_on_closed_pipe`]); where SIGPIPE is ignored it is quiet too.

use std::io::{ErrorKind, Write};
use std::sync::Mutex;

/// The first write to stdout that failed.
static FAILED: Mutex<Option<std::io::Error>> = Mutex::new(None);

/// Writes `args` to stdout unless an earlier write failed; remembers the first failure.
pub fn write(args: std::fmt::Arguments) {
    let mut failed = FAILED.lock().unwrap_or_else(|e| e.into_inner());
    if failed.is_some() {
        return;
    }
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        *failed = Some(e);
    }
}

/// Flushes stdout and reports a failed write as the message for stderr. A reader that went
/// away is no error: the output was not wanted any more.
pub fn finish() -> Result<(), String> {
    let flushed = std::io::stdout().lock().flush();
    let mut failed = FAILED.lock().unwrap_or_else(|e| e.into_inner());
    match failed.take().map_or(flushed, Err) {
        Err(e) if e.kind() != ErrorKind::BrokenPipe => Err(format!(
            "cannot write to stdout: {e}; the command's output is incomplete (is the disk \
             full, or stdout redirected to a file that cannot be written?)"
        )),
        _ => Ok(()),
    }
}

/// `print!` to stdout without panicking on a failed write (see [`crate::stdout`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdout::write(format_args!($($arg)*)) };
}

/// `println!` to stdout without panicking on a failed write (see [`crate::stdout`]).
#[macro_export]
macro_rules! outln {
    () => { $crate::stdout::write(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}
