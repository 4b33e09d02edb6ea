//! Which board is this? [`detect_from`] works on the text of `/proc/device-tree/model` and
//! `/proc/cpuinfo` (pure, `no_std`, testable anywhere); `detect()` (feature `std`) reads them.

use crate::profile::{BoardProfile, GENERIC, ORIN_NANO, PI4, PI5, RK3588};

/// Lowercase fragments of a model / hardware / compatible string, first match wins.
const PATTERNS: &[(&str, &BoardProfile)] = &[
    // "Raspberry Pi 5 Model B", "Raspberry Pi 500", "Raspberry Pi Compute Module 5".
    ("raspberry pi 5", PI5),
    ("raspberry pi compute module 5", PI5),
    ("bcm2712", PI5),
    // "Raspberry Pi 4 Model B", "Raspberry Pi 400", "Raspberry Pi Compute Module 4".
    ("raspberry pi 4", PI4),
    ("raspberry pi compute module 4", PI4),
    ("bcm2711", PI4),
    // "NVIDIA Jetson Orin Nano Developer Kit" (also the "... Super" kit).
    ("orin nano", ORIN_NANO),
    // RK3588 and RK3588S boards by SoC name or by the common board names.
    ("rk3588", RK3588),
    ("rock 5", RK3588),
    ("rock5", RK3588),
    ("orange pi 5", RK3588),
];

/// `cpuinfo` keys whose values name the machine: Pi kernels append `Model`, 32-bit and some
/// vendor kernels print `Hardware`.
const CPUINFO_KEYS: &[&str] = &["model", "hardware", "compatible"];

/// Identifies the board from the device-tree model (may end in NUL, as the file does) and the
/// text of `/proc/cpuinfo`; anything unrecognised is [`GENERIC`].
pub fn detect_from(device_tree_model: Option<&str>, cpuinfo: &str) -> &'static BoardProfile {
    let model = device_tree_model.map(|m| m.trim_end_matches('\0').trim());
    if let Some(board) = model.and_then(match_name) {
        debug!("board {} from device-tree model", board.name);
        return board;
    }
    let named = cpuinfo_fields(cpuinfo)
        .filter(|(key, _)| CPUINFO_KEYS.iter().any(|k| key.eq_ignore_ascii_case(k)))
        .find_map(|(_, value)| match_name(value));
    if let Some(board) = named {
        debug!("board {} from /proc/cpuinfo", board.name);
        return board;
    }
    if is_rk3588_core_layout(cpuinfo) {
        debug!("board {} from its 4x A55 + 4x A76 core layout", RK3588.name);
        return RK3588;
    }
    GENERIC
}

fn match_name(text: &str) -> Option<&'static BoardProfile> {
    PATTERNS
        .iter()
        .find(|(pattern, _)| contains_ignore_ascii_case(text, pattern))
        .map(|&(_, board)| board)
}

fn contains_ignore_ascii_case(haystack: &str, needle: &str) -> bool {
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    n.is_empty() || h.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}

/// `key : value` pairs of `/proc/cpuinfo`, trimmed.
fn cpuinfo_fields(cpuinfo: &str) -> impl Iterator<Item = (&str, &str)> {
    cpuinfo
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
}

/// arm64 mainline kernels print no `Hardware` line, and containers often hide the device tree,
/// but `CPU part` survives: 4× Cortex-A55 (0xd05) + 4× Cortex-A76 (0xd0b) is the RK3588(S),
/// the only common SBC SoC with that mix. Worth the heuristic because it is the one board whose
/// core layout changes where loaders go.
fn is_rk3588_core_layout(cpuinfo: &str) -> bool {
    let (mut a55, mut a76) = (0, 0);
    for (key, value) in cpuinfo_fields(cpuinfo) {
        if key == "CPU part" {
            match value {
                "0xd05" => a55 += 1,
                "0xd0b" => a76 += 1,
                _ => {}
            }
        }
    }
    a55 == 4 && a76 == 4
}

/// Detects the running board from `/proc/device-tree/model` and `/proc/cpuinfo`; missing or
/// unreadable files just mean less evidence (ending at [`GENERIC`]).
#[cfg(feature = "std")]
pub fn detect() -> &'static BoardProfile {
    // `/proc/device-tree` is a link into `/sys/firmware/devicetree/base`; some sandboxes have
    // only one of them.
    let model = [
        "/proc/device-tree/model",
        "/sys/firmware/devicetree/base/model",
    ]
    .iter()
    .find_map(|path| read_text(path));
    let cpuinfo = read_text("/proc/cpuinfo").unwrap_or_default();
    let board = detect_from(model.as_deref(), &cpuinfo);
    debug!("board: {} ({})", board.name, board.id);
    board
}

/// A file's text, lossily decoded, without the trailing NULs device-tree strings carry.
#[cfg(feature = "std")]
fn read_text(path: &str) -> Option<std::string::String> {
    use std::borrow::ToOwned;
    let bytes = std::fs::read(path).ok()?;
    Some(
        std::string::String::from_utf8_lossy(&bytes)
            .trim_end_matches('\0')
            .to_owned(),
    )
}

