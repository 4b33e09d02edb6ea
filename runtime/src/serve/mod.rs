//! `fulcrumd`'s logic: the socket the robot's firmware talks to, peer checks, clients and their
//! frames (inline or in a memfd ring), inference and the replies. The wire format is
//! `fulcrum_board::protocol`; the binary in `tools/` only parses options and wires signals.
//!
//! Unsafe code here is limited to [`ring`]'s read-only mapping of a client's memfd and taking
//! ownership of descriptors the kernel hands over in [`socket`].

pub mod frame;
pub mod ring;
pub mod socket;
