//! What a board is, read from `/proc` and `/sys`: the device-tree model, the CPU clusters and
//! their frequency limits, memory, the storage under a path, the kernel. Everything is read
//! under a root folder (`/` on a board, a fixture tree in tests) and anything missing is
//! `None`, not an error: containers and VMs hide much of it.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// The facts of one machine (see the module docs).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SystemFacts {
    /// The board profile fulcrum uses (`fulcrum board`).
    pub board: String,
    /// `/proc/device-tree/model`, where there is a device tree.
    pub model: Option<String>,
    pub arch: String,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: Option<String>,
    pub clusters: Vec<CpuCluster>,
    pub memory: Option<Memory>,
    /// The storage the measured data lives on.
    pub storage: Option<Storage>,
}

/// CPUs of one kind with the same frequency limits.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CpuCluster {
    /// `Cortex-A76`, or the `model name` on x86.
    pub core: String,
    pub cpus: Vec<u32>,
    pub min_mhz: Option<u32>,
    pub max_mhz: Option<u32>,
    pub governor: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Memory {
    pub total_mib: u64,
    pub available_mib: Option<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Storage {
    pub mount_point: String,
    pub filesystem: String,
    /// The block device (`mmcblk0p2`), or the mount's source where there is none.
    pub device: String,
    /// `SD card`, `eMMC`, `NVMe`, `SATA/USB disk`, … where the kernel says.
    pub kind: Option<String>,
}

impl SystemFacts {
    /// Reads the facts under `root`, with the storage of `data` (a path under `root`'s view).
    pub fn read(root: &Path, data: Option<&Path>) -> SystemFacts {
        let cpuinfo = read_text(root, "proc/cpuinfo").unwrap_or_default();
        let model = read_text(root, "proc/device-tree/model")
            .or_else(|| read_text(root, "sys/firmware/devicetree/base/model"))
            .map(|m| m.trim_end_matches('\0').trim().to_owned())
            .filter(|m| !m.is_empty());
        let board = fulcrum_board::detect_from(model.as_deref(), &cpuinfo);
        SystemFacts {
            board: board.name.to_owned(),
            model,
            arch: std::env::consts::ARCH.to_owned(),
            kernel: read_text(root, "proc/sys/kernel/osrelease").map(|s| s.trim().to_owned()),
            clusters: clusters(root, &cpuinfo),
            memory: read_text(root, "proc/meminfo").and_then(|t| memory(&t)),
            storage: data.and_then(|d| storage(root, d)),
        }
    }
}

/// A file's text under `root`, `None` when it cannot be read.
pub(crate) fn read_text(root: &Path, path: &str) -> Option<String> {
    let bytes = std::fs::read(root.join(path)).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// A number in a file under `root` (sysfs values end in a newline).
pub(crate) fn read_u64(root: &Path, path: &str) -> Option<u64> {
    read_text(root, path)?.trim().parse().ok()
}

/// The core names of Arm's `CPU part` numbers on the boards fulcrum targets and their kin.
fn arm_core(part: &str) -> Option<&'static str> {
    Some(match part {
        "0xd03" => "Cortex-A53",
        "0xd04" => "Cortex-A35",
        "0xd05" => "Cortex-A55",
        "0xd07" => "Cortex-A57",
        "0xd08" => "Cortex-A72",
        "0xd09" => "Cortex-A73",
        "0xd0a" => "Cortex-A75",
        "0xd0b" => "Cortex-A76",
        "0xd0c" => "Neoverse-N1",
        "0xd0d" => "Cortex-A77",
        "0xd41" => "Cortex-A78",
        "0xd42" => "Cortex-A78AE",
        "0xd44" => "Cortex-X1",
        "0xd46" => "Cortex-A510",
        "0xd47" => "Cortex-A710",
        "0xd48" => "Cortex-X2",
        "0xd4b" => "Cortex-A78C",
        _ => return None,
    })
}

/// Each processor's core name from `/proc/cpuinfo`: the Arm part, or x86's `model name`.
fn cores_of(cpuinfo: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let mut current: Option<u32> = None;
    let mut name: Option<String> = None;
    let mut flush = |cpu: Option<u32>, name: &mut Option<String>| {
        if let Some(cpu) = cpu {
            out.push((cpu, name.take().unwrap_or_else(|| "unknown".to_owned())));
        }
    };
    for line in cpuinfo.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => {
                flush(current, &mut name);
                current = value.parse().ok();
            }
            "model name" if name.is_none() => name = Some(value.to_owned()),
            "CPU part" => {
                name =
                    Some(arm_core(value).map_or_else(|| format!("Arm part {value}"), str::to_owned))
            }
            _ => {}
        }
    }
    flush(current, &mut name);
    out
}

