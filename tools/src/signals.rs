//! SIGINT/SIGTERM as a stop request: long commands finish their current step, write what they
//! must (a checkpoint) and exit cleanly. A second signal restores the default and so kills.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// Set by the handler; polled by the work loop.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(signal: nix::libc::c_int) {
    // Only async-signal-safe work here: an atomic store, and resetting the disposition so
    // that a second Ctrl-C ends the process at once.
    STOP.store(true, Ordering::SeqCst);
    if let Ok(sig) = Signal::try_from(signal) {
        let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
        // SAFETY: installing the default disposition is async-signal-safe (sigaction(2)).
        let _ = unsafe { sigaction(sig, &default) };
    }
}

/// Routes SIGINT and SIGTERM to [`STOP`].
pub fn install() {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic and calls sigaction, both
        // async-signal-safe.
        if let Err(e) = unsafe { sigaction(sig, &action) } {
            log::warn!("cannot handle {sig}: {e}; stopping with it will not checkpoint");
        }
    }
}

/// Ends the process at once, as other Unix tools do, when its output is a pipe whose reader
/// has exited (`fulcrum infer DIR | head`), instead of panicking on the failed print. For the
/// command-line tools only: the service's sockets send with MSG_NOSIGNAL either way.
pub fn end_quietly_on_closed_pipe() {
    // SAFETY: the default disposition of SIGPIPE is always valid to install.
    if let Err(e) = unsafe { nix::sys::signal::signal(Signal::SIGPIPE, SigHandler::SigDfl) } {
        log::debug!("cannot restore SIGPIPE: {e}");
    }
}
