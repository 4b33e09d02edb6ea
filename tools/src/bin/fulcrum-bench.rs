//! `fulcrum-bench`: the benchmark to copy onto a board. One binary, cross-compiled
//! (`cargo build --release --target aarch64-unknown-linux-gnu --bin fulcrum-bench`), that
//! identifies the board and measures its input pipeline, its compute engines and their balance
//! in one run (see [`fulcrum_tools::board_bench`]).

use clap::Parser;
use fulcrum_tools::{board_bench, logger};

#[derive(Parser)]
#[command(
    name = "fulcrum-bench",
    version,
    about = "Benchmark a board: what it is, its input pipeline (raw reads vs io_uring vs pread vs \
             loaders), det-s on every compute engine and thread count, the balance equation with \
             the board's own figures, and whether it throttled meanwhile",
    after_help = "Examples on a board:\n  fulcrum-bench --json bench.json\n  fulcrum-bench --quick\n\
                  FULCRUM_CPU_KERNELS=portable fulcrum-bench   (the CPU engine without its SIMD kernels)"
)]
struct Cli {
    #[command(flatten)]
    args: board_bench::Args,
}

fn main() -> std::process::ExitCode {
    logger::init(log::LevelFilter::Info);
    fulcrum_tools::signals::end_quietly_on_closed_pipe();
    let cli: Cli = fulcrum_tools::args::parse();
    fulcrum_tools::exit_code(board_bench::run(cli.args))
}
