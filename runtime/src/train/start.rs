//! Where a run's weights start: fresh from the initial weights for the seed, resumed from its
//! checkpoint (whose options it must share), or fine-tuned from given weights, whose head
//! rows are matched to the data's classes by name.

use std::path::Path;

use super::config::{same_options, Error, Result, RunOptions, TrainConfig};
use crate::compute::exec::Exec;
use crate::model::checkpoint::{Checkpoint, Progress, StateTensor};
use crate::model::{init, Arch, ModelConfig, ModelGraph};

/// The first configuration the autotuner's probe runs with.
/// Where a run starts: fresh (refused where `checkpoint` exists, which it would overwrite),
/// or from the checkpoint, whose settings the run must share (and whose tuning an autotuned
/// run reuses). Returns the configuration to run with and the checkpoint resumed.
pub(super) fn starting_point(
    config: &TrainConfig,
    options: &RunOptions,
    model: &ModelConfig,
    checkpoint: &Path,
) -> Result<(TrainConfig, Option<Checkpoint>)> {
    let mut config = config.clone();
    if options.resume {
        let c = Checkpoint::load(checkpoint)?;
        check_resumable(&c, model, &mut config, checkpoint)?;
        return Ok((config, Some(c)));
    }
    if checkpoint.exists() {
        return Err(Error::Config(format!(
            "{} exists: pass --resume to continue that run, or choose another --out",
            checkpoint.display()
        )));
    }
    Ok((config, None))
}

/// Checks that checkpoint `c` continues a run of `model` with `config`'s options; an autotuned
/// run takes the checkpoint's batch, loaders, ring and queue depth into `config`.
fn check_resumable(
    c: &Checkpoint,
    model: &ModelConfig,
    config: &mut TrainConfig,
    path: &Path,
) -> Result<()> {
    let moments = StateTensor::AdamM.prefix();
    if !c.tensors.iter().any(|t| t.0.starts_with(moments)) {
        return Err(Error::Config(format!(
            "{}: the checkpoint holds weights alone, without the optimizer's state (`fulcrum \
             export --checkpoint` writes such files): a run cannot resume from it; start a \
             new run from it with --init-from and another --out",
            path.display()
        )));
    }
    // The options first: a run resumed without its --replay trains fewer classes, and the
    // option says why better than the class count does.
    if let Some(saved) = &c.train {
        same_options(saved, config, path)?;
    }
    if &c.model != model {
        return Err(Error::Config(format!(
            "{}: the checkpoint is a {}@{} for {} classes; --data makes a {}@{} for {} classes \
             (the input size is the pack's --size)",
            path.display(),
            c.model.name,
            c.model.input,
            c.model.classes,
            model.name,
            model.input,
            model.classes
        )));
    }
    Ok(())
}

/// `a` and `b` are the same model at the same size, whatever their classes.
fn same_but_classes(a: &ModelConfig, b: &ModelConfig) -> bool {
    ModelConfig {
        classes: b.classes,
        ..a.clone()
    } == *b
}

/// Fine-tuning onto data of other class names: every weight of `base` but the heads' output
/// rows, which are matched by class name: a class of the data that `base` knows keeps its
/// heat-map row, a new one starts from the initial weights for `seed`; the box regression's
/// rows are kept. Returns the weights (in the order of `arch`'s parameters) and a line that
/// says which classes were kept and which are new.
fn class_mapped_weights(
    base: &Checkpoint,
    arch: &Arch,
    classes: &[String],
    seed: u64,
) -> Result<(Vec<Vec<f32>>, String)> {
    let fresh = init::init_params(arch, seed);
    let (old, new) = (base.classes.len(), classes.len());
    let found: Vec<Option<usize>> = classes
        .iter()
        .map(|c| base.classes.iter().position(|b| b == c))
        .collect();
    let mut values = Vec::with_capacity(fresh.len());
    for (spec, init) in arch.params().iter().zip(fresh) {
        let weights = base.weight(&spec.name).ok_or_else(|| {
            Error::Config(format!(
                "the weights to fine-tune have no {} (not a checkpoint of this model)",
                spec.name
            ))
        })?;
        let outputs = spec.shape[0];
        let head_out = spec.name.starts_with("head") && spec.name.contains(".out.");
        if !head_out {
            if weights.len() != init.len() {
                return Err(Error::Config(format!(
                    "the weights to fine-tune have {} values for {}, this model {}",
                    weights.len(),
                    spec.name,
                    init.len()
                )));
            }
            values.push(weights.to_vec());
            continue;
        }
        // Output rows: the classes' heat maps, then four of box regression.
        let row = init.len() / outputs;
        if outputs != new + 4 || weights.len() != (old + 4) * row {
            return Err(Error::Config(format!(
                "the weights to fine-tune have {} values for {}: not {old} classes of rows of {row}",
                weights.len(),
                spec.name
            )));
        }
        let mut v = init;
        let rows = |from: usize, to: usize, v: &mut Vec<f32>| {
            v[to * row..(to + 1) * row].copy_from_slice(&weights[from * row..(from + 1) * row]);
        };
        for (to, from) in found.iter().enumerate() {
            if let Some(from) = *from {
                rows(from, to, &mut v);
            }
        }
        for k in 0..4 {
            rows(old + k, new + k, &mut v);
        }
        values.push(v);
    }
    let (mut kept, mut fresh_classes) = (Vec::new(), Vec::new());
    for (class, from) in classes.iter().zip(&found) {
        match from {
            Some(_) => kept.push(class.as_str()),
            None => fresh_classes.push(class.as_str()),
        }
    }
    let dropped: Vec<&str> = base
        .classes
        .iter()
        .filter(|b| !classes.contains(b))
        .map(String::as_str)
        .collect();
    let list = |v: &[&str]| {
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.join(", ")
        }
    };
    Ok((
        values,
        format!(
            "fine-tuning onto other classes, matched by name: kept {} ({}); new, from initial \
             weights: {} ({}); not in the data, dropped: {} ({})",
            kept.len(),
            list(&kept),
            fresh_classes.len(),
            list(&fresh_classes),
            dropped.len(),
            list(&dropped)
        ),
    ))
}

