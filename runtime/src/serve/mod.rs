//! `fulcrumd`'s logic: the socket the robot's firmware talks to, peer checks, clients and their
//! frames (inline or in a memfd ring), inference and the replies. The wire format is
//! `fulcrum_board::protocol`; the binary in `tools/` only parses options and wires signals.
//!
//! Unsafe code here is limited to [`ring`]'s read-only mapping of a client's memfd and taking
//! ownership of descriptors the kernel hands over in [`socket`].

pub mod client;
pub mod fine_tune;
pub mod frame;
pub mod metrics;
pub mod notify;
pub mod ring;
pub mod server;
pub mod settings;
pub mod share;
pub mod socket;
pub mod stats;

pub use notify::Notifier;
pub use server::{Control, ServeConfig, Server};

use std::path::PathBuf;

use fulcrum_board::protocol::{ErrorCode, WireError};

/// What can go wrong serving, or talking to a daemon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("weights {}: {reason}", path.display())]
    Weights { path: PathBuf, reason: String },
    /// The engine could not be set up (no such device, no Vulkan, a budget it cannot keep):
    /// nothing the weights can mend.
    #[error(transparent)]
    Engine(crate::compute::exec::Error),
    #[error("{0}")]
    Config(String),
    #[error(
        "serving needs {} but --mem-budget is {}; lower --max-clients, --max-frame-side or \
         --top-k, or raise the budget. The plan:\n{table}",
        crate::base::human(*needed),
        crate::base::human(*budget)
    )]
    Budget {
        needed: u64,
        budget: u64,
        table: String,
    },
    #[error("protocol: {0}")]
    Protocol(WireError),
    /// The daemon answered with an error.
    #[error("the daemon says: {text} ({code})")]
    Remote { code: ErrorCode, text: String },
    #[error("unexpected reply from the daemon: {0}")]
    Unexpected(String),
}

impl Error {
    /// A failure to set up or run a predictor for the weights at `path`: the engine's errors
    /// as [`Error::Engine`] (the weights cannot mend them), the rest as the weights'.
    pub(crate) fn from_infer(path: &std::path::Path, e: crate::infer::Error) -> Error {
        use crate::model::checkpoint::LoadError;
        match e {
            crate::infer::Error::Exec(e) | crate::infer::Error::Load(LoadError::Exec(e)) => {
                Error::Engine(e)
            }
            e => Error::Weights {
                path: path.to_path_buf(),
                reason: e.to_string(),
            },
        }
    }

    /// A weights error with `what` (what failed) before its reason; any other error as it
    /// is (the engine's errors say what failed themselves).
    pub(crate) fn while_doing(self, what: &str) -> Error {
        match self {
            Error::Weights { path, reason } => Error::Weights {
                path,
                reason: format!("{what}: {reason}"),
            },
            e => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_failed_goes_before_a_weights_reason_only() {
        let weights = Error::Weights {
            path: "w.safetensors".into(),
            reason: "NaN in the output".into(),
        };
        match weights.while_doing("warm-up inference failed") {
            Error::Weights { reason, .. } => {
                assert_eq!(reason, "warm-up inference failed: NaN in the output")
            }
            e => panic!("{e:?}"),
        }
        let config = Error::Config("--nms: 2".into());
        assert_eq!(
            config.while_doing("warm-up inference failed").to_string(),
            Error::Config("--nms: 2".into()).to_string()
        );
    }
}
