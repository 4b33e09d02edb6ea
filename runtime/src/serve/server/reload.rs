//! The model served and how new weights replace it: a load and warm-up on a thread beside the
//! loop (SIGHUP, a client's `Reload`, a fine-tune's weights), checked against the memory
//! budget, swapped in by a move when ready, the old weights kept when it fails.

use super::*;

impl Model {
    /// Loads `path`, checks the memory plan for its model against the budget, sizes every
    /// buffer for the largest frame, runs one warm-up inference on a grey frame and checks
    /// its output.
    pub(super) fn load(path: &Path, config: &ServeConfig) -> LoadedModel {
        let checkpoint = Checkpoint::load(path).map_err(|e| Error::Weights {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let plan = config.plan(&checkpoint.model)?;
        if !plan.fits(config.exec.mem_budget) {
            return Err(Error::Budget {
                needed: plan.total(),
                budget: config.exec.mem_budget.unwrap_or(0),
                table: plan.table(),
            });
        }
        // Decoded at a threshold of 0 and filtered per request: a request may ask for less
        // than the daemon's default. Top-K by score, then the threshold, keeps what the
        // threshold, then top-K, would; suppression only ever removes a lower score.
        let mut predictor = Predictor::new(&checkpoint, &config.exec, 0.0, config.top_k)
            .map_err(|e| Error::from_infer(path, e))?;
        predictor
            .set_nms_iou(config.nms_iou)
            .map_err(|e| Error::Config(format!("--nms: {e}")))?;
        // Buffers sized for the largest frame up front; the warm-up frame itself is the
        // model's input size (a largest-size frame was 10.5 MiB at 1920 px, held only for
        // the warm-up and the process's peak resident memory ever after).
        predictor
            .reserve_sources(u32::from(config.max_frame_side))
            .map_err(|e| Error::from_infer(path, e))?;
        let side = checkpoint.model.input;
        let grey = image::RgbImage::from_pixel(side, side, image::Rgb([114, 114, 114]));
        let mut out = Vec::with_capacity(predictor.top_k());
        predictor
            .predict_into(
                &crate::pixels::Pixels::rgb8(&grey).expect("a model input is not empty"),
                None,
                &mut out,
            )
            .map_err(|e| Error::from_infer(path, e).while_doing("warm-up inference failed"))?;
        if let Some(bad) = out
            .iter()
            .find(|d| !d.score.is_finite() || !d.x0.is_finite())
        {
            return Err(Error::Weights {
                path: path.to_path_buf(),
                reason: format!(
                    "warm-up inference gave a non-finite detection {bad:?}: corrupt weights?"
                ),
            });
        }
        // The Vulkan driver's own resident memory, measured as it loaded, as a line of its own.
        let plan = predictor.with_driver(plan);
        let model = Model {
            engine: predictor.engine(),
            classes: checkpoint.classes.len().min(usize::from(u16::MAX)) as u16,
            names: class_lines(&checkpoint.classes),
            predictor,
            path: path.to_path_buf(),
        };
        Ok((model, plan))
    }
}

/// Class names one a line, as many as fit in a `Classes` message; names are cleaned of
/// newlines and NULs (they come from dataset files).
fn class_lines(classes: &[String]) -> String {
    let mut out = String::new();
    for name in classes {
        let clean: String = name
            .chars()
            .map(|c| if c == '\n' || c == '\0' { ' ' } else { c })
            .collect();
        if out.len() + clean.len() + 1 > protocol::MAX_CLASS_TEXT {
            log::warn!(
                "class names past {} bytes are not sent to clients",
                protocol::MAX_CLASS_TEXT
            );
            break;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&clean);
    }
    out
}

/// Why a client's `Reload` of a named file was refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReloadRefused {
    #[error(
        "this daemon reloads only its configured weights: send Reload with no path, or start it \
         with --client-reload-dir DIR for files in DIR ({0} refused)"
    )]
    NoReloadDir(String),
    #[error("{what}: {source}")]
    Unresolved {
        what: String,
        source: std::io::Error,
    },
    #[error("{path} resolves to {}, outside --client-reload-dir {}", resolved.display(), dir.display())]
    Outside {
        path: String,
        resolved: PathBuf,
        dir: PathBuf,
    },
}

