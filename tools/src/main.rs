//! `fulcrum`: pack datasets, check them, stream them through the input pipeline, benchmark.

use clap::{Parser, Subcommand};
use fulcrum_tools::{cmd, logger};

#[derive(Parser)]
#[command(
    name = "fulcrum",
    version,
    about = "Training and inference runtime for a small object detector on single-board computers",
    long_about = "fulcrum keeps the accelerator busy: it packs datasets once into checksummed shards, \
                  reads them with io_uring into a fixed prefetch ring, and feeds the detector.\n\n\
                  Start with `fulcrum pack` (no arguments: the built-in synthetic dataset into \
                  data/synthetic), then `fulcrum inspect data/synthetic` and `fulcrum load data/synthetic`.\n\n\
                  Set FULCRUM_LOG=debug for more detail."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Demo(cmd::demo::Args),
    Pack(cmd::pack::Args),
    Inspect(cmd::inspect::Args),
    Load(cmd::load::Args),
    Bench(cmd::bench::Args),
    Board(cmd::board::Args),
    Devices(cmd::devices::Args),
    Balance(cmd::balance::Args),
    Simulate(cmd::simulate::Args),
    Train(cmd::train::Args),
    Eval(cmd::eval::Args),
    Infer(cmd::infer::Args),
    Client(cmd::client::Args),
    Export(cmd::export::Args),
}

fn main() -> std::process::ExitCode {
    logger::init(log::LevelFilter::Info);
    fulcrum_tools::signals::end_quietly_on_closed_pipe();
    let cli: Cli = fulcrum_tools::args::parse();
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Pack(a) => cmd::pack::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Load(a) => cmd::load::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Board(a) => cmd::board::run(a),
        Command::Devices(a) => cmd::devices::run(a),
        Command::Balance(a) => cmd::balance::run(a),
        Command::Simulate(a) => cmd::simulate::run(a),
        Command::Train(a) => cmd::train::run(a),
        Command::Eval(a) => cmd::eval::run(a),
        Command::Infer(a) => cmd::infer::run(a),
        Command::Client(a) => cmd::client::run(a),
        Command::Export(a) => cmd::export::run(a),
    };
    fulcrum_tools::exit_code(result)
}
