//! A discrete-event simulation of the input pipeline — `N` loader workers, at most `D` batches
//! outstanding, one consumer (the training step) — under two policies, with the exact closed
//! form it must agree with when every time is constant. `fulcrum simulate` prints its
//! [`SimReport`] and draws its [`Timeline`].
//!
//! # The model
//!
//! Time is an integer number of nanoseconds, so constant times give exact results (no rounding
//! drift over a long run). Batches are numbered `0, 1, 2, …`.
//!
//! - **Loaders.** `N` workers, each producing one batch at a time. Batch `i` takes
//!   `load(i)` to produce: a draw of the load-time distribution that belongs to the batch
//!   (seeded by `(seed, 1, i)`), so both policies see exactly the same batches and only the
//!   scheduling differs.
//! - **Outstanding limit `D`** (`--ring`). A batch is *outstanding* from the moment a worker
//!   starts it until the consumer takes it. At most `D` are outstanding: a worker may start batch
//!   `i` only when `i < taken + D`, `taken` being the number of batches the consumer has taken.
//!   This is PyTorch's `prefetch_factor × num_workers` (it sends a new index to a worker each
//!   time it hands a batch to the training loop). The default is `D = 2N`, PyTorch's default
//!   `prefetch_factor = 2`. (In fulcrum's ring the slot of the batch being computed on stays in
//!   use until the step ends, so a ring of `D + 1` slots corresponds to `D` here.)
//! - **Consumer.** Takes a batch, computes for `step(j)` (its `j`-th step, seeded by
//!   `(seed, 2, j)`), then takes the next. Any time it is not computing it is *stalled*.
//! - **Policy `inorder`** (PyTorch's `DataLoader`): batch `i` belongs to worker `i mod N`; a
//!   worker produces its batches `k, k + N, k + 2N, …` in order; the consumer takes batch
//!   `taken` and nothing else, waiting for it even when later batches are ready.
//! - **Policy `any`** (fulcrum's cooperating loaders): an idle worker (the lowest-numbered one
//!   first) starts the next batch nobody has started yet; the consumer takes whichever finished
//!   batch has waited longest (FIFO by finish time, ties by batch number).
//! - **Same-instant order.** At each event time: loads that end finish (in batch order), a step
//!   that ends ends, an idle consumer takes a batch if one is ready, then idle workers start
//!   batches the limit allows. So a batch that finishes at `t` can be taken at `t`, and a take
//!   at `t` lets a worker start at `t`. Every duration is at least 1 ns.
//! - **`--desync`**: worker `k` is unavailable before `⌊k·L̄/N⌋` (`L̄` the mean load time in ns)
//!   instead of all starting at 0: the staggered start a pipeline reaches once its loaders have
//!   drifted apart. Without it every worker starts at 0, the synchronised start of a fresh
//!   `DataLoader` (whose first `N` batches then all arrive together).
//! - **`D < N`**: allowed. No more than `D` batches are ever outstanding, so at most `D` workers
//!   are busy at once: the pipeline runs as if it had `min(N, D)` loaders (exactly so for
//!   constant times without `--desync`). PyTorch itself never has `D < N`
//!   (`prefetch_factor ≥ 1`).
//!
//! # What is counted
//!
//! Over the window `[0, T]`: **batches consumed** are steps that have *completed* by `T`;
//! **stall** is the time the consumer is not computing, counted from 0 (so the warm-up wait
//! for the first batch is included) and, separately, counted from the first take ("after the
//! first batch"); the **queue occupancy** is the number of finished batches not yet taken (its
//! time-weighted mean over `[0, T]`, its maximum, and its steps for drawing); **loader
//! utilisation** is the fraction of `[0, T]` each worker spends loading. Throughput is given
//! over `T` and "after warm-up", `batches / (T − first take)`, which is what the balance
//! equation `min(N/L, 1/S)` predicts in the long run.
//!
//! # The closed form for constant times
//!
//! With constant load `L` and step `S` (integer ns), let `c_i` be when batch `i` is taken and
//! `r_i` when it is ready. The schedule is the same for both policies (free workers come back
//! in the order they were started, which is batch order) and obeys the exact recursion
//!
//! ```text
//! s_i = max(f_i, c_{i−D})          start of batch i  (no c term when i < D)
//! f_i = o_i (i < N),  r_{i−N} (i ≥ N)   the worker is free; o_k = 0, or ⌊k·L/N⌋ with --desync
//! r_i = s_i + L
//! c_i = max(r_i, c_{i−1} + S)        (c_0 = r_0 = L)
//! ```
//!
//! ([`constant_forecast`] evaluates it when no closed form applies). It solves in closed form
//! ([`closed_form`]), with `Nₑ = min(N, D)`:
//!
//! - **Compute-bound**, `Nₑ·S ≥ L` (any `D`, with or without desync): `c_i = L + i·S`. The
//!   consumer waits `L` once and never again, so by `T ≥ L` it has completed `⌊(T − L)/S⌋`
//!   batches and stalled `min(T, L)`, none of it after the first batch.
//! - **Input-bound**, `Nₑ·S < L`, in rounds of `N` batches: `c_{gN+k} = (g+1)·L + o_k` with
//!   `o_k = k·S` when all workers start together (they deliver `N` batches at once every `L`,
//!   consumed back to back; needs `D ≥ 2N − 1`, else the limit itself staggers the workers) and
//!   `o_k = ⌊k·L/N⌋` with `--desync` (each batch is taken the moment it is ready; needs
//!   `D ≥ N`). Worker `k` then completes `n_k = ⌊(T − o_k − S)/L⌋` batches by `T` (0 when
//!   negative), the consumer is busy `Σ_k n_k·S + clamp(T − o_k − (n_k + 1)·L, 0, S)` (the
//!   second term is the step in progress at `T`) and stalls for the rest.
//!
//! Buffers do not change the average: with constant times and a limit as above, the
//! throughput after warm-up tends to the balance equation's `min(N/L, 1/S)`. Variance is what
//! costs throughput even when `N/L = 1/S`, and what `D` and the `any` policy absorb.
//!
//! # Distributions
//!
//! `const`; `normal` (mean, cv) truncated at 1 % of the mean: a draw below that is redrawn (up to
//! 64 times, then the minimum is used), which raises the mean slightly for large cv (by under
//! 0.1 % at cv 0.5); `lognormal` with the given mean and cv (`σ² = ln(1 + cv²)`,
//! `μ = ln(mean) − σ²/2`); `exp` (mean; its cv is 1); `trace:FILE`, a text file of durations in
//! ms, one per line (blank lines and `#` comments skipped), batch (or step) `i` taking the
//! `(i mod len)`-th, i.e. sampled in order and cycling. Draws are rounded to whole ns, at least 1.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Serialize;

use super::timeline::{ConsumerSpan, ConsumerState, LoaderRow, QueueSeries, Span, Timeline};
use crate::base::{derive_seed, SplitMix64};

/// The `derive_seed` stream of load times: batch `i`'s load time is drawn from
/// `derive_seed(&[seed, LOAD_STREAM, i])`.
pub const LOAD_STREAM: u64 = 1;
/// The stream of step times (step `j` from `derive_seed(&[seed, STEP_STREAM, j])`).
pub const STEP_STREAM: u64 = 2;
/// `normal` draws below this fraction of the mean are redrawn.
pub const NORMAL_MIN_FRACTION: f64 = 0.01;
/// The most batches a simulation may be expected to produce (about a minute of CPU time).
pub const MAX_BATCHES: f64 = 50e6;
/// The most loader workers.
pub const MAX_LOADERS: usize = 1024;
/// The default drawn window holds about this many batches at the predicted rate.
pub const DRAW_BATCHES: f64 = 40.0;