/// Hands the heap's free pages back to the kernel. glibc keeps freed memory in per-thread
/// arenas, and the threads that load and drop weights get arenas of their own: without this,
/// a daemon reloaded often (or refused corrupt files under load) keeps each arena's high-water
/// mark resident. Called off the serving loop, after a load and after a drop.
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas under their locks; it may be called
    // from any thread at any time and touches no memory of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Server {
    /// Starts loading `path` on a thread of its own (at normal priority: its engine threads
    /// then serve at that priority). The outcome is installed by [`Server::finish_loading`].
    pub(super) fn start_loading(&mut self, path: PathBuf, why: LoadReason) {
        let config = self.config.clone();
        let load_path = path.clone();
        let spawned = std::thread::Builder::new()
            .name("weights-load".into())
            .spawn(move || {
                let loaded = Model::load(&load_path, &config);
                release_free_heap();
                loaded
            });
        match spawned {
            Ok(handle) => {
                log::info!("loading {} beside the serving loop", path.display());
                self.notifier.reloading();
                self.state = ServiceState::Reloading;
                self.loading = Some(Loading {
                    handle,
                    started: Instant::now(),
                    path,
                    why,
                });
            }
            Err(e) => {
                let e = Error::Io {
                    what: format!("starting to load {}", path.display()),
                    source: e,
                };
                self.settle_load(why, Err(e), Duration::ZERO);
            }
        }
    }

    /// Installs what finished loading, or gives up on a load past its deadline (its thread is
    /// left to end on its own; what it loads is dropped). Either way the reply owed, the log
    /// line and systemd's state follow.
    pub(super) fn finish_loading(&mut self) {
        let Some(loading) = &self.loading else {
            return;
        };
        let timed_out = loading.started.elapsed() > self.config.reload_timeout;
        if !loading.handle.is_finished() && !timed_out {
            return;
        }
        let Some(loading) = self.loading.take() else {
            return;
        };
        let loaded = if loading.handle.is_finished() {
            loading
                .handle
                .join()
                .unwrap_or_else(|_| Err(Error::Config("loading the weights panicked".into())))
        } else {
            Err(Error::Weights {
                path: loading.path.clone(),
                reason: format!(
                    "not loaded and warmed up within {:?} (--reload-timeout); abandoned",
                    self.config.reload_timeout
                ),
            })
        };
        let outcome = self.install(loaded);
        self.settle_load(loading.why, outcome, loading.started.elapsed());
    }

    /// Reports a load's outcome: the log, the requester's reply, the fine-tune's bookkeeping.
    fn settle_load(&mut self, why: LoadReason, outcome: Result<(), Error>, took: Duration) {
        self.state = ServiceState::Ready;
        match why {
            LoadReason::Reload { requester } => {
                match &outcome {
                    Ok(()) => log::info!(
                        "reloaded weights from {} (generation {}; loaded and warmed up in {} ms \
                         beside the serving loop)",
                        self.model.path.display(),
                        self.generation,
                        took.as_millis()
                    ),
                    Err(e) => log::error!("reload refused, the old weights keep serving: {e}"),
                }
                if let Some(r) = requester {
                    let still_there = self.clients[r.slot]
                        .as_ref()
                        .is_some_and(|c| c.id == r.client);
                    if still_there {
                        match &outcome {
                            Ok(()) => {
                                self.reply_message(r.slot, &r.header, &Message::Ack(Kind::Reload))
                            }
                            Err(e) => {
                                self.set_text(&e.to_string());
                                self.reply_error(
                                    r.slot,
                                    r.header.sequence,
                                    r.header.timestamp_us,
                                    ErrorCode::RELOAD_FAILED,
                                );
                            }
                        }
                    }
                }
            }
            LoadReason::FineTuned { map } => {
                let swapped = match &outcome {
                    Ok(()) => {
                        log::info!(
                            "swapped in fine-tuned weights {} (held-out mAP {map:.4}, generation {})",
                            self.model.path.display(),
                            self.generation
                        );
                        Some(map)
                    }
                    Err(e) => {
                        log::error!("fine-tuned weights refused, the old ones keep serving: {e}");
                        None
                    }
                };
                if let Some(f) = &self.fine_tune {
                    f.swap_settled(swapped);
                }
            }
        }
        if outcome.is_err() {
            self.counters.reload_failures += 1;
        }
        self.notifier.reloaded(&self.status_line());
    }

    /// Puts a loaded model in service (the old one is dropped on a thread of its own, so that
    /// freeing a large model does not stall requests), or leaves the old one serving.
    fn install(&mut self, loaded: LoadedModel) -> Result<(), Error> {
        let (model, plan) = loaded?;
        let old = std::mem::replace(&mut self.model, model);
        self.plan = plan;
        self.generation += 1;
        let dropped = std::thread::Builder::new()
            .name("weights-drop".into())
            .spawn(move || {
                drop(old);
                release_free_heap();
            });
        if let Err(e) = dropped {
            log::warn!("freeing the old weights on the serving loop ({e})");
        }
        Ok(())
    }

    /// Starts loading weights the fine-tune offers (they scored better on held-out data),
    /// unless another load is under way (the offer then waits).
    pub(super) fn swap_fine_tuned(&mut self) {
        if self.loading.is_some() {
            return;
        }
        let Some((path, map)) = self.fine_tune.as_ref().and_then(FineTuner::take_swap) else {
            return;
        };
        self.start_loading(path, LoadReason::FineTuned { map });
    }

    /// The file a client's `Reload` names, if it may: empty is the configured weights; any
    /// other path only inside `--client-reload-dir`, links resolved.
    pub(super) fn client_reload_path(&self, path: &str) -> Result<PathBuf, ReloadRefused> {
        if path.is_empty() {
            return Ok(self.config.weights.clone());
        }
        let Some(dir) = &self.config.client_reload_dir else {
            return Err(ReloadRefused::NoReloadDir(path.to_owned()));
        };
        let dir = dir
            .canonicalize()
            .map_err(|source| ReloadRefused::Unresolved {
                what: format!("--client-reload-dir {}", dir.display()),
                source,
            })?;
        let resolved =
            Path::new(path)
                .canonicalize()
                .map_err(|source| ReloadRefused::Unresolved {
                    what: path.to_owned(),
                    source,
                })?;
        if !resolved.starts_with(&dir) {
            return Err(ReloadRefused::Outside {
                path: path.to_owned(),
                resolved,
                dir,
            });
        }
        Ok(resolved)
    }
}
