//! User input quoted in messages: cut to a sensible length, so that a 10 MB token in a label
//! file gives a one-line warning, not megabytes of log.

/// Longest quote shown whole, in characters.
const WHOLE: usize = 64;
/// Characters kept of a longer one.
const KEPT: usize = 48;

/// `text` in quotes and escaped as `{:?}` would, cut after 48 characters with its full length
/// named when it is longer than 64.
pub fn quoted(text: &str) -> String {
    if text.chars().count() <= WHOLE {
        return format!("{text:?}");
    }
    let cut: String = text.chars().take(KEPT).collect();
    format!("{cut:?}… ({} bytes)", text.len())
}

/// Any value's `{:?}` form, cut the same way (lists of numbers from JSON, say).
pub fn debug_cut(value: &impl std::fmt::Debug) -> String {
    let text = format!("{value:?}");
    if text.chars().count() <= WHOLE {
        return text;
    }
    let cut: String = text.chars().take(KEPT).collect();
    format!("{cut}… ({} characters)", text.chars().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_whole_and_long_text_is_cut() {
        assert_eq!(quoted("0.5x"), "\"0.5x\"");
        assert_eq!(quoted(&"a".repeat(64)), format!("\"{}\"", "a".repeat(64)));
        let long = "9".repeat(10_000_000);
        let q = quoted(&long);
        assert!(q.len() < 80, "{q}");
        assert!(q.ends_with("… (10000000 bytes)"), "{q}");
        // Cut on characters, never inside one.
        let wide = "é".repeat(100);
        assert!(quoted(&wide).starts_with(&format!("\"{}\"", "é".repeat(48))));
        let list: Vec<f64> = (0..100_000).map(f64::from).collect();
        let d = debug_cut(&list);
        assert!(d.len() < 90 && d.starts_with("[0.0, 1.0"), "{d}");
    }
}