const NS_PER_MS: f64 = 1e6;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{0}")]
    Config(String),
    #[error("reading trace {}: {source}; give a text file of durations in ms, one per line", path.display())]
    TraceRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("trace {} line {line}: {text:?} is not a duration in ms (one positive number per line; blank lines and lines starting with # are skipped)", path.display())]
    TraceLine {
        path: PathBuf,
        line: usize,
        text: String,
    },
    #[error("trace {}: no durations in it (expected one number of ms per line)", path.display())]
    TraceEmpty { path: PathBuf },
}

pub type Result<T, E = SimError> = std::result::Result<T, E>;

/// How the consumer picks its next batch (and who loads it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// PyTorch's `DataLoader`: batch `i` from worker `i mod N`, taken strictly in order.
    Inorder,
    /// fulcrum: work sharing, the consumer takes whichever batch is ready.
    Any,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Inorder => "inorder",
            Policy::Any => "any",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Policy::Inorder => {
                "PyTorch DataLoader: batch i from loader i mod N, taken strictly in order"
            }
            Policy::Any => {
                "fulcrum: loaders share the work, the consumer takes whichever batch is ready"
            }
        }
    }
}

/// The family of a time distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DistKind {
    Const,
    Normal,
    Lognormal,
    Exp,
    Trace,
}

/// A distribution as named on the command line: `const`, `normal`, `lognormal`, `exp` or
/// `trace:FILE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DistSpec {
    Const,
    Normal,
    Lognormal,
    Exp,
    Trace(PathBuf),
}

/// Why a distribution's name does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadDistribution {
    #[error(transparent)]
    Unknown(#[from] crate::base::UnknownChoice),
    #[error("trace: needs a file name, as in trace:times.txt")]
    NoTraceFile,
}

impl FromStr for DistSpec {
    type Err = BadDistribution;

    fn from_str(s: &str) -> std::result::Result<Self, BadDistribution> {
        Ok(match s {
            "const" | "constant" => DistSpec::Const,
            "normal" => DistSpec::Normal,
            "lognormal" => DistSpec::Lognormal,
            "exp" | "exponential" => DistSpec::Exp,
            _ => match s.strip_prefix("trace:") {
                Some("") => return Err(BadDistribution::NoTraceFile),
                Some(path) => DistSpec::Trace(PathBuf::from(path)),
                None => {
                    return Err(crate::base::UnknownChoice::new(
                        "distribution",
                        s,
                        "const, normal, lognormal, exp or trace:FILE",
                    )
                    .into())
                }
            },
        })
    }
}

/// Which time a distribution gives: it only changes the option names in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Load,
    Step,
}

impl Role {
    fn options(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Role::Load => ("--load-ms", "--cv", "--dist"),
            Role::Step => ("--step-ms", "--step-cv", "--step-dist"),
        }
    }
}

/// A time distribution with its parameters (and, for a trace, its durations).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Distribution {
    pub kind: DistKind,
    /// The nominal mean (a trace's own mean).
    pub mean_ms: f64,
    /// Coefficient of variation (std / mean) asked for: 0 for const, 1 for exp; for a trace its
    /// own.
    pub cv: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<PathBuf>,
    #[serde(skip)]
    trace_ns: Vec<u64>,
}

fn ms_to_ns(ms: f64) -> u64 {
    (ms * NS_PER_MS).round().clamp(1.0, 1e15) as u64
}

