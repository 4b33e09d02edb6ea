//! `fulcrum::fuzzing::daemon_config` on arbitrary bytes: fulcrumd's TOML file, parsed and
//! checked; it must never panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fulcrum::fuzzing::daemon_config(data));
