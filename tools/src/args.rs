//! Argument parsing shared by the binaries: value parsers with the ranges that make sense (so
//! an absurd number is a clear error, not a panic or a run of a hundred years), and clap's own
//! errors with any long token the user gave cut short.

/// Longest run of non-blank characters printed whole in a message.
const LONGEST_WORD: usize = 200;

/// Parses the command line as `T`. A bad one prints clap's error, with long tokens cut, and
/// exits with status 2 (help and version print and exit 0 as usual).
pub fn parse<T: clap::Parser>() -> T {
    match T::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            eprint!("{}", cut_long_words(&e.render().to_string()));
            std::process::exit(2);
        }
    }
}

/// `text` with every run of over 200 non-blank characters (a pasted blob, a 100 kB "path")
/// cut to its first 48, with its length named.
pub fn cut_long_words(text: &str) -> String {
    if !text
        .split_whitespace()
        .any(|w| w.chars().count() > LONGEST_WORD)
    {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len().min(4096));
    let mut rest = text;
    while !rest.is_empty() {
        let blank = rest
            .find(|c: char| !c.is_whitespace())
            .unwrap_or(rest.len());
        out.push_str(&rest[..blank]);
        rest = &rest[blank..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let word = &rest[..end];
        if word.chars().count() > LONGEST_WORD {
            out.extend(word.chars().take(48));
            out.push_str(&format!("… ({} bytes)", word.len()));
        } else {
            out.push_str(word);
        }
        rest = &rest[end..];
    }
    out
}

/// Most records per batch: far past what fits any board (a larger model or input size is
/// refused lower down, naming the largest batch its kernels can index).
pub const MAX_BATCH: u32 = 65_536;
/// Most loader threads.
pub const MAX_LOADERS: u32 = 256;
/// Most ring slots (the ring's own limit).
pub const MAX_RING: u32 = fulcrum::ring::MAX_SLOTS as u32;
/// Most io_uring reads in flight per loader.
pub const MAX_IO_DEPTH: u32 = 4096;
/// Most trace events (32 bytes each, allocated up front: 320 MB).
pub const MAX_TRACE_EVENTS: u32 = 10_000_000;

/// Epochs of one run, 1 to a million: far past any real run; more is a typo.
pub fn epochs() -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::new().range(1..=1_000_000)
}

/// A finite number > 0.
pub fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{} is not a positive number", quoted(s))),
    }
}

/// A finite number ≥ 0.
pub fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{} is not a number ≥ 0", quoted(s))),
    }
}

/// A measurement's length in seconds: more than 0, at most a day.
pub fn seconds(s: &str) -> Result<f64, String> {
    const DAY: f64 = 86_400.0;
    match positive(s)? {
        v if v <= DAY => Ok(v),
        _ => Err(format!(
            "{} s is more than a day; use at most {DAY}",
            quoted(s)
        )),
    }
}

/// A factor between 0 (exclusive) and 1000.
pub fn factor(s: &str) -> Result<f64, String> {
    match positive(s)? {
        v if v <= 1000.0 => Ok(v),
        _ => Err(format!("{} is past 1000", quoted(s))),
    }
}

/// A probability: a number from 0 to 1.
pub fn probability(s: &str) -> Result<f32, String> {
    from_0_to_1(s, "a probability from 0 to 1")
}

/// A share of each batch: above 0 and below 1.
pub fn replay_fraction(s: &str) -> Result<f32, String> {
    number_where(
        s,
        fulcrum::loader::replay::fraction_fits,
        "a share of the batch above 0 and below 1 (e.g. 0.25)",
    )
}

/// A floor on fine-tuning's share of engine time: from 0 to [`fulcrum::serve::share::MAX_SHARE`].
pub fn fine_tune_share(s: &str) -> Result<f32, String> {
    let max = fulcrum::serve::share::MAX_SHARE;
    number_where(
        s,
        |v| (0.0..=max).contains(&v),
        &format!("a share from 0 to {max}"),
    )
}