/// Uniform in `(0, 1]` with 53 bits.
fn unit_open0(rng: &mut SplitMix64) -> f64 {
    1.0 - (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A standard normal draw (Box–Muller).
fn std_normal(rng: &mut SplitMix64) -> f64 {
    let u1 = unit_open0(rng);
    let u2 = unit_open0(rng);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

impl Distribution {
    /// Every draw is `mean_ms`.
    pub fn constant(mean_ms: f64) -> Self {
        Distribution {
            kind: DistKind::Const,
            mean_ms,
            cv: 0.0,
            trace: None,
            trace_ns: Vec::new(),
        }
    }

    /// The distribution `spec` (default: lognormal when `cv > 0`, else constant) with mean
    /// `mean_ms` and coefficient of variation `cv`, checking that the three fit together; a trace
    /// file is read here. `role` names the options in errors.
    pub fn new(
        spec: Option<&DistSpec>,
        mean_ms: Option<f64>,
        cv: Option<f64>,
        role: Role,
    ) -> Result<Self> {
        let (mean_opt, cv_opt, dist_opt) = role.options();
        if let Some(cv) = cv {
            if !(cv.is_finite() && cv >= 0.0) {
                return Err(SimError::Config(format!(
                    "{cv_opt} {cv}: the coefficient of variation must be a number ≥ 0"
                )));
            }
        }
        let spec = match spec {
            Some(s) => s.clone(),
            None if cv.unwrap_or(0.0) > 0.0 => DistSpec::Lognormal,
            None => DistSpec::Const,
        };
        if let DistSpec::Trace(path) = &spec {
            if mean_ms.is_some() {
                return Err(SimError::Config(format!(
                    "{mean_opt} and {dist_opt} trace:FILE both set the time: leave out {mean_opt} (the trace gives the mean)"
                )));
            }
            if cv.is_some() {
                return Err(SimError::Config(format!(
                    "{cv_opt} does not apply to {dist_opt} trace:FILE (the trace has its own spread)"
                )));
            }
            let text = std::fs::read_to_string(path).map_err(|source| SimError::TraceRead {
                path: path.clone(),
                source,
            })?;
            return Self::from_trace_text(&text, path);
        }
        let Some(mean) = mean_ms else {
            return Err(SimError::Config(format!(
                "{mean_opt} MEAN is required (the mean time in ms), unless {dist_opt} trace:FILE"
            )));
        };
        if !(mean.is_finite() && mean > 0.0) {
            return Err(SimError::Config(format!(
                "{mean_opt} {mean}: must be a positive number of ms"
            )));
        }
        let (kind, cv) = match spec {
            DistSpec::Const => match cv {
                Some(cv) if cv > 0.0 => {
                    return Err(SimError::Config(format!(
                        "{cv_opt} {cv} with {dist_opt} const: use {dist_opt} normal or lognormal (or leave {dist_opt} out: a cv alone means lognormal)"
                    )))
                }
                _ => (DistKind::Const, 0.0),
            },
            DistSpec::Normal | DistSpec::Lognormal => {
                let Some(cv) = cv else {
                    return Err(SimError::Config(format!(
                        "{dist_opt} {} needs {cv_opt} X (the coefficient of variation, std/mean)",
                        if spec == DistSpec::Normal {
                            "normal"
                        } else {
                            "lognormal"
                        }
                    )));
                };
                let kind = if spec == DistSpec::Normal {
                    DistKind::Normal
                } else {
                    DistKind::Lognormal
                };
                (kind, cv)
            }
            DistSpec::Exp => match cv {
                Some(cv) if cv != 1.0 => {
                    return Err(SimError::Config(format!(
                        "{cv_opt} {cv} with {dist_opt} exp: the exponential distribution's cv is always 1; leave {cv_opt} out"
                    )))
                }
                _ => (DistKind::Exp, 1.0),
            },
            DistSpec::Trace(_) => unreachable!("handled above"),
        };
        Ok(Distribution {
            kind,
            mean_ms: mean,
            cv,
            trace: None,
            trace_ns: Vec::new(),
        })
    }

    /// A trace from the text of a file of durations (ms, one per line); `path` names it in
    /// errors.
    pub fn from_trace_text(text: &str, path: &Path) -> Result<Self> {
        let mut ms = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            match t.parse::<f64>() {
                Ok(v) if v.is_finite() && v > 0.0 => ms.push(v),
                _ => {
                    return Err(SimError::TraceLine {
                        path: path.to_owned(),
                        line: n + 1,
                        text: t.to_owned(),
                    })
                }
            }
        }
        if ms.is_empty() {
            return Err(SimError::TraceEmpty {
                path: path.to_owned(),
            });
        }
        let mean = ms.iter().sum::<f64>() / ms.len() as f64;
        let var = ms.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / ms.len() as f64;
        Ok(Distribution {
            kind: DistKind::Trace,
            mean_ms: mean,
            cv: var.sqrt() / mean,
            trace: Some(path.to_owned()),
            trace_ns: ms.into_iter().map(ms_to_ns).collect(),
        })
    }

    /// The durations of a trace, in ns (empty for other kinds).
    pub fn trace_ns(&self) -> &[u64] {
        &self.trace_ns
    }

    /// The mean in whole ns (at least 1): the constant time of the same mean.
    pub fn mean_ns(&self) -> u64 {
        match self.kind {
            DistKind::Trace => {
                let sum: u128 = self.trace_ns.iter().map(|&v| v as u128).sum();
                ((sum + self.trace_ns.len() as u128 / 2) / self.trace_ns.len() as u128) as u64
            }
            _ => ms_to_ns(self.mean_ms),
        }
    }

    /// Draw `i` of stream `stream` under `seed`, in ns: a pure function of its arguments.
    pub fn sample_ns(&self, seed: u64, stream: u64, i: u64) -> u64 {
        let mut rng = SplitMix64::new(derive_seed(&[seed, stream, i]));
        let m = self.mean_ms;
        let ms = match self.kind {
            DistKind::Const => return ms_to_ns(m),
            DistKind::Trace => return self.trace_ns[(i % self.trace_ns.len() as u64) as usize],
            DistKind::Normal => {
                let min = m * NORMAL_MIN_FRACTION;
                (0..64)
                    .map(|_| m * (1.0 + self.cv * std_normal(&mut rng)))
                    .find(|&x| x >= min)
                    .unwrap_or(min)
            }
            DistKind::Lognormal => {
                let s2 = (1.0 + self.cv * self.cv).ln();
                (m.ln() - s2 / 2.0 + s2.sqrt() * std_normal(&mut rng)).exp()
            }
            DistKind::Exp => -m * unit_open0(&mut rng).ln(),
        };
        ms_to_ns(ms)
    }

    /// "lognormal, mean 4 ms, cv 0.5" and the like.
    pub fn describe(&self) -> String {
        let mean = fmt_ms(self.mean_ms);
        match self.kind {
            DistKind::Const => format!("{mean} ms (const)"),
            DistKind::Normal | DistKind::Lognormal => format!(
                "{mean} ms ({}, cv {})",
                if self.kind == DistKind::Normal {
                    "normal"
                } else {
                    "lognormal"
                },
                trim(self.cv, 3)
            ),
            DistKind::Exp => format!("{mean} ms (exp)"),
            DistKind::Trace => format!(
                "{mean} ms (trace {}: {} durations, cv {})",
                self.trace.as_deref().unwrap_or(Path::new("?")).display(),
                self.trace_ns.len(),
                trim(self.cv, 2)
            ),
        }
    }
}

/// A number with at most `decimals` decimals, trailing zeros trimmed.
fn trim(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

fn fmt_ms(ms: f64) -> String {
    trim(ms, 3)
}

/// One simulation's parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimConfig {
    /// Loader workers (`N`).
    pub loaders: usize,
    /// The outstanding limit (`D`).
    pub ring: usize,
    pub load: Distribution,
    pub step: Distribution,
    /// The simulated window `T`.
    pub seconds: f64,
    pub desync: bool,
    pub seed: u64,
    /// The drawn window (from 0); `None`: [`SimConfig::default_draw_seconds`].
    pub draw_seconds: Option<f64>,
}

impl SimConfig {
    /// `loaders` workers, limit `2 · loaders`, synchronised start, seed 0.
    pub fn new(loaders: usize, load: Distribution, step: Distribution, seconds: f64) -> Self {
        SimConfig {
            loaders,
            ring: 2 * loaders,
            load,
            step,
            seconds,
            desync: false,
            seed: 0,
            draw_seconds: None,
        }
    }

    /// `T` in ns.
    pub fn t_ns(&self) -> u64 {
        (self.seconds * 1e9).round() as u64
    }

    /// The balance equation's batches per second: `min(N / L̄, 1 / S̄)`.
    pub fn equation_batches_per_s(&self) -> f64 {
        let load = self.load.mean_ns() as f64 / 1e9;
        let step = self.step.mean_ns() as f64 / 1e9;
        (self.loaders as f64 / load).min(1.0 / step)
    }

    /// About `DRAW_BATCHES` batches at the predicted rate, at most `T`.
    pub fn default_draw_seconds(&self) -> f64 {
        (DRAW_BATCHES / self.equation_batches_per_s()).min(self.seconds)
    }

    pub fn draw_seconds(&self) -> f64 {
        self.draw_seconds
            .unwrap_or_else(|| self.default_draw_seconds())
            .min(self.seconds)
    }

    fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(SimError::Config(s));
        if self.loaders == 0 || self.loaders > MAX_LOADERS {
            return bad(format!(
                "--loaders {}: need 1 to {MAX_LOADERS} loaders",
                self.loaders
            ));
        }
        if self.ring == 0 {
            return bad("--ring 0: at least one batch must be allowed outstanding".into());
        }
        if !(self.seconds.is_finite() && self.seconds > 0.0 && self.seconds <= 1e6) {
            return bad(format!(
                "--seconds {}: must be positive (and at most 1e6)",
                self.seconds
            ));
        }
        if let Some(d) = self.draw_seconds {
            if !(d.is_finite() && d > 0.0) {
                return bad(format!("--draw-seconds {d}: must be positive"));
            }
        }
        for d in [&self.load, &self.step] {
            if d.kind == DistKind::Trace && d.trace_ns.is_empty() {
                return bad("a trace distribution without durations".into());
            }
        }
        let expected = self.seconds * self.equation_batches_per_s();
        if expected > MAX_BATCHES {
            return bad(format!(
                "{:.0} s at {:.0} batches/s is about {expected:.2e} batches, more than the simulator's limit of {MAX_BATCHES:.0e}: lower --seconds",
                self.seconds,
                self.equation_batches_per_s()
            ));
        }
        Ok(())
    }

    /// "4 loaders, ring 8, load 4 ms (const), step 1 ms (const)".
    pub fn describe(&self) -> String {
        format!(
            "{} loader{}{}, ring {}, load {}, step {}",
            self.loaders,
            if self.loaders == 1 { "" } else { "s" },
            if self.desync { " (desync)" } else { "" },
            self.ring,
            self.load.describe(),
            self.step.describe()
        )
    }
}

/// Which side limits a constant-time pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Regime {
    /// `min(N, D)·S ≥ L`: the loaders keep up; the consumer only waits for the first batch.
    ComputeBound,
    /// `min(N, D)·S < L`: the consumer waits for loaders.
    InputBound,
}

