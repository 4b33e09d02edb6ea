//! The machine fulcrum runs on, as `fulcrum-bench` reports it: what it is ([`facts`]) and
//! whether it slowed itself down while measured ([`throttle`]).

pub mod facts;
pub mod throttle;

pub use facts::SystemFacts;
pub use throttle::{ThrottleReport, Watch};
