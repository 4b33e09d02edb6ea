//! The Vulkan test harness, shared by the unit tests here and the cross-crate tests.
//!
//! [`engine`] gives an engine with the Khronos validation layer on and a throwaway pipeline
//! cache, or `None` with a visible `SKIP:` line where this machine has no Vulkan, unless
//! `FULCRUM_REQUIRE_VULKAN=1` (CI), where that is a failure. [`assert_clean`] fails a test on
//! any validation message.

use super::{CacheDir, Engine, Options};

/// Environment variable: `1` makes a missing Vulkan device (or validation layer) a failure.
pub const REQUIRE_ENV: &str = "FULCRUM_REQUIRE_VULKAN";

/// Whether `FULCRUM_REQUIRE_VULKAN=1`.
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

/// A validated engine for test `test`, or `None` (after printing `SKIP:`) without Vulkan.
pub fn engine(test: &str) -> Option<Engine> {
    engine_with(test, CacheDir::Off)
}

/// As [`engine`], with the pipeline cache in `cache`.
pub fn engine_with(test: &str, cache: CacheDir) -> Option<Engine> {
    let options = Options {
        pipeline_cache: cache,
        ..options()
    };
    engine_with_options(test, &options)
}

/// The options of [`engine`]: validation on and no pipeline cache. Tests that change one
/// start from these (`Options { direct: Some(true), ..options() }`).
pub fn options() -> Options {
    Options {
        validation: true,
        pipeline_cache: CacheDir::Off,
        ..Options::default()
    }
}

/// As [`engine`], with `options` (which should ask for validation).
pub fn engine_with_options(test: &str, options: &Options) -> Option<Engine> {
    match Engine::new(options) {
        Ok(e) => Some(e),
        Err(e) if required() => {
            panic!("{REQUIRE_ENV}=1 but Vulkan with validation is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("SKIP: {test}: no Vulkan device with validation: {e}");
            None
        }
    }
}

/// Panics if the validation layer reported anything.
pub fn assert_clean(engine: &Engine) {
    let messages = engine.validation().messages();
    assert!(
        messages.is_empty(),
        "{} validation message(s):\n{}",
        messages.len(),
        messages.join("\n")
    );
}