/// How a [`ConstantForecast`] was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    ClosedForm,
    Recursion,
}

/// What a pipeline with constant times does in `[0, T]` (all times in ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConstantForecast {
    pub method: Method,
    pub regime: Regime,
    /// Steps completed by `T`.
    pub batches: u64,
    /// Consumer time computing in `[0, T]`.
    pub busy_ns: u64,
    /// Consumer time stalled in `[0, T]` (`T − busy`).
    pub stall_ns: u64,
    /// When the first batch is taken (`L`), if by `T`.
    pub first_take_ns: Option<u64>,
    pub t_ns: u64,
}

impl ConstantForecast {
    pub fn stall_fraction(&self) -> f64 {
        self.stall_ns as f64 / self.t_ns as f64
    }

    /// Stall after the first take, as a fraction of `T − first take` (`None` if that is 0).
    pub fn stall_fraction_after_first(&self) -> Option<f64> {
        let first = self.first_take_ns?;
        let span = self.t_ns - first;
        (span > 0).then(|| (self.stall_ns - first) as f64 / span as f64)
    }
}

fn regime(n: u64, d: u64, load: u64, step: u64) -> Regime {
    if n.min(d) as u128 * step as u128 >= load as u128 {
        Regime::ComputeBound
    } else {
        Regime::InputBound
    }
}

/// The closed form (module docs) for `n` loaders, limit `d`, constant load and step times over
/// `[0, t]` (all ns), or `None` where it does not apply (input-bound with `d < 2n − 1`
/// synchronised or `d < n` with desync: use [`constant_forecast`]).
pub fn closed_form(
    n: u64,
    d: u64,
    load: u64,
    step: u64,
    t: u64,
    desync: bool,
) -> Option<ConstantForecast> {
    assert!(n >= 1 && d >= 1 && load >= 1 && step >= 1);
    let first_take_ns = (t > load).then_some(load);
    let regime = regime(n, d, load, step);
    let (batches, busy) = match regime {
        Regime::ComputeBound => (
            t.saturating_sub(load) / step,
            t.saturating_sub(load), // every step back to back from L
        ),
        Regime::InputBound => {
            if (desync && d < n) || (!desync && d < 2 * n - 1) {
                return None;
            }
            let (mut batches, mut busy) = (0u64, 0u64);
            for k in 0..n {
                let o = if desync {
                    (k as u128 * load as u128 / n as u128) as u64
                } else {
                    k * step
                };
                let nk = t.saturating_sub(o + step) / load;
                let partial = t.saturating_sub(o + (nk + 1) * load).min(step);
                batches += nk;
                busy += nk * step + partial;
            }
            (batches, busy)
        }
    };
    Some(ConstantForecast {
        method: Method::ClosedForm,
        regime,
        batches,
        busy_ns: busy,
        stall_ns: t - busy,
        first_take_ns,
        t_ns: t,
    })
}

/// Calls `take(i, c_i)` for every batch taken before `t` under the constant-time recursion
/// (module docs), in order. Memory `O(n + d)`.
pub fn constant_schedule(
    n: u64,
    d: u64,
    load: u64,
    step: u64,
    t: u64,
    desync: bool,
    mut take: impl FnMut(u64, u64),
) {
    assert!(n >= 1 && d >= 1 && load >= 1 && step >= 1);
    // The last n ready times and the last d take times.
    let mut ready: VecDeque<u64> = VecDeque::with_capacity(n as usize + 1);
    let mut taken: VecDeque<u64> = VecDeque::with_capacity(d as usize + 1);
    let mut prev_take: Option<u64> = None;
    for i in 0u64.. {
        let free = if i < n {
            if desync {
                (i as u128 * load as u128 / n as u128) as u64
            } else {
                0
            }
        } else {
            ready.pop_front().expect("n ready times kept")
        };
        let allowed = if i >= d {
            taken.pop_front().expect("d take times kept")
        } else {
            0
        };
        let r = free.max(allowed) + load;
        let c = prev_take.map_or(r, |p| r.max(p + step));
        if c >= t {
            break;
        }
        take(i, c);
        ready.push_back(r);
        taken.push_back(c);
        prev_take = Some(c);
    }
}

/// The constant-time forecast: the closed form where it applies, else the recursion.
pub fn constant_forecast(
    n: u64,
    d: u64,
    load: u64,
    step: u64,
    t: u64,
    desync: bool,
) -> ConstantForecast {
    if let Some(f) = closed_form(n, d, load, step, t, desync) {
        return f;
    }
    let (mut batches, mut busy, mut first) = (0u64, 0u64, None);
    constant_schedule(n, d, load, step, t, desync, |_, c| {
        first.get_or_insert(c);
        busy += step.min(t - c);
        if c + step <= t {
            batches += 1;
        }
    });
    ConstantForecast {
        method: Method::Recursion,
        regime: regime(n, d, load, step),
        batches,
        busy_ns: busy,
        stall_ns: t - busy,
        first_take_ns: first,
        t_ns: t,
    }
}

/// One policy's figures over `[0, T]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    pub policy: Policy,
    pub seconds: f64,
    /// Steps completed by `T`.
    pub batches: u64,
    /// `batches / T`.
    pub batches_per_s: f64,
    /// When the first batch was taken (`None`: never, within `T`).
    pub first_batch_ms: Option<f64>,
    /// `batches / (T − first take)`: throughput after warm-up.
    pub batches_per_s_after_first: Option<f64>,
    /// Consumer stall over `[0, T]`, warm-up included.
    pub stall_fraction: f64,
    /// Consumer stall over `[first take, T]`.
    pub stall_fraction_after_first: Option<f64>,
    /// Time-weighted mean of finished-not-taken batches.
    pub queue_mean: f64,
    pub queue_max: u32,
    /// Mean over the loaders of the fraction of `T` spent loading.
    pub loader_utilisation: f64,
    pub loader_utilisation_each: Vec<f64>,
    /// The balance equation `min(N/L̄, 1/S̄)`.
    pub equation_batches_per_s: f64,
    /// `1 − batches_per_s_after_first / equation_batches_per_s`.
    pub lost_vs_equation: Option<f64>,
    /// The same pipeline with constant times of the same means.
    pub constant: ConstantForecast,
    /// `1 − batches / constant.batches`.
    pub lost_vs_constant: Option<f64>,
}

/// A simulation's figures and its drawing.
#[derive(Debug, Clone)]
pub struct Simulation {
    pub report: SimReport,
    pub timeline: Timeline,
}

#[derive(Debug, Clone, Copy)]
struct Job {
    batch: u64,
    start: u64,
    end: u64,
}

#[derive(Debug)]
struct Worker {
    /// Unavailable before this (desync).
    avail: u64,
    job: Option<Job>,
    /// `inorder`: the next batch of this worker.
    next_own: u64,
    busy: u64,
}

/// What one event-driven run produced; the spans are those starting before the drawn window's
/// end (times in ns).
#[derive(Debug, Default)]
struct Run {
    batches: u64,
    stall: u64,
    stall_after_first: u64,
    first_take: Option<u64>,
    queue_area: u128,
    queue_max: u32,
    loader_busy: Vec<u64>,
    /// Per worker: (batch, start, end).
    loads: Vec<Vec<(u64, u64, u64)>>,
    /// (batch, worker, start, end).
    steps: Vec<(u64, usize, u64, u64)>,
    stalls: Vec<(u64, u64)>,
    /// Occupancy from this time on.
    queue: Vec<(u64, u32)>,
}