/// A loss term's weight: a number from 0 to 10.
pub fn loss_weight(s: &str) -> Result<f32, String> {
    number_where(s, |v| (0.0..=10.0).contains(&v), "a weight from 0 to 10")
}

/// The regression weight of a box centre's neighbour cells: from 0 (off) to below 1.
pub fn neighbour_weight(s: &str) -> Result<f32, String> {
    number_where(
        s,
        |v| (0.0..1.0).contains(&v),
        "a neighbour weight from 0 (off) to below 1 (the centre's)",
    )
}

/// A gradient-norm limit: a number from 0 (off) to 10⁶.
pub fn clip_norm(s: &str) -> Result<f32, String> {
    number_where(
        s,
        |v| (0.0..=1e6).contains(&v),
        "a gradient-norm limit from 0 (off) to 1000000",
    )
}

/// A peak learning rate: finite, above 0 and at most 10 (AdamW's usual rates are 1e-4 to
/// 1e-2; past 10 a run only diverges).
pub fn learning_rate(s: &str) -> Result<f32, String> {
    number_where(
        s,
        |v| v > 0.0 && v <= 10.0,
        "a learning rate above 0 and at most 10 (try 0.001 to 0.01)",
    )
}

/// AdamW's weight decay: a number from 0 (off) to 1.
pub fn weight_decay(s: &str) -> Result<f32, String> {
    from_0_to_1(s, "a weight decay from 0 (off) to 1 (try 5e-4)")
}

/// An IoU: a number from 0 to 1.
pub fn iou(s: &str) -> Result<f32, String> {
    from_0_to_1(s, "an IoU from 0 to 1")
}

/// A number from 0 to 1, or the message that `s` is not `what`.
fn from_0_to_1(s: &str, what: &str) -> Result<f32, String> {
    number_where(s, |v| (0.0..=1.0).contains(&v), what)
}

/// `s` as a number for which `fits` holds (never NaN: every range refuses it), or the message
/// that `s` is not `what`.
fn number_where<T: std::str::FromStr + Copy>(
    s: &str,
    fits: impl Fn(T) -> bool,
    what: &str,
) -> Result<T, String> {
    match s.parse::<T>() {
        Ok(v) if fits(v) => Ok(v),
        _ => Err(format!("{} is not {what}", quoted(s))),
    }
}

/// A fraction strictly between 0 and 1 (a held-out share).
pub fn open_fraction(s: &str) -> Result<f64, String> {
    number_where(
        s,
        |v| v > 0.0 && v < 1.0,
        "a fraction above 0 and below 1 (e.g. 0.2)",
    )
}

/// A count from 1 to `most`: a parser for clap's `value_parser`.
pub fn count(most: u32) -> impl Fn(&str) -> Result<u32, String> + Clone + Send + Sync {
    move |s| count_within(s, u64::from(most)).map(|v| v as u32)
}

/// [`count`] for options held as `usize`.
pub fn count_usize(most: u32) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    move |s| count_within(s, u64::from(most)).map(|v| v as usize)
}

/// [`count`] for options held as `u64`.
pub fn count_u64(most: u64) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync {
    move |s| count_within(s, most)
}

fn count_within(s: &str, most: u64) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if (1..=most).contains(&v) => Ok(v),
        _ => Err(format!("{} is not a count from 1 to {most}", quoted(s))),
    }
}

/// An NMS IoU limit: above 0, at most 1 (1 keeps every detection).
pub fn nms_limit(s: &str) -> Result<f32, String> {
    let v = s
        .parse::<f32>()
        .map_err(|_| format!("{} is not a number", quoted(s)))?;
    fulcrum::infer::nms::check_limit(v)
        .map(|()| v)
        .map_err(|e| e.to_string())
}