/// The weights, moments and average the first step starts from, and the progress so far:
/// the checkpoint's (resuming), the given weights with fresh moments (fine-tuning, which must
/// be of the same model), or the initial weights for the seed.
pub(super) fn initial_state(
    exec: &mut Exec,
    graph: &ModelGraph,
    config: &TrainConfig,
    resumed: Option<&Checkpoint>,
    init_from: Option<&Checkpoint>,
    classes: &[String],
) -> Result<Progress> {
    let model = &graph.arch.config;
    match (resumed, init_from) {
        (Some(c), _) => {
            c.load_into(exec, graph, true)?;
            return Ok(c.progress);
        }
        (None, Some(base))
            if same_but_classes(&base.model, model)
                && !base.classes.is_empty()
                && base.classes != classes =>
        {
            let (values, mapping) = class_mapped_weights(base, &graph.arch, classes, config.seed)?;
            log::info!("{mapping}");
            start_from(exec, graph, &values)?;
        }
        (None, Some(base)) => {
            if base.model != *model {
                return Err(Error::Config(format!(
                    "the weights to fine-tune are a {}@{} for {} classes; {} needs a {}@{} for {} \
                     classes (the input size is the pack's --size)",
                    base.model.name,
                    base.model.input,
                    base.model.classes,
                    config.data.display(),
                    model.name,
                    model.input,
                    model.classes
                )));
            }
            base.load_into(exec, graph, false)?;
            zero_moments(exec, graph)?;
        }
        (None, None) => start_from(exec, graph, &init::init_params(&graph.arch, config.seed))?,
    }
    Ok(Progress {
        seed: config.seed,
        ..Progress::default()
    })
}

/// Starts from `values` (one per parameter, in order): the weights, the weight average at
/// the same values, AdamW's moments at zero.
fn start_from(exec: &mut Exec, graph: &ModelGraph, values: &[Vec<f32>]) -> Result<()> {
    for (p, v) in graph.params.iter().zip(values) {
        exec.write_f32(p.value, v)?;
        if let Some(ema) = p.ema {
            exec.write_f32(ema, v)?;
        }
    }
    zero_moments(exec, graph)
}

/// Starts AdamW's moments from zero (a fresh run, or fine-tuning from given weights).
fn zero_moments(exec: &mut Exec, graph: &ModelGraph) -> Result<()> {
    for (spec, p) in graph.arch.params().iter().zip(&graph.params) {
        let zeros = vec![0.0; spec.len()];
        for t in [p.m, p.v].into_iter().flatten() {
            exec.write_f32(t, &zeros)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fine_tuning_onto_other_classes_keeps_the_rows_of_the_classes_it_knows() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let base_model = ModelConfig::named_at("det-m", 3, 128).unwrap();
        let base = Checkpoint::initial(base_model, names(&["cat", "dog", "car"]), 1);
        let model = ModelConfig::named_at("det-m", 2, 128).unwrap();
        let arch = Arch::new(&model);
        let (values, said) =
            class_mapped_weights(&base, &arch, &names(&["car", "raccoon"]), 9).unwrap();
        let fresh = init::init_params(&arch, 9);
        assert_eq!(
            said,
            "fine-tuning onto other classes, matched by name: kept 1 (car); new, from initial \
             weights: 1 (raccoon); not in the data, dropped: 2 (cat, dog)"
        );
        let mut heads = 0;
        for ((spec, v), init) in arch.params().iter().zip(&values).zip(&fresh) {
            let old = base.weight(&spec.name).unwrap();
            if !(spec.name.starts_with("head") && spec.name.contains(".out.")) {
                assert_eq!(v.as_slice(), old, "{}", spec.name);
                continue;
            }
            heads += 1;
            let row = v.len() / 6;
            let at = |x: &[f32], r: usize| x[r * row..(r + 1) * row].to_vec();
            assert_eq!(at(v, 0), at(old, 2), "{}: car keeps its row", spec.name);
            assert_eq!(
                at(v, 1),
                at(init, 1),
                "{}: raccoon starts afresh",
                spec.name
            );
            for k in 0..4 {
                assert_eq!(at(v, 2 + k), at(old, 3 + k), "{}: box row {k}", spec.name);
            }
        }
        assert_eq!(heads, 6, "three levels' output weights and biases");
        // Weights of another model are refused, not mixed in.
        let other = Checkpoint::initial(ModelConfig::named_at("det-s", 3, 128).unwrap(), vec![], 1);
        assert!(class_mapped_weights(&other, &arch, &names(&["car"]), 9).is_err());
    }
}