/// The CPUs grouped by core name and frequency limits, in CPU order.
fn clusters(root: &Path, cpuinfo: &str) -> Vec<CpuCluster> {
    let mut out: Vec<CpuCluster> = Vec::new();
    for (cpu, core) in cores_of(cpuinfo) {
        let freq = |file: &str| {
            read_u64(
                root,
                &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/{file}"),
            )
            .map(|khz| (khz / 1000) as u32)
        };
        let (min_mhz, max_mhz) = (freq("cpuinfo_min_freq"), freq("cpuinfo_max_freq"));
        let governor = read_text(
            root,
            &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"),
        )
        .map(|g| g.trim().to_owned());
        match out
            .iter_mut()
            .find(|c| c.core == core && c.min_mhz == min_mhz && c.max_mhz == max_mhz)
        {
            Some(c) => c.cpus.push(cpu),
            None => out.push(CpuCluster {
                core,
                cpus: vec![cpu],
                min_mhz,
                max_mhz,
                governor,
            }),
        }
    }
    out
}

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, in MiB.
fn memory(meminfo: &str) -> Option<Memory> {
    let kib = |key: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    Some(Memory {
        total_mib: kib("MemTotal")? / 1024,
        available_mib: kib("MemAvailable").map(|k| k / 1024),
    })
}

