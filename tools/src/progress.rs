//! Progress bars for long work; hidden when stderr is not a terminal (services, CI logs).

use indicatif::{ProgressBar, ProgressStyle};

pub fn bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    bar
}
