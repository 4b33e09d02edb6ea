//! Typed errors of the parsers behind command-line options and configuration keys: a name
//! that is not one of an option's choices, and a size or duration that does not read. The
//! value is quoted cut to a sensible length ([`crate::text::quoted`]): a 10 MB token must not
//! become a 10 MB message.

use crate::text::quoted as quote;

/// A value that is not one of the names an option takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {}: use {choices}", quote(given))]
pub struct UnknownChoice {
    /// What the option chooses ("engine", "--direct mode").
    pub what: &'static str,
    pub given: String,
    /// The names it takes, for people ("auto, cpu or vulkan").
    pub choices: &'static str,
}

impl UnknownChoice {
    pub fn new(what: &'static str, given: &str, choices: &'static str) -> Self {
        UnknownChoice {
            what,
            given: given.to_owned(),
            choices,
        }
    }
}

/// A quantity with a unit (a size, a duration) that does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadQuantity {
    #[error("{} is not a {kind} (e.g. {examples})", quote(given))]
    NotANumber {
        kind: &'static str,
        given: String,
        examples: &'static str,
    },
    #[error("{}: unknown {kind} unit {}; use {units}", quote(given), quote(unit))]
    UnknownUnit {
        kind: &'static str,
        given: String,
        unit: String,
        units: &'static str,
    },
    #[error("{}: {rule}", quote(given))]
    OutOfRange { given: String, rule: &'static str },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_value_and_cut_long_ones() {
        let e = UnknownChoice::new("engine", "gpu", "auto, cpu or vulkan");
        assert_eq!(
            e.to_string(),
            "unknown engine \"gpu\": use auto, cpu or vulkan"
        );
        let long = UnknownChoice::new("engine", &"x".repeat(100_000), "auto");
        assert!(long.to_string().len() < 120, "{long}");
        assert!(long.to_string().contains("(100000 bytes)"), "{long}");
        let e = BadQuantity::UnknownUnit {
            kind: "size",
            given: "3T".into(),
            unit: "t".into(),
            units: "k, M or G",
        };
        assert_eq!(
            e.to_string(),
            "\"3T\": unknown size unit \"t\"; use k, M or G"
        );
    }
}