/// One line of `/proc/self/mountinfo`: (mount point, filesystem, source).
fn mount_entry(line: &str) -> Option<(String, String, String)> {
    let (left, right) = line.split_once(" - ")?;
    let mount_point = unescape(left.split(' ').nth(4)?);
    let mut right = right.split(' ');
    let (fs, source) = (right.next()?, right.next()?);
    Some((mount_point, fs.to_owned(), unescape(source)))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|o| o.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(o)) => {
                out.push((o[0] - b'0') * 64 + (o[1] - b'0') * 8 + (o[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount `path` lies on (the longest mount point above it) and what its device is.
fn storage(root: &Path, path: &Path) -> Option<Storage> {
    let path: PathBuf = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let mountinfo = read_text(root, "proc/self/mountinfo")?;
    let (mount_point, filesystem, source) = mountinfo
        .lines()
        .filter_map(mount_entry)
        .filter(|(mp, _, _)| path.starts_with(mp))
        .max_by_key(|(mp, _, _)| mp.len())?;
    let device = source.strip_prefix("/dev/").unwrap_or(&source).to_owned();
    let kind = source
        .strip_prefix("/dev/")
        .and_then(|dev| block_kind(root, dev));
    Some(Storage {
        mount_point,
        filesystem,
        device,
        kind,
    })
}

/// What kind of storage a block device (or partition) is, from its name and `/sys/block`.
fn block_kind(root: &Path, dev: &str) -> Option<String> {
    let disk = disk_of(dev);
    if disk.starts_with("mmcblk") {
        // The MMC core says `SD` or `MMC` (eMMC) for the card behind the host controller.
        let kind = read_text(root, &format!("sys/block/{disk}/device/type"));
        return Some(match kind.as_deref().map(str::trim) {
            Some("SD") => "SD card".to_owned(),
            Some("MMC") => "eMMC".to_owned(),
            _ => "MMC/SD".to_owned(),
        });
    }
    if disk.starts_with("nvme") {
        return Some("NVMe".to_owned());
    }
    let rotational = read_u64(root, &format!("sys/block/{disk}/queue/rotational"));
    if disk.starts_with("sd") {
        return Some(match rotational {
            Some(1) => "SATA/USB disk (rotational)".to_owned(),
            _ => "SATA/USB disk".to_owned(),
        });
    }
    rotational.map(|r| {
        if r == 1 {
            "rotational disk"
        } else {
            "solid-state disk"
        }
        .to_owned()
    })
}

/// The whole disk of a partition: `mmcblk0p2` → `mmcblk0`, `nvme0n1p1` → `nvme0n1`,
/// `sda2` → `sda`.
fn disk_of(dev: &str) -> &str {
    if dev.starts_with("mmcblk") || dev.starts_with("nvme") {
        return match dev.rfind('p') {
            Some(i)
                if i > 0
                    && dev[i + 1..].chars().all(|c| c.is_ascii_digit())
                    && i + 1 < dev.len() =>
            {
                &dev[..i]
            }
            _ => dev,
        };
    }
    dev.trim_end_matches(|c: char| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A Raspberry Pi 5 as its /proc and /sys show it (trimmed), data on the SD card.
    fn pi5(root: &Path) {
        write(
            root,
            "proc/device-tree/model",
            "Raspberry Pi 5 Model B Rev 1.0\0",
        );
        let mut cpuinfo = String::new();
        for cpu in 0..4 {
            cpuinfo += &format!(
                "processor\t: {cpu}\nBogoMIPS\t: 108.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0b\n\n"
            );
            let f = format!("sys/devices/system/cpu/cpu{cpu}/cpufreq");
            write(root, &format!("{f}/cpuinfo_min_freq"), "1500000\n");
            write(root, &format!("{f}/cpuinfo_max_freq"), "2400000\n");
            write(root, &format!("{f}/scaling_governor"), "ondemand\n");
        }
        write(root, "proc/cpuinfo", &cpuinfo);
        write(root, "proc/sys/kernel/osrelease", "6.6.51+rpt-rpi-2712\n");
        write(
            root,
            "proc/meminfo",
            "MemTotal:        4143216 kB\nMemFree:  100 kB\nMemAvailable:    3512004 kB\n",
        );
        write(
            root,
            "proc/self/mountinfo",
            "22 1 179:2 / / rw,noatime shared:1 - ext4 /dev/mmcblk0p2 rw\n\
             25 22 179:1 / /boot/firm\\040ware rw shared:2 - vfat /dev/mmcblk0p1 rw\n",
        );
        write(root, "sys/block/mmcblk0/device/type", "SD\n");
    }

    #[test]
    fn a_pi5_is_read_from_its_proc_and_sys() {
        let tmp = tempfile::tempdir().unwrap();
        pi5(tmp.path());
        let f = SystemFacts::read(tmp.path(), Some(Path::new("/home/pi/data")));
        assert_eq!(f.board, "Raspberry Pi 5");
        assert_eq!(f.model.as_deref(), Some("Raspberry Pi 5 Model B Rev 1.0"));
        assert_eq!(f.kernel.as_deref(), Some("6.6.51+rpt-rpi-2712"));
        assert_eq!(
            f.clusters,
            [CpuCluster {
                core: "Cortex-A76".into(),
                cpus: vec![0, 1, 2, 3],
                min_mhz: Some(1500),
                max_mhz: Some(2400),
                governor: Some("ondemand".into()),
            }]
        );
        assert_eq!(
            f.memory,
            Some(Memory {
                total_mib: 4046,
                available_mib: Some(3429)
            })
        );
        let s = f.storage.unwrap();
        assert_eq!(
            (s.mount_point.as_str(), s.filesystem.as_str()),
            ("/", "ext4")
        );
        assert_eq!(
            (s.device.as_str(), s.kind.as_deref()),
            ("mmcblk0p2", Some("SD card"))
        );
        // An escaped mount point, the longer match.
        let s = storage(tmp.path(), Path::new("/boot/firm ware/x")).unwrap();
        assert_eq!(
            (s.mount_point.as_str(), s.filesystem.as_str()),
            ("/boot/firm ware", "vfat")
        );
    }

    #[test]
    fn big_and_little_cores_make_two_clusters() {
        let tmp = tempfile::tempdir().unwrap();
        let mut cpuinfo = String::new();
        for cpu in 0..8 {
            let (part, max) = if cpu < 4 {
                ("0xd05", 1800000)
            } else {
                ("0xd0b", 2256000)
            };
            cpuinfo += &format!("processor\t: {cpu}\nCPU part\t: {part}\n\n");
            let f = format!("sys/devices/system/cpu/cpu{cpu}/cpufreq");
            write(
                tmp.path(),
                &format!("{f}/cpuinfo_max_freq"),
                &format!("{max}\n"),
            );
        }
        write(tmp.path(), "proc/cpuinfo", &cpuinfo);
        let f = SystemFacts::read(tmp.path(), None);
        assert_eq!(f.board, "RK3588");
        let got: Vec<_> = f
            .clusters
            .iter()
            .map(|c| (c.core.as_str(), c.cpus.len(), c.max_mhz))
            .collect();
        assert_eq!(
            got,
            [("Cortex-A55", 4, Some(1800)), ("Cortex-A76", 4, Some(2256))]
        );
    }

    #[test]
    fn an_empty_root_gives_unknowns_not_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let f = SystemFacts::read(tmp.path(), Some(tmp.path()));
        assert_eq!(
            (f.model, f.kernel, f.memory, f.storage),
            (None, None, None, None)
        );
        assert!(f.clusters.is_empty());
    }

    #[test]
    fn partitions_map_to_their_disks() {
        for (dev, disk) in [
            ("mmcblk0p2", "mmcblk0"),
            ("mmcblk1", "mmcblk1"),
            ("nvme0n1p1", "nvme0n1"),
            ("nvme0n1", "nvme0n1"),
            ("sda2", "sda"),
            ("vdb", "vdb"),
        ] {
            assert_eq!(disk_of(dev), disk, "{dev}");
        }
    }
}