fn run_events(cfg: &SimConfig, policy: Policy, draw_end: u64) -> Run {
    let n = cfg.loaders;
    let d = cfg.ring as u64;
    let t_end = cfg.t_ns();
    let load_mean = cfg.load.mean_ns() as u128;
    let mut workers: Vec<Worker> = (0..n)
        .map(|k| Worker {
            avail: if cfg.desync {
                (k as u128 * load_mean / n as u128) as u64
            } else {
                0
            },
            job: None,
            next_own: k as u64,
            busy: 0,
        })
        .collect();
    let mut run = Run {
        loads: vec![Vec::new(); n],
        queue: vec![(0, 0)],
        ..Run::default()
    };
    let mut next_unassigned = 0u64;
    let mut taken = 0u64;
    // The step in progress: (start, end).
    let mut step: Option<(u64, u64)> = None;
    let mut idle_since = 0u64;
    // Finished, not taken: by batch (inorder) or by finish time (any); batch → worker.
    let mut ready_by_batch: BTreeMap<u64, usize> = BTreeMap::new();
    let mut ready_fifo: VecDeque<(u64, usize)> = VecDeque::new();
    let mut finished: Vec<(u64, usize)> = Vec::with_capacity(n);
    let (mut q, mut q_since) = (0u32, 0u64);
    let mut t = 0u64;
    loop {
        // 1. Loads ending now, in batch order.
        finished.clear();
        for (k, w) in workers.iter_mut().enumerate() {
            if let Some(job) = w.job.filter(|j| j.end == t) {
                finished.push((job.batch, k));
                w.busy += job.end - job.start;
                w.job = None;
            }
        }
        finished.sort_unstable();
        for &(b, k) in &finished {
            match policy {
                Policy::Inorder => {
                    ready_by_batch.insert(b, k);
                }
                Policy::Any => ready_fifo.push_back((b, k)),
            }
        }
        // 2. The step ending now.
        if step.is_some_and(|(_, end)| end == t) {
            run.batches += 1;
            step = None;
            idle_since = t;
        }
        // 3. An idle consumer takes a batch.
        if step.is_none() {
            let next = match policy {
                Policy::Inorder => ready_by_batch.remove(&taken).map(|k| (taken, k)),
                Policy::Any => ready_fifo.pop_front(),
            };
            if let Some((b, k)) = next {
                let wait = t - idle_since;
                run.stall += wait;
                if run.first_take.is_some() {
                    run.stall_after_first += wait;
                } else {
                    run.first_take = Some(t);
                }
                if wait > 0 && idle_since < draw_end {
                    run.stalls.push((idle_since, t));
                }
                let s = cfg.step.sample_ns(cfg.seed, STEP_STREAM, taken);
                step = Some((t, t + s));
                if t < draw_end {
                    run.steps.push((b, k, t, t + s));
                }
                taken += 1;
            }
        }
        // 4. Idle workers start what the limit allows.
        for (k, w) in workers.iter_mut().enumerate() {
            if w.job.is_some() || w.avail > t {
                continue;
            }
            let b = match policy {
                Policy::Inorder => w.next_own,
                Policy::Any => next_unassigned,
            };
            if b >= taken + d {
                match policy {
                    Policy::Inorder => continue,
                    Policy::Any => break,
                }
            }
            let dur = cfg.load.sample_ns(cfg.seed, LOAD_STREAM, b);
            w.job = Some(Job {
                batch: b,
                start: t,
                end: t + dur,
            });
            match policy {
                Policy::Inorder => w.next_own += n as u64,
                Policy::Any => next_unassigned += 1,
            }
            if t < draw_end {
                run.loads[k].push((b, t, t + dur));
            }
        }
        // The queue after this instant.
        let q_now = (ready_by_batch.len() + ready_fifo.len()) as u32;
        if q_now != q {
            run.queue_area += q as u128 * (t - q_since) as u128;
            q = q_now;
            q_since = t;
            run.queue_max = run.queue_max.max(q);
            if t <= draw_end {
                run.queue.push((t, q));
            }
        }
        // The next event.
        let mut next = step.map_or(u64::MAX, |(_, end)| end);
        for w in &workers {
            match w.job {
                Some(j) => next = next.min(j.end),
                None if w.avail > t => next = next.min(w.avail),
                None => {}
            }
        }
        if next > t_end {
            break;
        }
        t = next;
    }
    // Close the books at T.
    run.queue_area += q as u128 * (t_end - q_since) as u128;
    if step.is_none() {
        let wait = t_end - idle_since;
        run.stall += wait;
        if run.first_take.is_some() {
            run.stall_after_first += wait;
        }
        if wait > 0 && idle_since < draw_end {
            run.stalls.push((idle_since, t_end));
        }
    }
    run.loader_busy = workers
        .iter()
        .map(|w| w.busy + w.job.map_or(0, |j| t_end - j.start))
        .collect();
    run
}

/// Simulates `cfg` under `policy`: the report over `[0, T]` and the timeline of the drawn window.
pub fn simulate(cfg: &SimConfig, policy: Policy) -> Result<Simulation> {
    cfg.validate()?;
    let t = cfg.t_ns();
    let draw = cfg.draw_seconds();
    let draw_end = ((draw * 1e9).round() as u64).min(t);
    let run = run_events(cfg, policy, draw_end);
    let secs = t as f64 / 1e9;
    let equation = cfg.equation_batches_per_s();
    let after = run
        .first_take
        .filter(|&f| f < t)
        .map(|f| run.batches as f64 / ((t - f) as f64 / 1e9));
    let constant = constant_forecast(
        cfg.loaders as u64,
        cfg.ring as u64,
        cfg.load.mean_ns(),
        cfg.step.mean_ns(),
        t,
        cfg.desync,
    );
    let each: Vec<f64> = run
        .loader_busy
        .iter()
        .map(|&b| b as f64 / t as f64)
        .collect();
    let report = SimReport {
        policy,
        seconds: secs,
        batches: run.batches,
        batches_per_s: run.batches as f64 / secs,
        first_batch_ms: run.first_take.map(|f| f as f64 / NS_PER_MS),
        batches_per_s_after_first: after,
        stall_fraction: run.stall as f64 / t as f64,
        stall_fraction_after_first: run
            .first_take
            .filter(|&f| f < t)
            .map(|f| run.stall_after_first as f64 / (t - f) as f64),
        queue_mean: run.queue_area as f64 / t as f64,
        queue_max: run.queue_max,
        loader_utilisation: each.iter().sum::<f64>() / each.len() as f64,
        loader_utilisation_each: each,
        equation_batches_per_s: equation,
        lost_vs_equation: after.map(|a| 1.0 - a / equation),
        lost_vs_constant: (constant.batches > 0)
            .then(|| 1.0 - run.batches as f64 / constant.batches as f64),
        constant,
    };
    let timeline = timeline_of(cfg, policy, &report, &run, draw_end);
    Ok(Simulation { report, timeline })
}

