//! A training run's memory, planned in one place before anything is allocated: the loader's
//! plan and the engine's own (its tensor buffers and working memory) for a batch; the batch an
//! autotuned run starts with under the memory budget; and the refusal of a run that does not
//! fit, with the largest batch that would.

use super::autotune::{Decision, Tuning};
use super::config::{default_io_depth, Error, Result, TrainConfig};

use crate::base::MemoryPlan;
use crate::compute::exec::{Exec, ExecOptions};
use crate::compute::recording::Role;
use crate::io::IoKind;
use crate::loader::{self, Dataset, LoaderConfig};
use crate::model::{Arch, GraphOptions, ModelGraph};

/// What a run's plans are made of: the data, the model and the engine.
pub(super) struct Planner<'a> {
    pub dataset: &'a Dataset,
    pub arch: &'a Arch,
    pub graph_options: &'a GraphOptions,
    pub exec: &'a ExecOptions,
    pub io: IoKind,
    /// Bytes of the weights a fine-tune starts from (`--init-from`, the built-in base), held
    /// for the whole run; 0 for none.
    pub starting_weights: u64,
}

impl Planner<'_> {
    /// The model's graph at `batch`.
    pub fn graph(&self, batch: u32) -> Result<ModelGraph> {
        Ok(ModelGraph::build(
            self.arch,
            batch,
            &self.dataset.layout,
            self.graph_options,
        )?)
    }

    /// The engine's plan at `batch` ([`model_memory_plan`]).
    pub fn engine(&self, batch: u32) -> Result<MemoryPlan> {
        model_memory_plan(&self.graph(batch)?, self.exec)
    }

    /// The whole run's plan: the loaders' as `loader` sets them up, then `engine`.
    pub fn run(&self, loader: &LoaderConfig, engine: &MemoryPlan) -> MemoryPlan {
        let mut plan = loader::plan(self.dataset, loader, self.io);
        plan.items.extend(engine.items.iter().cloned());
        if self.starting_weights > 0 {
            plan.add(
                "starting weights (--init-from or the built-in base)",
                1,
                self.starting_weights,
            );
        }
        plan
    }

    /// The largest batch up to `most` whose run fits `budget`, the loaders set up by
    /// `loader_at` for that batch.
    pub fn largest_batch(
        &self,
        most: u32,
        budget: u64,
        loader_at: &dyn Fn(u32) -> LoaderConfig,
    ) -> Option<u32> {
        crate::base::largest_fitting(u64::from(most), |b| {
            self.engine(b as u32)
                .is_ok_and(|e| self.run(&loader_at(b as u32), &e).fits(Some(budget)))
        })
        .map(|b| b as u32)
    }
}

/// What a run was sized to before it starts.
pub(super) struct Sized {
    pub graph: ModelGraph,
    pub batch: u32,
    /// The engine's plan at `batch`.
    pub engine: MemoryPlan,
    /// The loaders' configuration (an autotuned run's starting tuning applied).
    pub loader: LoaderConfig,
    /// Why the batch is smaller than the one asked for, where the autotuner made it so.
    pub decisions: Vec<Decision>,
}

/// Sizes a run of `config` with the loaders of `loader`: a fresh autotuned run
/// (`fresh_tuning`) takes the largest batch up to the one asked for that fits `budget`, with
/// one loader and a ring of 2 to start from; then the whole plan must fit `budget` and the
/// limit the system puts on this process, or the run is refused here, before anything is
/// allocated.
pub(super) fn size_run(
    planner: &Planner<'_>,
    config: &TrainConfig,
    mut loader: LoaderConfig,
    budget: Option<u64>,
    fresh_tuning: bool,
) -> Result<Sized> {
    let mut decisions = Vec::new();
    if let (true, Some(budget)) = (fresh_tuning, budget) {
        let start = |b: u32| tuned_loader_config(&loader, &start_tuning(b));
        match planner.largest_batch(config.batch, budget, &start) {
            Some(b) if b < config.batch => {
                decisions.push(Decision {
                    step: 0,
                    what: format!("batch {b}"),
                    why: format!(
                        "batch {} does not fit --mem-budget {} with one loader and a ring of 2; \
                         {b} is the largest that does",
                        config.batch,
                        crate::base::human(budget)
                    ),
                });
                loader.batch = b as usize;
            }
            _ => {}
        }
    }
    let batch = loader.batch as u32;
    let graph = planner.graph(batch)?;
    let engine = model_memory_plan(&graph, planner.exec)?;
    if fresh_tuning {
        loader = tuned_loader_config(&loader, &start_tuning(batch));
    }
    let memory = planner.run(&loader, &engine);
    if let Some(budget) = budget {
        if !memory.fits(Some(budget)) {
            let at = |b: u32| LoaderConfig {
                batch: b as usize,
                ..loader.clone()
            };
            let best = planner.largest_batch(batch, budget, &at);
            return Err(budget_error(budget, &memory, best));
        }
    }
    within_process_limit(&memory)?;
    Ok(Sized {
        graph,
        batch,
        engine,
        loader,
        decisions,
    })
}

