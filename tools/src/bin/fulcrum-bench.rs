//! `fulcrum-bench`: the benchmark to copy onto a board. One static-ish binary, cross-compiled
//! (`cargo build --release --target aarch64-unknown-linux-gnu --bin fulcrum-bench`), that
//! detects the board, packs a synthetic dataset once and measures the input pipeline against
//! the raw read limit of the board's storage, all in one run.

use clap::Parser;
use fulcrum_tools::cmd::bench::{run_io, IoArgs};
use fulcrum_tools::{describe, logger};

#[derive(Parser)]
#[command(
    name = "fulcrum-bench",
    version,
    about = "Benchmark a board's input pipeline: raw reads vs io_uring vs pread vs loaders",
    after_help = "Example on a board:\n  fulcrum-bench --records 1024 --seconds 2 --json bench.json"
)]
struct Cli {
    #[command(flatten)]
    io: IoArgs,
}

fn main() -> std::process::ExitCode {
    logger::init(log::LevelFilter::Info);
    fulcrum_tools::signals::end_quietly_on_closed_pipe();
    let cli: Cli = fulcrum_tools::args::parse();
    let board = fulcrum_board::detect();
    println!(
        "board: {} ({} cores available)",
        board.name,
        fulcrum_board::host_cores()
    );
    match run_io(cli.io) {
        Ok(code) => code,
        Err(e) => {
            log::error!("{}", describe(&e));
            std::process::ExitCode::from(2)
        }
    }
}