/// Cores this process may run on (honours affinity masks and cgroup CPU quotas); at least 1.
/// For the generic profile, whose `cores` is 0.
#[cfg(feature = "std")]
pub fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    /// `/proc/cpuinfo` of a Radxa ROCK 5B (arm64, Rockchip 6.1 BSP), cut to the fields that
    /// differ between cores.
    const RK3588_CPUINFO: &str = "\
processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x2
CPU part\t: 0xd05
CPU revision\t: 0

processor\t: 1
CPU implementer\t: 0x41
CPU variant\t: 0x2
CPU part\t: 0xd05
CPU revision\t: 0

processor\t: 2
CPU implementer\t: 0x41
CPU variant\t: 0x2
CPU part\t: 0xd05
CPU revision\t: 0

processor\t: 3
CPU implementer\t: 0x41
CPU variant\t: 0x2
CPU part\t: 0xd05
CPU revision\t: 0

processor\t: 4
BogoMIPS\t: 48.00
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 0

processor\t: 5
CPU implementer\t: 0x41
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 0

processor\t: 6
CPU implementer\t: 0x41
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 0

processor\t: 7
CPU implementer\t: 0x41
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 0

Serial\t\t: 9a5f1e3c7b2d4e01
";

    /// `/proc/cpuinfo` of a Raspberry Pi 5 (Raspberry Pi OS bookworm, 6.6 kernel), trimmed.
    const PI5_CPUINFO: &str = "\
processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 1

processor\t: 3
BogoMIPS\t: 108.00
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 1

Revision\t: d04170
Serial\t\t: 2a8e1f0c7b3d5e9a
Model\t\t: Raspberry Pi 5 Model B Rev 1.0
";

    const PI4_CPUINFO_32BIT: &str = "\
processor\t: 0
model name\t: ARMv7 Processor rev 3 (v7l)
BogoMIPS\t: 108.00
CPU part\t: 0xd08

Hardware\t: BCM2711
Revision\t: c03114
Serial\t\t: 100000002d7c6a1e
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
";

    const X86_CPUINFO: &str = "\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz
";

    #[test]
    fn detects_boards_from_device_tree_model() {
        let cases: &[(&str, &BoardProfile)] = &[
            ("Raspberry Pi 4 Model B Rev 1.4\0", PI4),
            ("Raspberry Pi 400 Rev 1.0\0", PI4),
            ("Raspberry Pi Compute Module 4 Rev 1.1\0", PI4),
            ("Raspberry Pi 5 Model B Rev 1.0\0", PI5),
            ("Raspberry Pi Compute Module 5 Rev 1.0\0", PI5),
            ("NVIDIA Jetson Orin Nano Developer Kit\0", ORIN_NANO),
            ("Radxa ROCK 5B\0", RK3588),
            ("Radxa ROCK 5 Model B\0", RK3588),
            ("Orange Pi 5\0", RK3588),
            ("Orange Pi 5 Plus\0", RK3588),
            ("Firefly ITX-3588J HDMI (Linux) based on RK3588\0", RK3588),
            ("Raspberry Pi 3 Model B Plus Rev 1.3\0", GENERIC),
            ("\0", GENERIC),
        ];
        for &(model, board) in cases {
            assert_eq!(detect_from(Some(model), ""), board, "{model:?}");
        }
    }

    #[test]
    fn model_wins_over_cpuinfo() {
        assert_eq!(detect_from(Some("Radxa ROCK 5B\0"), RK3588_CPUINFO), RK3588);
        assert_eq!(detect_from(Some("Orange Pi 5"), PI5_CPUINFO), RK3588);
    }

    #[test]
    fn detects_from_cpuinfo_alone() {
        assert_eq!(detect_from(None, PI5_CPUINFO), PI5);
        assert_eq!(detect_from(None, PI4_CPUINFO_32BIT), PI4);
        // No name anywhere: the A55 + A76 layout identifies the RK3588.
        assert_eq!(detect_from(None, RK3588_CPUINFO), RK3588);
        assert_eq!(detect_from(None, "Hardware\t: Rockchip RK3588\n"), RK3588);
        assert_eq!(
            detect_from(None, "compatible\t: radxa,rock-5b rockchip,rk3588\n"),
            RK3588
        );
    }

    #[test]
    fn unknown_hosts_are_generic() {
        assert_eq!(detect_from(None, X86_CPUINFO), GENERIC);
        assert_eq!(detect_from(None, ""), GENERIC);
        // Four A76s alone are not an RK3588 (a Pi 5 without its Model line).
        let no_model = PI5_CPUINFO.replace("Model\t\t: Raspberry Pi 5 Model B Rev 1.0\n", "");
        assert_eq!(detect_from(None, &no_model), GENERIC);
    }

    #[cfg(feature = "std")]
    #[test]
    fn read_text_strips_device_tree_nul() {
        let path =
            std::env::temp_dir().join(std::format!("fulcrum-board-model-{}", std::process::id()));
        std::fs::write(&path, b"Raspberry Pi 5 Model B Rev 1.0\0").unwrap();
        let text = read_text(path.to_str().unwrap());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(text.as_deref(), Some("Raspberry Pi 5 Model B Rev 1.0"));
        assert_eq!(read_text("/nonexistent/fulcrum/model"), None);
    }

    #[cfg(feature = "std")]
    #[test]
    fn detect_and_host_cores_work_here() {
        // Whatever this machine is, detection must not fail and must give a real profile.
        assert!(crate::profile::ALL.contains(&detect()));
        assert!(host_cores() >= 1);
    }
}
