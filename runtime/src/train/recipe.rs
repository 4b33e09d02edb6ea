//! `train --recipe`: named presets of the settings that decide what a run learns, for a kind
//! of data, so that a person with their own photos gets a good detector without tuning.
//!
//! A recipe fills the model, batch, epochs, learning rate, warm-up, mosaic chance and
//! gradient-norm limit; any of
//! them given explicitly wins. The epochs follow the dataset's size: a fixed number of
//! optimizer steps (a small dataset needs as many updates as a large one to train from
//! scratch, each epoch of it just holds fewer), within bounds.

/// A named preset; see [`Recipe::settings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// Real photos of a few classes, objects small and large, tens to thousands of images:
    /// det-m (three output levels), mosaics, a high learning rate with warm-up and clipping,
    /// box regression at the centres' neighbours too (the 3×3 block), and about
    /// [`PHOTO_STEPS`] optimizer steps.
    Photos,
}

/// Optimizer steps the photos recipe aims at. `recipe_epochs` in
/// tools/scripts/fine-tune-scenarios.py repeats the epoch rule below: keep the two alike.
pub const PHOTO_STEPS: u64 = 1200;

/// The photos recipe's gradient-norm limit.
pub const PHOTO_CLIP_NORM: f32 = 10.0;

/// The photos recipe's regression weight of the cells around box centres.
pub const PHOTO_NEIGHBOURS: f32 = 0.75;

/// How far those cells reach in the photos recipe: the 3×3 block. Chosen across data
/// (`tools/scripts/cross-data.py`, docs/perf/recipes.md): three cells out scored alike on the
/// de-duplicated raccoon hold-outs (mean mAP@0.5 0.689 against 0.673, spread ±0.07) and far
/// lower on the synthetic set of mostly small objects (0.759 against 0.886, seeds 0 and 1), at
/// every size.
pub const PHOTO_NEIGHBOUR_RADIUS: u32 = 1;

/// What a recipe sets.
#[derive(Debug, Clone, PartialEq)]
pub struct RecipeSettings {
    pub model: String,
    pub batch: u32,
    pub epochs: u64,
    pub lr: f32,
    pub warmup: u64,
    pub mosaic: f32,
    /// Gradient-norm limit (0: none).
    pub clip_norm: f32,
    /// Regression weight of the cells around box centres (0: the centre alone).
    pub neighbours: f32,
    /// How far, in cells, those cells reach from the centre.
    pub neighbour_radius: u32,
    /// The most of a box's neighbour cells weighed in full (0: no limit).
    pub neighbour_cells: u32,
}

impl Recipe {
    /// Every recipe's name, for help and errors.
    pub const NAMES: [&'static str; 1] = ["photos"];

    /// The settings for a dataset of `records` records, training in batches of `batch` (the
    /// recipe's own when `None`).
    pub fn settings(&self, records: u64, batch: Option<u32>) -> RecipeSettings {
        match self {
            Recipe::Photos => {
                let batch = batch.unwrap_or(16).max(1);
                let steps_per_epoch = (records / u64::from(batch)).max(1);
                RecipeSettings {
                    model: "det-m".into(),
                    batch,
                    epochs: PHOTO_STEPS.div_ceil(steps_per_epoch).clamp(30, 300),
                    lr: 1e-2,
                    warmup: 50,
                    mosaic: 0.5,
                    clip_norm: PHOTO_CLIP_NORM,
                    neighbours: PHOTO_NEIGHBOURS,
                    neighbour_radius: PHOTO_NEIGHBOUR_RADIUS,
                    neighbour_cells: 0,
                }
            }
        }
    }
}

impl std::str::FromStr for Recipe {
    type Err = crate::base::UnknownChoice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "photos" => Ok(Recipe::Photos),
            _ => Err(crate::base::UnknownChoice::new("recipe", s, "photos")),
        }
    }
}

impl std::fmt::Display for Recipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Recipe::Photos => "photos",
        })
    }
}

impl std::fmt::Display for RecipeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}, batch {}, {} epochs, lr {} with {} warm-up steps, mosaic {}, gradient norm \
             clipped at {}, box neighbours weighted {} within {} cell{}{}",
            self.model,
            self.batch,
            self.epochs,
            self.lr,
            self.warmup,
            self.mosaic,
            self.clip_norm,
            self.neighbours,
            self.neighbour_radius,
            if self.neighbour_radius == 1 { "" } else { "s" },
            match self.neighbour_cells {
                0 => String::new(),
                n => format!(", at most {n} of them in full"),
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn photo_epochs_follow_the_dataset_within_bounds() {
        let s = Recipe::Photos.settings(164, None);
        // 164 records in batches of 16: 10 steps per epoch, 1200 steps.
        assert_eq!((s.model.as_str(), s.batch, s.epochs), ("det-m", 16, 120));
        assert_eq!(Recipe::Photos.settings(100_000, None).epochs, 30);
        assert_eq!(Recipe::Photos.settings(20, None).epochs, 300);
        assert_eq!(Recipe::Photos.settings(164, Some(8)).epochs, 60);
        assert_eq!("photos".parse::<Recipe>(), Ok(Recipe::Photos));
        let e = "fast".parse::<Recipe>().unwrap_err().to_string();
        assert!(e.contains("\"fast\"") && e.contains("photos"), "{e}");
        assert!(s.to_string().contains("det-m, batch 16, 120 epochs"), "{s}");
        assert!(
            s.to_string().ends_with("weighted 0.75 within 1 cell"),
            "{s}"
        );
    }
}
