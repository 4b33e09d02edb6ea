//! `fulcrum::fuzzing::frame_request` on arbitrary bytes: a daemon request with a ring
//! attached, through the daemon's frame checks and every row read; it must never panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fulcrum::fuzzing::frame_request(data));
