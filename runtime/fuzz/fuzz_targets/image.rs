//! `fulcrum::fuzzing::image` on arbitrary bytes: it must never panic or hang.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fulcrum::fuzzing::image(data));