/// The tuning a fresh autotuned run starts from at `batch`: one loader, a ring of 2.
fn start_tuning(batch: u32) -> Tuning {
    Tuning {
        batch,
        loaders: 1,
        ring: 2,
        io_depth: default_io_depth(),
    }
}

/// The loader configuration for a tuning.
pub(super) fn tuned_loader_config(base: &LoaderConfig, t: &Tuning) -> LoaderConfig {
    LoaderConfig {
        batch: t.batch as usize,
        loaders: t.loaders,
        ring_slots: t.ring,
        uring: crate::io::UringOptions {
            queue_depth: t.io_depth,
            ..base.uring
        },
        ..base.clone()
    }
}

/// The tuning a loader configuration runs with.
pub(super) fn loader_tuning(lc: &LoaderConfig) -> Tuning {
    Tuning {
        batch: lc.batch as u32,
        loaders: lc.loaders,
        ring: lc.ring_slots,
        io_depth: lc.uring.queue_depth,
    }
}

/// Refuses a plan over the limit the system puts on this process (`ulimit -v`, a cgroup),
/// which would otherwise be killed or fail mid-run.
fn within_process_limit(memory: &MemoryPlan) -> Result<()> {
    match crate::base::process_memory_limit() {
        Some(limit) if memory.total() > limit.bytes => Err(Error::Config(format!(
            "the run plans {} of memory but {} allows this process {}: lower --batch or \
             --ring (--mem-budget says what fits), or raise that limit",
            crate::base::human(memory.total()),
            limit.source,
            crate::base::human(limit.bytes)
        ))),
        _ => Ok(()),
    }
}

/// What training `graph` on the engine `exec` chooses allocates besides the loader: the
/// engine's own plan ([`Exec::memory_plan`]) and the checkpoint's copy while saving (the
/// weights and state read back, which the file is written from).
pub fn model_memory_plan(graph: &ModelGraph, exec: &ExecOptions) -> Result<MemoryPlan> {
    let mut plan = Exec::memory_plan(&graph.recording, exec)?;
    let saved: u64 = graph
        .recording
        .tensors
        .iter()
        .filter(|t| matches!(t.role, Role::Param | Role::State))
        .map(|t| t.bytes())
        .sum();
    plan.add("checkpoint: weights and state read back", 1, saved);
    Ok(plan)
}

/// The refusal of a run over `budget`: what it needs, its largest item, and `best`, the
/// largest batch that fits at this ring depth.
fn budget_error(budget: u64, memory: &MemoryPlan, best: Option<u32>) -> Error {
    Error::Budget {
        budget: crate::base::human(budget),
        needed: crate::base::human(memory.total()),
        detail: match memory.items.iter().max_by_key(|i| i.bytes()) {
            Some(i) => format!(
                "largest: {} ×{} = {}",
                i.name,
                i.count,
                crate::base::human(i.bytes())
            ),
            None => "nothing planned".to_owned(),
        },
        advice: match best {
            Some(b) => format!("--batch {b} fits at this ring depth"),
            None => "no batch fits: raise --mem-budget or lower --ring".to_owned(),
        },
    }
}
