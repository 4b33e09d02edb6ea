//! One module per subcommand: argument parsing and printing only; the work is in `fulcrum`.

pub mod balance;
pub mod bench;
pub mod board;
pub mod client;
pub mod demo;
pub mod devices;
pub mod engine;
pub mod eval;
pub mod export;
pub mod infer;
pub mod inspect;
pub mod load;
pub mod pack;
pub mod pipeline;
pub mod simulate;
pub mod train;
