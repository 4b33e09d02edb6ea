//! A packed dataset opened for reading: its manifest and its checked, open shard files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{Manifest, RecordLayout};
use crate::io::{DirectMode, ShardSet};

pub struct Dataset {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub layout: RecordLayout,
    pub files: Arc<ShardSet>,
    /// Shared with other readers; keeps `pack --force` from replacing the dataset under us.
    _read_lock: Option<crate::durable::DirLock>,
}

impl Dataset {
    /// Loads the manifest and opens every shard, checking headers and lengths. Refused while a
    /// `pack` writes the folder.
    pub fn open(dir: &Path, direct: DirectMode) -> super::Result<Self> {
        // A folder that cannot be opened is left to the manifest's load to explain.
        let read_lock = match crate::durable::DirLock::try_lock(dir, false) {
            Ok(None) => {
                return Err(super::Error::BeingPacked {
                    dir: dir.to_owned(),
                })
            }
            Ok(lock) => lock,
            Err(_) => None,
        };
        let manifest = Manifest::load(dir)?;
        let files = Arc::new(ShardSet::open(dir, &manifest, direct)?);
        if let Some(note) = files.direct_note() {
            log::info!("{note}");
        }
        Ok(Dataset {
            dir: dir.to_owned(),
            layout: manifest.layout(),
            manifest,
            files,
            _read_lock: read_lock,
        })
    }

    pub fn records(&self) -> u64 {
        self.manifest.records
    }
}

/// What reading every record of a dataset found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VerifyReport {
    pub records: u64,
    pub boxes: u64,
    pub background: u64,
    /// Boxes per class id.
    pub boxes_per_class: Vec<u64>,
    /// Every bad record: file, record number in that file, what is wrong.
    pub problems: Vec<(PathBuf, u64, String)>,
}

impl Dataset {
    /// Reads the consecutive records from `first` on into `dst` (a whole number of records),
    /// as stored, with plain preads (for inspection, not for training).
    pub fn read_records(&self, first: u64, dst: &mut [u8]) -> crate::io::Result<()> {
        use crate::io::{ControlFlow, PreadBackend, ReadBackend};
        let rs = self.layout.record_size;
        let locs: Vec<_> = (first..first + (dst.len() / rs) as u64)
            .map(|i| self.files.locate(i))
            .collect();
        PreadBackend::new(self.files.clone())
            .read_records(&locs, rs, dst, &mut |_, _| ControlFlow::Continue(()))
    }

    /// Reads every record front to back and checks checksum, index and labels.
    /// `progress(done, total)` is called every few hundred records.
    pub fn verify_all(&self, progress: &dyn Fn(u64, u64)) -> super::Result<VerifyReport> {
        const CHUNK: usize = 64;
        let rs = self.layout.record_size;
        let mut buf = crate::base::HostMemory::zeroed(CHUNK * rs)
            .ok_or(crate::ring::Error::Alloc { bytes: CHUNK * rs })?;
        let classes = self.manifest.num_classes();
        let mut report = VerifyReport {
            boxes_per_class: vec![0; classes as usize],
            ..Default::default()
        };
        let total = self.records();
        let mut start = 0u64;
        while start < total {
            let n = CHUNK.min((total - start) as usize);
            let dst = &mut buf.as_mut_slice()[..n * rs];
            if let Err(e) = self.read_records(start, dst) {
                // A read failure makes the rest of that shard unreadable: name it and go on.
                let (path, record) = self.files.describe(start);
                report.problems.push((path, record, e.to_string()));
                start += n as u64;
                continue;
            }
            for (j, record) in dst.chunks_exact(rs).enumerate() {
                let index = start + j as u64;
                report.records += 1;
                match self.layout.verify(record, index, classes) {
                    Ok(()) => {
                        let count = self.layout.box_count(record) as usize;
                        report.boxes += count as u64;
                        report.background += (count == 0) as u64;
                        for b in 0..count {
                            report.boxes_per_class
                                [self.layout.read_box(record, b).class as usize] += 1;
                        }
                    }
                    Err(problem) => {
                        let (path, local) = self.files.describe(index);
                        report.problems.push((path, local, problem.to_string()));
                    }
                }
            }
            start += n as u64;
            progress(start, total);
        }
        Ok(report)
    }
}