fn timeline_of(
    cfg: &SimConfig,
    policy: Policy,
    report: &SimReport,
    run: &Run,
    draw_end: u64,
) -> Timeline {
    let s = |ns: u64| ns as f64 / 1e9;
    let end = s(draw_end);
    Timeline {
        title: format!("{} — {}", policy.name(), policy.description()),
        notes: vec![
            format!(
                "{}, {} s simulated, seed {}",
                cfg.describe(),
                trim(report.seconds, 3),
                cfg.seed
            ),
            format!(
                "{} batches ({:.1}/s; equation {:.1}/s), consumer stall {:.1} % ({:.1} % after the first batch), queue mean {:.2}, max {}",
                report.batches,
                report.batches_per_s,
                report.equation_batches_per_s,
                report.stall_fraction * 100.0,
                report.stall_fraction_after_first.unwrap_or(0.0) * 100.0,
                report.queue_mean,
                report.queue_max
            ),
        ],
        end,
        loaders: run
            .loads
            .iter()
            .enumerate()
            .map(|(k, spans)| LoaderRow {
                label: format!("loader {k}"),
                spans: spans
                    .iter()
                    .map(|&(batch, a, b)| Span {
                        start: s(a),
                        end: s(b),
                        batch,
                    })
                    .collect(),
            })
            .collect(),
        queue: QueueSeries {
            label: "ready queue".into(),
            capacity: Some(cfg.ring as u32),
            steps: run
                .queue
                .iter()
                .filter(|&&(t, _)| t <= draw_end)
                .map(|&(t, q)| (s(t), q))
                .collect(),
        },
        consumer: run
            .steps
            .iter()
            .map(|&(batch, k, a, b)| ConsumerSpan {
                start: s(a),
                end: s(b),
                state: ConsumerState::Busy {
                    batch,
                    loader: Some(k),
                },
            })
            .chain(run.stalls.iter().map(|&(a, b)| ConsumerSpan {
                start: s(a),
                end: s(b),
                state: ConsumerState::Stall,
            }))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn cfg(
        n: usize,
        d: usize,
        load_ms: f64,
        step_ms: f64,
        seconds: f64,
        desync: bool,
    ) -> SimConfig {
        SimConfig {
            ring: d,
            desync,
            ..SimConfig::new(
                n,
                Distribution::constant(load_ms),
                Distribution::constant(step_ms),
                seconds,
            )
        }
    }

    fn lognormal(mean: f64, cv: f64) -> Distribution {
        Distribution::new(Some(&DistSpec::Lognormal), Some(mean), Some(cv), Role::Load).unwrap()
    }

    /// Runs with the whole window recorded.
    fn run_all(c: &SimConfig, p: Policy) -> Run {
        run_events(c, p, c.t_ns())
    }

    fn stall_ns(r: &SimReport) -> u64 {
        (r.stall_fraction * r.seconds * 1e9).round() as u64
    }

    #[test]
    fn hand_derived_one_loader_input_bound() {
        // N=1, L=3, S=1, D=2, T=12 ms: batch g ready (and taken) at 3(g+1): takes at 3, 6, 9, 12;
        // steps [3,4], [6,7], [9,10] complete, the one at 12 does not count. Busy 3 ms of 12:
        // stall 9/12 (the first 3 ms are warm-up), then 2 of every 3 ms: 6/9 after the first.
        for p in [Policy::Inorder, Policy::Any] {
            let r = simulate(&cfg(1, 2, 3.0, 1.0, 0.012, false), p)
                .unwrap()
                .report;
            assert_eq!(r.batches, 3, "{p:?}");
            assert_eq!(stall_ns(&r), 9 * MS);
            assert_eq!(r.stall_fraction, 0.75);
            assert_eq!(r.stall_fraction_after_first, Some(6.0 / 9.0));
            assert_eq!(r.first_batch_ms, Some(3.0));
            assert_eq!(r.loader_utilisation, 1.0);
            // Each batch waits 0 ms in the queue: taken the instant it is ready.
            assert_eq!((r.queue_mean, r.queue_max), (0.0, 0));
            assert_eq!(r.constant.batches, 3);
            assert_eq!(r.constant.method, Method::ClosedForm);
        }
        // D = 1 is no worse here: the take at 3 frees the slot and batch 1 starts at 3.
        let r = simulate(&cfg(1, 1, 3.0, 1.0, 0.012, false), Policy::Inorder)
            .unwrap()
            .report;
        assert_eq!((r.batches, stall_ns(&r)), (3, 9 * MS));
    }

    #[test]
    fn hand_derived_two_loaders_sync_and_desync() {
        // N=2, L=4, S=1, D=4, T=10. Sync: batches 0,1 ready at 4, 2,3 at 8; takes 4,5,8,9;
        // four steps done by 10 (the last at exactly 10 counts); busy 4, stall 6/10, after the
        // first batch 2/6. The queue holds 1 batch during [4,5) and [8,9): mean 0.2, max 1.
        let sync = simulate(&cfg(2, 4, 4.0, 1.0, 0.010, false), Policy::Inorder)
            .unwrap()
            .report;
        assert_eq!(sync.batches, 4);
        assert_eq!(stall_ns(&sync), 6 * MS);
        assert_eq!(sync.stall_fraction_after_first, Some(2.0 / 6.0));
        assert_eq!((sync.queue_mean, sync.queue_max), (0.2, 1));
        // Desync: worker 1 starts at 2: ready (and taken) at 4, 6, 8, 10; the step taken at 10
        // ends at 11: three batches, busy 3, stall 7/10, after the first 3/6.
        let de = simulate(&cfg(2, 4, 4.0, 1.0, 0.010, true), Policy::Inorder)
            .unwrap()
            .report;
        assert_eq!(de.batches, 3);
        assert_eq!(stall_ns(&de), 7 * MS);
        assert_eq!(de.stall_fraction_after_first, Some(0.5));
        assert_eq!((de.queue_mean, de.queue_max), (0.0, 0));
        // Utilisation: worker 0 loads [0,4],[4,8],[8,10]; worker 1 [2,6],[6,10].
        assert_eq!(de.loader_utilisation_each, vec![1.0, 0.8]);
    }

    #[test]
    fn hand_derived_compute_bound() {
        // N=2, L=2, S=1.5, T=10: c_i = 2 + 1.5 i; steps end at 3.5, 5, …, 9.5: 5 batches;
        // stall is the 2 ms warm-up only.
        for desync in [false, true] {
            for p in [Policy::Inorder, Policy::Any] {
                let r = simulate(&cfg(2, 4, 2.0, 1.5, 0.010, desync), p)
                    .unwrap()
                    .report;
                assert_eq!(r.batches, 5);
                assert_eq!(stall_ns(&r), 2 * MS);
                assert_eq!(r.stall_fraction_after_first, Some(0.0));
                assert_eq!(r.constant.regime, Regime::ComputeBound);
            }
        }
        // Balanced: 4 loaders of 4 ms feed a 1 ms step exactly; 96 batches in 100 ms.
        let r = simulate(&cfg(4, 8, 4.0, 1.0, 0.1, false), Policy::Inorder)
            .unwrap()
            .report;
        assert_eq!(r.batches, 96);
        assert_eq!(r.stall_fraction, 0.04);
        assert_eq!(r.lost_vs_constant, Some(0.0));
        assert!(r.lost_vs_equation.unwrap().abs() < 1e-12);
    }

    /// The simulator's take times equal the recursion's, and its figures the closed form's where
    /// that applies, over a sweep of constant pipelines.
    #[test]
    fn constant_times_agree_exactly_with_recursion_and_closed_form() {
        let mut closed = [0u32; 2]; // compute-bound, input-bound cases checked in closed form
        for n in [1usize, 2, 3, 4, 7] {
            for d in [1usize, 2, 3, n, 2 * n - 1, 2 * n, 3 * n + 1] {
                for (load, step) in [
                    (4.0, 1.0),
                    (3.0, 1.0),
                    (10.0, 1.0),
                    (7.0, 1.3),
                    (2.0, 1.5),
                    (1.0, 2.0),
                    (8.4, 1.0),
                    (5.0, 0.7),
                ] {
                    for desync in [false, true] {
                        let c = cfg(n, d, load, step, 0.0617, desync);
                        let (l, s, t) = (c.load.mean_ns(), c.step.mean_ns(), c.t_ns());
                        let mut expect = Vec::new();
                        constant_schedule(n as u64, d as u64, l, s, t, desync, |i, at| {
                            expect.push((i, at))
                        });
                        let forecast = constant_forecast(n as u64, d as u64, l, s, t, desync);
                        for p in [Policy::Inorder, Policy::Any] {
                            let what =
                                format!("n={n} d={d} L={load} S={step} desync={desync} {p:?}");
                            let run = run_all(&c, p);
                            let got: Vec<(u64, u64)> =
                                run.steps.iter().map(|&(b, _, at, _)| (b, at)).collect();
                            assert_eq!(got, expect, "{what}");
                            let r = simulate(&c, p).unwrap().report;
                            assert_eq!(r.batches, forecast.batches, "{what}");
                            assert_eq!(run.stall, forecast.stall_ns, "{what}");
                            assert_eq!(run.first_take, forecast.first_take_ns, "{what}");
                            assert_eq!(r.lost_vs_constant.unwrap_or(0.0), 0.0, "{what}");
                            if let Some(f) = closed_form(n as u64, d as u64, l, s, t, desync) {
                                assert_eq!(f.batches, r.batches, "{what}: closed form");
                                assert_eq!(f.stall_ns, run.stall, "{what}: closed form");
                                closed[(f.regime == Regime::InputBound) as usize] += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(closed[0] > 100 && closed[1] > 100, "{closed:?}");
    }

    #[test]
    fn closed_form_formulas() {
        // Input-bound, synchronised: rounds of N at (g+1)L, consumed back to back.
        let f = closed_form(4, 8, 10 * MS, MS, 100 * MS, false).unwrap();
        // Rounds at 10, 20, …, 90 complete (9·4 = 36); the round at 100 does not.
        assert_eq!(f.batches, 36);
        assert_eq!(f.busy_ns, 36 * MS);
        assert_eq!(f.regime, Regime::InputBound);
        // Desync: worker k at (g+1)·10 + 2.5k ms: completes by 100 if ≤ 99.
        let f = closed_form(4, 4, 10 * MS, MS, 100 * MS, true).unwrap();
        // k=0: 10..90 (9); k=1: 12.5..92.5 (9); k=2: 15..95 (9); k=3: 17.5..97.5 (9).
        assert_eq!(f.batches, 36);
        // Partial step at T: T = 98.0 → k=3's step at 97.5 is half done.
        let f = closed_form(4, 4, 10 * MS, MS, 98 * MS, true).unwrap();
        assert_eq!((f.batches, f.busy_ns), (35, 35 * MS + MS / 2));
        // Not applicable: synchronised input-bound with D < 2N − 1.
        assert!(closed_form(4, 6, 10 * MS, MS, 100 * MS, false).is_none());
        assert!(closed_form(4, 3, 10 * MS, MS, 100 * MS, true).is_none());
        // Compute-bound: T shorter than the first load.
        let f = closed_form(2, 4, 5 * MS, 3 * MS, 4 * MS, false).unwrap();
        assert_eq!((f.batches, f.stall_ns, f.first_take_ns), (0, 4 * MS, None));
        assert_eq!(f.stall_fraction_after_first(), None);
    }

    #[test]
    fn fewer_slots_than_loaders_behaves_like_fewer_loaders() {
        // D < N: at most D loaders busy; constant, synchronised: exactly N = D loaders.
        for p in [Policy::Inorder, Policy::Any] {
            for (load, step) in [(4.0, 1.0), (1.0, 1.0), (9.0, 2.0)] {
                let few = simulate(&cfg(4, 2, load, step, 0.05, false), p)
                    .unwrap()
                    .report;
                let two = simulate(&cfg(2, 2, load, step, 0.05, false), p)
                    .unwrap()
                    .report;
                assert_eq!(few.batches, two.batches);
                assert_eq!(few.stall_fraction, two.stall_fraction);
                assert_eq!(few.queue_mean, two.queue_mean);
                // The busy time of two loaders is spread over four.
                let busy =
                    |r: &SimReport| r.loader_utilisation * r.loader_utilisation_each.len() as f64;
                assert!((busy(&few) - busy(&two)).abs() < 1e-9);
            }
        }
        // The limit at work: never more than D loaders busy at once.
        let mut c = cfg(6, 2, 5.0, 1.0, 0.2, false);
        c.load = lognormal(5.0, 0.8);
        for p in [Policy::Inorder, Policy::Any] {
            let run = run_all(&c, p);
            let mut edges: Vec<(u64, i32)> = run
                .loads
                .iter()
                .flatten()
                .flat_map(|&(_, a, b)| [(a, 1), (b, -1)])
                .collect();
            edges.sort_by_key(|&(t, delta)| (t, delta)); // ends before starts at one instant
            let (mut busy, mut most) = (0, 0);
            for (_, delta) in edges {
                busy += delta;
                most = most.max(busy);
            }
            assert_eq!(most, 2, "{p:?}");
        }
    }

    #[test]
    fn any_beats_inorder_under_variance() {
        // Balanced means (4 loaders × 4 ms = 4 × 1 ms), lognormal load times.
        let mut wins = 0;
        for seed in 0..6 {
            let mut c = cfg(4, 8, 4.0, 1.0, 2.0, false);
            c.seed = seed;
            c.load = lognormal(4.0, 1.0);
            let inorder = simulate(&c, Policy::Inorder).unwrap().report;
            let any = simulate(&c, Policy::Any).unwrap().report;
            assert!(
                any.batches >= inorder.batches,
                "seed {seed}: any {} < inorder {}",
                any.batches,
                inorder.batches
            );
            wins += (any.batches > inorder.batches) as u32;
            // Variance costs throughput even though the means balance.
            assert!(inorder.lost_vs_constant.unwrap() > 0.05, "{inorder:?}");
            assert!(any.stall_fraction < inorder.stall_fraction);
        }
        assert_eq!(wins, 6);
        // High cv: a large, clear gap.
        let mut c = cfg(4, 8, 4.0, 1.0, 5.0, false);
        c.load = lognormal(4.0, 2.0);
        let inorder = simulate(&c, Policy::Inorder).unwrap().report;
        let any = simulate(&c, Policy::Any).unwrap().report;
        assert!(
            any.batches as f64 > 1.1 * inorder.batches as f64,
            "any {} inorder {}",
            any.batches,
            inorder.batches
        );
    }

    #[test]
    fn deterministic_for_a_seed() {
        let mut c = cfg(3, 6, 3.0, 1.0, 0.5, true);
        c.load = lognormal(3.0, 0.7);
        c.step =
            Distribution::new(Some(&DistSpec::Normal), Some(1.0), Some(0.3), Role::Step).unwrap();
        for p in [Policy::Inorder, Policy::Any] {
            let a = simulate(&c, p).unwrap();
            let b = simulate(&c, p).unwrap();
            assert_eq!(a.report, b.report);
            assert_eq!(a.timeline, b.timeline);
            let mut other = c.clone();
            other.seed = 1;
            assert_ne!(simulate(&other, p).unwrap().report.batches_per_s, 0.0);
            assert_ne!(simulate(&other, p).unwrap().report, a.report);
        }
    }

    #[test]
    fn distributions_have_their_means_and_spread() {
        let stats = |d: &Distribution| {
            let xs: Vec<f64> = (0..200_000)
                .map(|i| d.sample_ns(7, LOAD_STREAM, i) as f64 / 1e6)
                .collect();
            let m = xs.iter().sum::<f64>() / xs.len() as f64;
            let v = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / xs.len() as f64;
            (m, v.sqrt() / m, xs.iter().cloned().fold(f64::MAX, f64::min))
        };
        let d = |s: DistSpec, cv: Option<f64>| {
            Distribution::new(Some(&s), Some(4.0), cv, Role::Load).unwrap()
        };
        let (m, cv, _) = stats(&d(DistSpec::Lognormal, Some(0.5)));
        assert!(
            (m - 4.0).abs() < 0.02 && (cv - 0.5).abs() < 0.01,
            "{m} {cv}"
        );
        let (m, cv, min) = stats(&d(DistSpec::Normal, Some(0.3)));
        assert!(
            (m - 4.0).abs() < 0.02 && (cv - 0.3).abs() < 0.01,
            "{m} {cv}"
        );
        assert!(min >= 0.04);
        // Truncation at 1 % of the mean: never below, and the mean rises a little.
        let (m, _, min) = stats(&d(DistSpec::Normal, Some(1.5)));
        assert!(min >= 0.04 && m > 4.0, "{m} {min}");
        let (m, cv, _) = stats(&d(DistSpec::Exp, None));
        assert!(
            (m - 4.0).abs() < 0.04 && (cv - 1.0).abs() < 0.02,
            "{m} {cv}"
        );
        let c = d(DistSpec::Const, None);
        assert!((0..100).all(|i| c.sample_ns(1, 2, i) == 4 * MS));
        // A cv alone means lognormal; without one, const.
        let l = Distribution::new(None, Some(4.0), Some(0.5), Role::Load).unwrap();
        assert_eq!(l.kind, DistKind::Lognormal);
        let k = Distribution::new(None, Some(4.0), None, Role::Load).unwrap();
        assert_eq!(k.kind, DistKind::Const);
    }

    #[test]
    fn options_that_do_not_fit_are_refused_by_name() {
        let err = |spec: Option<DistSpec>, mean: Option<f64>, cv: Option<f64>, role| {
            Distribution::new(spec.as_ref(), mean, cv, role)
                .unwrap_err()
                .to_string()
        };
        let e = err(Some(DistSpec::Const), Some(4.0), Some(0.5), Role::Load);
        assert!(e.contains("--cv 0.5") && e.contains("--dist const"), "{e}");
        let e = err(Some(DistSpec::Lognormal), Some(4.0), None, Role::Step);
        assert!(e.contains("--step-dist lognormal needs --step-cv"), "{e}");
        let e = err(Some(DistSpec::Exp), Some(4.0), Some(0.3), Role::Load);
        assert!(e.contains("cv is always 1"), "{e}");
        let e = err(None, None, None, Role::Load);
        assert!(e.contains("--load-ms MEAN is required"), "{e}");
        let e = err(None, Some(-1.0), None, Role::Step);
        assert!(e.contains("--step-ms -1"), "{e}");
        let e = err(
            Some(DistSpec::Trace("x.txt".into())),
            Some(4.0),
            None,
            Role::Load,
        );
        assert!(e.contains("leave out --load-ms"), "{e}");
        assert_eq!(
            "weird".parse::<DistSpec>().unwrap_err().to_string(),
            "unknown distribution \"weird\": use const, normal, lognormal, exp or trace:FILE"
        );
        assert_eq!(
            "trace:a/b.txt".parse::<DistSpec>(),
            Ok(DistSpec::Trace("a/b.txt".into()))
        );
        let mut c = cfg(0, 1, 1.0, 1.0, 1.0, false);
        let e = simulate(&c, Policy::Any).unwrap_err().to_string();
        assert!(e.contains("--loaders 0"), "{e}");
        c.loaders = 1;
        c.ring = 0;
        assert!(simulate(&c, Policy::Any)
            .unwrap_err()
            .to_string()
            .contains("--ring 0"));
        let c = cfg(1, 1, 1e-6, 1e-6, 1000.0, false);
        let e = simulate(&c, Policy::Any).unwrap_err().to_string();
        assert!(e.contains("lower --seconds"), "{e}");
    }

    #[test]
    fn trace_files_are_read_in_order_and_cycled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("times.txt");
        std::fs::write(&path, "# load times\n2\n\n 6.5 \n1.5\n").unwrap();
        let d = Distribution::new(Some(&DistSpec::Trace(path.clone())), None, None, Role::Load)
            .unwrap();
        assert_eq!(d.kind, DistKind::Trace);
        assert_eq!(d.trace_ns(), &[2 * MS, 6 * MS + MS / 2, 3 * MS / 2]);
        assert_eq!(d.mean_ms, 10.0 / 3.0);
        assert_eq!(d.mean_ns(), 3_333_333);
        let got: Vec<u64> = (0..5).map(|i| d.sample_ns(99, LOAD_STREAM, i)).collect();
        assert_eq!(got, [2 * MS, 6_500_000, 1_500_000, 2 * MS, 6_500_000]);
        // In the simulator: one loader, a 0.5 ms step: batches ready at 2, 8.5, 10, 12, …
        let mut c = cfg(1, 2, 1.0, 0.5, 0.011, false);
        c.load = d;
        let run = run_all(&c, Policy::Inorder);
        let takes: Vec<u64> = run.steps.iter().map(|s| s.2).collect();
        assert_eq!(takes, [2 * MS, 8_500_000, 10 * MS]);
        // A bad line is named with its number.
        std::fs::write(&path, "2\n3\nfast\n").unwrap();
        let e = Distribution::new(Some(&DistSpec::Trace(path.clone())), None, None, Role::Load)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("times.txt line 3") && e.contains("\"fast\""),
            "{e}"
        );
        std::fs::write(&path, "2\n-1\n").unwrap();
        let e = Distribution::new(Some(&DistSpec::Trace(path.clone())), None, None, Role::Load)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
        std::fs::write(&path, "# nothing\n\n").unwrap();
        let e = Distribution::new(Some(&DistSpec::Trace(path.clone())), None, None, Role::Load)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no durations"), "{e}");
        let missing = dir.path().join("missing.txt");
        let e = Distribution::new(Some(&DistSpec::Trace(missing)), None, None, Role::Load)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.txt"), "{e}");
    }

    #[test]
    fn timeline_holds_the_drawn_window() {
        let mut c = cfg(2, 4, 4.0, 1.0, 1.0, false);
        c.draw_seconds = Some(0.02);
        let sim = simulate(&c, Policy::Inorder).unwrap();
        let tl = &sim.timeline;
        assert_eq!(tl.end, 0.02);
        assert_eq!(tl.loaders.len(), 2);
        // Loader 0 starts batches 0, 2, 4, 6, 8 at 0, 4, 8, 12, 16 ms.
        let l0: Vec<u64> = tl.loaders[0].spans.iter().map(|s| s.batch).collect();
        assert_eq!(l0, [0, 2, 4, 6, 8]);
        assert!(tl.consumer.iter().any(|s| s.state == ConsumerState::Stall));
        assert!(tl.queue.steps.iter().all(|&(t, q)| t <= 0.02 && q <= 4));
        assert_eq!(tl.queue.capacity, Some(4));
        // The default window: 40 batches at the predicted 500/s.
        c.draw_seconds = None;
        assert!((c.draw_seconds() - 0.08).abs() < 1e-12);
    }
}
