//! The binaries' logger: `level: message` on stderr, or with journald priority prefixes
//! (`<3>` error … `<7>` trace) when stderr goes to the journal (systemd sets JOURNAL_STREAM).

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Logger {
    journald: bool,
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        if self.journald {
            let priority = match record.level() {
                Level::Error => 3,
                Level::Warn => 4,
                Level::Info => 6,
                Level::Debug | Level::Trace => 7,
            };
            write_line(format_args!("<{priority}>{}", message(record)));
        } else {
            let level = record.level().as_str().to_lowercase();
            write_line(format_args!("{level}: {}", message(record)));
        }
    }

    fn flush(&self) {}
}

/// One line on stderr; a closed stderr (a pipe whose reader exited) loses it rather than
/// panicking in the middle of the work.
fn write_line(line: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The record's text, with any long token in it (a 100 kB path, a pasted blob) cut short.
fn message(record: &Record) -> String {
    crate::args::cut_long_words(&record.args().to_string())
}

/// Installs the logger; `FULCRUM_LOG=error|warn|info|debug|trace` overrides `default`.
pub fn init(default: LevelFilter) {
    let level = std::env::var("FULCRUM_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    // Leaked once at start: the logger lives as long as the process.
    let logger: &'static Logger = Box::leak(Box::new(Logger { journald }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}