/// Compute threads: 1 to the CPU engine's most ([`MAX_THREADS`]); more would be clamped
/// to it silently. Above the cores a warning says it is slower ([`warn_threads`]).
///
/// [`MAX_THREADS`]: fulcrum::compute::cpu::pool::MAX_THREADS
pub fn threads(s: &str) -> Result<usize, String> {
    let most = fulcrum::compute::cpu::pool::MAX_THREADS;
    match s.parse::<usize>() {
        Ok(v) if (1..=most).contains(&v) => Ok(v),
        _ => Err(format!(
            "{} is not a thread count from 1 to {most} (the engine's most); this machine has \
             {} cores",
            quoted(s),
            fulcrum_board::host_cores()
        )),
    }
}

/// Warns when `option` asks for more threads than there are cores: they take turns, which
/// is slower, and each costs its own working memory.
pub fn warn_threads(option: &str, threads: usize) {
    let cores = fulcrum_board::host_cores();
    if threads > cores {
        log::warn!(
            "{option} {threads} is more than the {cores} cores here: the threads will take \
             turns, which is slower, and each needs its own working memory; use {option} \
             {cores} or fewer"
        );
    }
}

fn quoted(s: &str) -> String {
    fulcrum::text::quoted(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_words_are_cut_and_the_rest_kept() {
        assert_eq!(cut_long_words("a b  c\n"), "a b  c\n");
        let long = "9".repeat(100_000);
        let cut = cut_long_words(&format!("error: invalid value '{long}' for '--batch'\n"));
        assert!(cut.len() < 120, "{cut}");
        assert!(cut.starts_with("error: invalid value '9999"), "{cut}");
        assert!(cut.ends_with("… (100002 bytes) for '--batch'\n"), "{cut}");
    }

    #[test]
    fn numbers_outside_their_range_are_refused() {
        for bad in ["0", "-1", "nan", "inf", "1e300", "", "x"] {
            assert!(seconds(bad).is_err(), "{bad}");
            assert!(factor(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds("0.2"), Ok(0.2));
        assert!(seconds("86401").is_err());
        assert_eq!(non_negative("0"), Ok(0.0));
        assert_eq!(probability("0.25"), Ok(0.25));
        assert_eq!(loss_weight("2"), Ok(2.0));
        assert!(loss_weight("11").is_err() && loss_weight("-1").is_err());
        assert_eq!((clip_norm("0"), clip_norm("2.5")), (Ok(0.0), Ok(2.5)));
        for bad in ["-1", "nan", "inf", "2e6", "x"] {
            assert!(clip_norm(bad).unwrap_err().contains("limit"), "{bad}");
        }
        for bad in ["1.5", "-0.1", "nan", "x"] {
            assert!(
                probability(bad).unwrap_err().contains("probability"),
                "{bad}"
            );
        }
        assert!(non_negative("-0.5").is_err());
        assert!(
            positive(&"9".repeat(100_000)).is_err(),
            "parses as infinity"
        );
        assert!(positive("1e400").is_err());
        for bad in ["-1", "0", "nan", "inf", "11", "x"] {
            assert!(
                learning_rate(bad).unwrap_err().contains("at most 10"),
                "{bad}"
            );
        }
        assert_eq!(learning_rate("0.004"), Ok(0.004));
        assert_eq!(
            (replay_fraction("0.25"), open_fraction("0.2")),
            (Ok(0.25), Ok(0.2))
        );
        for bad in ["0", "1", "nan", "-0.5", "x"] {
            assert!(replay_fraction(bad)
                .unwrap_err()
                .contains("share of the batch"));
            assert!(open_fraction(bad).unwrap_err().contains("fraction"));
        }
        assert_eq!(neighbour_weight("0"), Ok(0.0));
        assert!(neighbour_weight("1").is_err() && neighbour_weight("nan").is_err());
        assert!(fine_tune_share("0").is_ok() && fine_tune_share("0.95").is_err());
        assert_eq!((count(64)("64"), count(64)("1")), (Ok(64), Ok(1)));
        for bad in ["0", "65", "-1", "x"] {
            assert!(count(64)(bad).unwrap_err().contains("1 to 64"), "{bad}");
        }
        assert!(threads("17").is_err() && threads("0").is_err());
        assert!(nms_limit("0").is_err() && nms_limit("1").is_ok());
    }
}
