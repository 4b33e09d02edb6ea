use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use fulcrum::io::DirectMode;
use fulcrum::loader::Dataset;

/// Print a packed dataset's summary and verify every record's checksum and labels.
///
/// Exits with status 1 if any record is bad, naming each file and record.
#[derive(clap::Args)]
pub struct Args {
    /// Packed dataset folder (written by `fulcrum pack`).
    dir: PathBuf,
    /// Print the report as JSON instead.
    #[arg(long)]
    json: bool,
    /// Also draw the first 32 records with their boxes into this PNG.
    #[arg(long, value_name = "PNG")]
    preview: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let dataset = Dataset::open(&a.dir, DirectMode::Off)?;
    let m = &dataset.manifest;
    let bar = crate::progress::bar(m.records, "verifying");
    let report = dataset.verify_all(&|done, _| bar.set_position(done))?;
    bar.finish_and_clear();
    if let Some(png) = &a.preview {
        let n = m.records.min(32) as usize;
        let mut buf = vec![0u8; n * m.record_size as usize];
        dataset.read_records(0, &mut buf)?;
        let picture = fulcrum::loader::preview::grid(
            &dataset.layout,
            buf.chunks_exact(m.record_size as usize),
            8,
        );
        picture
            .save(png)
            .with_context(|| format!("writing {}", png.display()))?;
        eprintln!("wrote {}", png.display());
    }
    let duplicates = fulcrum::pack::duplicates::in_pack(&a.dir, m.records);
    if a.json {
        let problems: Vec<_> = report
            .problems
            .iter()
            .map(|(p, r, what)| serde_json::json!({"file": p, "record": r, "problem": what}))
            .collect();
        let doc = serde_json::json!({
            "dir": a.dir, "manifest": m, "records_verified": report.records, "boxes": report.boxes,
            "background": report.background, "boxes_per_class": report.boxes_per_class, "problems": problems,
            "duplicates": duplicates.as_ref().map(|(_, named)| named),
        });
        crate::outln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        crate::outln!(
            "{}: {} records in {} shards (format v{}, dataset id {:016x})",
            a.dir.display(),
            m.records,
            m.shards.len(),
            m.version,
            m.dataset_id
        );
        crate::outln!(
            "  input {}×{}×{}, up to {} boxes, {} bytes per record",
            m.width,
            m.height,
            m.channels,
            m.max_boxes,
            m.record_size
        );
        crate::outln!("  source: {}", m.summary.source);
        crate::outln!(
            "  boxes: {} ({} background images)",
            report.boxes,
            report.background
        );
        if let Some(sides) = &m.summary.box_sides {
            crate::outln!("  box sizes: {}", sides.describe());
        }
        let mut classes: Vec<_> = m
            .classes
            .iter()
            .zip(&report.boxes_per_class)
            .filter(|(_, &n)| n > 0)
            .collect();
        classes.sort_by(|a, b| b.1.cmp(a.1));
        let shown: Vec<_> = classes
            .iter()
            .take(10)
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        crate::outln!(
            "  classes: {} named, {} present; most boxes: {}",
            m.classes.len(),
            classes.len(),
            shown.join(", ")
        );
        print_duplicates(duplicates.as_ref().map(|(g, named)| (g, named.as_slice())));
        if report.problems.is_empty() {
            crate::outln!("  checksums: all {} records OK", report.records);
        } else {
            crate::outln!(
                "  checksums: {} BAD records of {}",
                report.problems.len(),
                report.records
            );
            for (path, record, what) in &report.problems {
                crate::outln!("    {}: record {record}: {what}", path.display());
            }
        }
    }
    Ok(if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The groups of duplicate pictures inside the pack, the first few named.
fn print_duplicates(found: Option<(&fulcrum::pack::duplicates::Groups, &[Vec<String>])>) {
    const SHOWN: usize = 10;
    let Some((groups, named)) = found else {
        crate::outln!(
            "  duplicates: not known (a synthetic pack, or packed before pictures were hashed)"
        );
        return;
    };
    if groups.groups.is_empty() {
        crate::outln!("  duplicates: none (no two records show the same picture)");
        return;
    }
    crate::outln!(
        "  duplicates: {} groups, {} records ({} pairs byte-identical, {} the same picture saved \
         again); each group trains the model on one picture several times:",
        groups.groups.len(),
        groups.images(),
        groups.exact_pairs,
        groups.near_pairs
    );
    for names in named.iter().take(SHOWN) {
        crate::outln!("    {}", names.join(" = "));
    }
    if named.len() > SHOWN {
        crate::outln!(
            "    … and {} more groups (--json lists them all)",
            named.len() - SHOWN
        );
    }
}
