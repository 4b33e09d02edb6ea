//! One module per subcommand: argument parsing and printing only; the work is in `fulcrum`.

pub mod balance;
pub mod bench;
pub mod bench_frames;
pub mod board;
pub mod client;
pub mod coco_results;
pub mod demo;
pub mod devices;
pub mod engine;
pub mod eval;
pub mod export;
pub mod infer;
pub mod inspect;
pub mod load;
pub mod pack;
pub mod pipeline;
pub mod simulate;
pub mod train;

/// `error` about the file `path`, naming it once: most errors of a file already start with it.
fn about_file(path: &std::path::Path, error: &dyn std::fmt::Display) -> String {
    let (name, message) = (path.display().to_string(), error.to_string());
    if message.starts_with(&name) {
        message
    } else {
        format!("{name}: {message}")
    }
}
