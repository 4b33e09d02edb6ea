use std::process::ExitCode;

/// Show the board fulcrum detected (or a named profile) and how it uses its cores.
#[derive(clap::Args)]
pub struct Args {
    /// A profile to show instead of the detected one: pi4, pi5, orin-nano, rk3588, generic.
    name: Option<String>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let profile = match &a.name {
        Some(name) => fulcrum_board::BoardProfile::by_name(name).ok_or_else(|| {
            anyhow::anyhow!("unknown board {name:?}: use pi4, pi5, orin-nano, rk3588 or generic")
        })?,
        None => fulcrum_board::detect(),
    };
    let cores = match profile.cores {
        0 => fulcrum_board::host_cores(),
        n => n as usize,
    };
    crate::outln!("board: {} ({})", profile.name, profile.id);
    crate::outln!(
        "  cores: {cores} (big {:?}, little {:?})",
        profile.big_cores,
        profile.little_cores
    );
    crate::outln!(
        "  loaders pinned to: {}",
        if profile.loader_cores().is_empty() {
            "no pinning (OS schedules)".to_owned()
        } else {
            format!("{:?}", profile.loader_cores())
        }
    );
    crate::outln!("  storage: {:?}", profile.storage);
    crate::outln!("  gpu: {}", profile.gpu.driver.unwrap_or("none expected"));
    Ok(ExitCode::SUCCESS)
}
