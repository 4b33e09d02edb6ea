//! Logging shim in the embassy style: one `info!(..)` call logs through `log` on Linux, through
//! `defmt` on a microcontroller, and compiles to nothing when neither feature is on. Declared
//! first in `lib.rs` (`#[macro_use] mod fmt;`) so every later module sees the macros.
//!
//! Format strings must stay in the subset both backends accept: `{}` on `&str`, integers and
//! types that implement both `Display` (for `log`) and `defmt::Format` (for `defmt`).
#![allow(unused_macros)]

#[cfg(all(feature = "log", feature = "defmt"))]
compile_error!(
    "fulcrum-board: features `log` and `defmt` are mutually exclusive. Use `log` on Linux \
     (the default) or `default-features = false, features = [\"defmt\"]` on firmware."
);

macro_rules! trace {
    ($s:literal $(, $x:expr)* $(,)?) => {{
        #[cfg(feature = "log")]
        ::log::trace!($s $(, $x)*);
        #[cfg(feature = "defmt")]
        ::defmt::trace!($s $(, $x)*);
        // Without a backend, still "use" the arguments so callers get no unused warnings.
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        let _ = ($(&$x),*);
    }};
}

macro_rules! debug {
    ($s:literal $(, $x:expr)* $(,)?) => {{
        #[cfg(feature = "log")]
        ::log::debug!($s $(, $x)*);
        #[cfg(feature = "defmt")]
        ::defmt::debug!($s $(, $x)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        let _ = ($(&$x),*);
    }};
}

macro_rules! info {
    ($s:literal $(, $x:expr)* $(,)?) => {{
        #[cfg(feature = "log")]
        ::log::info!($s $(, $x)*);
        #[cfg(feature = "defmt")]
        ::defmt::info!($s $(, $x)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        let _ = ($(&$x),*);
    }};
}

macro_rules! warn {
    ($s:literal $(, $x:expr)* $(,)?) => {{
        #[cfg(feature = "log")]
        ::log::warn!($s $(, $x)*);
        #[cfg(feature = "defmt")]
        ::defmt::warn!($s $(, $x)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        let _ = ($(&$x),*);
    }};
}

macro_rules! error {
    ($s:literal $(, $x:expr)* $(,)?) => {{
        #[cfg(feature = "log")]
        ::log::error!($s $(, $x)*);
        #[cfg(feature = "defmt")]
        ::defmt::error!($s $(, $x)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        let _ = ($(&$x),*);
    }};
}
