//! Looking at the Vulkan devices without keeping their drivers in this process.
//!
//! Listing devices makes the Vulkan loader map every installed driver; Mesa's lavapipe brings
//! LLVM, some 45 MiB of code, and mapped code counts in the process's resident memory (and
//! its peak) for as long as the driver is loaded, which is past the listing. When the listing
//! only serves to choose an engine (`--engine auto`) and the CPU engine is chosen, none of it
//! is needed afterwards. So the listing runs in a child process forked for it, which sends
//! back a few bytes and exits; the parent maps nothing. Where the child cannot run or answer
//! in time, the caller lists in process, as before.

use std::io::Read;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, pipe, ForkResult};

/// How long a child may take: listing devices takes tens of milliseconds; a child stuck on a
/// lock another thread held at the fork is killed after this.
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(10);

/// At most this many bytes come back from the child.
const MAX_ANSWER: usize = 4096;

/// What came of running work in a child process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Child {
    /// The bytes the work produced (at most 4 KiB, not empty).
    Answered(Vec<u8>),
    /// No child could be made (no memory, too many processes): do the work here.
    NotMade,
    /// The child died, produced nothing or did not answer in time (it was then killed): what
    /// happened. Doing the work here could fare the same (a driver that crashes, a memory
    /// limit the child met), so callers should not.
    Failed(String),
}

/// Runs `work` in a forked child and returns what came of it (see [`Child`]); a child that
/// does not answer within `timeout` is killed.
///
/// `work` must not log, print or take locks other threads may hold (the child has only the
/// forking thread, and a lock held elsewhere at the fork is never released): listing Vulkan
/// devices through the loader is what it is for.
pub fn in_child(work: impl FnOnce() -> Vec<u8>, timeout: Duration) -> Child {
    let Ok((read, write)) = pipe() else {
        return Child::NotMade;
    };
    // SAFETY: after the fork the child runs only `work` (the caller's contract above), one
    // write(2) to the pipe and `_exit`, which runs no destructors or exit handlers that could
    // touch state other threads left locked; the parent keeps running as if nothing happened.
    let forked = unsafe { fork() };
    let Ok(forked) = forked else {
        return Child::NotMade;
    };
    match forked {
        ForkResult::Child => {
            drop(read);
            // A panic in the work is an answer of nothing, not a message on stderr.
            std::panic::set_hook(Box::new(|_| {}));
            let answer =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_default();
            let answer = &answer[..answer.len().min(MAX_ANSWER)];
            let status = match nix::unistd::write(&write, answer) {
                Ok(n) if n == answer.len() => 0,
                _ => 1,
            };
            // SAFETY: `_exit` ends the child at once; nothing of it needs cleaning up.
            unsafe { nix::libc::_exit(status) }
        }
        ForkResult::Parent { child } => {
            drop(write);
            let answer = read_until_closed(std::fs::File::from(read), timeout);
            if answer.is_none() {
                let _ = kill(child, Signal::SIGKILL);
            }
            match (answer, waitpid(child, None)) {
                (Some(bytes), Ok(WaitStatus::Exited(_, 0))) if !bytes.is_empty() => {
                    Child::Answered(bytes)
                }
                (None, _) => Child::Failed(format!("no answer within {} s", timeout.as_secs())),
                (_, Ok(WaitStatus::Signaled(_, signal, _))) => {
                    Child::Failed(format!("the child was killed by {signal:?}"))
                }
                (_, status) => Child::Failed(format!("the child ended with {status:?}")),
            }
        }
    }
}

/// Everything written to `pipe` until its writer closes it, or `None` after `timeout`.
fn read_until_closed(mut pipe: std::fs::File, timeout: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
        match pipe.read(&mut chunk) {
            Ok(0) => return Some(bytes),
            Ok(n) if bytes.len() + n <= MAX_ANSWER => bytes.extend_from_slice(&chunk[..n]),
            Ok(_) => return None,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_answers_and_a_stuck_or_failing_one_does_not() {
        let here = std::process::id();
        let Child::Answered(answer) = in_child(
            || std::process::id().to_string().into_bytes(),
            CHILD_TIMEOUT,
        ) else {
            panic!("the child answers")
        };
        let child: u32 = String::from_utf8(answer).unwrap().parse().unwrap();
        assert_ne!(child, here, "the work ran in another process");
        let started = Instant::now();
        let stuck = in_child(
            || {
                std::thread::sleep(Duration::from_secs(30));
                vec![1]
            },
            Duration::from_millis(200),
        );
        assert!(
            matches!(stuck, Child::Failed(ref why) if why.contains("no answer")),
            "{stuck:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "killed, not waited for"
        );
        assert!(matches!(
            in_child(|| panic!("in the child"), CHILD_TIMEOUT),
            Child::Failed(_)
        ));
        assert!(matches!(
            in_child(Vec::new, CHILD_TIMEOUT),
            Child::Failed(_)
        ));
        let killed = in_child(
            || {
                let _ = kill(nix::unistd::getpid(), Signal::SIGKILL);
                vec![1]
            },
            CHILD_TIMEOUT,
        );
        assert!(
            matches!(killed, Child::Failed(ref why) if why.contains("SIGKILL")),
            "{killed:?}"
        );
    }
}
