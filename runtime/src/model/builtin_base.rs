//! The weights the photo recipe starts from: det-m trained on procedural images alone (no
//! photos, nobody's data), carried inside the program so that a robot with a few hundred
//! photos of its own does not start from random weights, and needs no network to fetch any.
//!
//! The file holds the averaged weights without optimizer state (`fulcrum export
//! --checkpoint`). How it was made: `tools/scripts/builtin-base.sh`; what it buys on which
//! data: docs/perf/recipes.md.

use std::path::Path;

use super::Checkpoint;

/// The model the built-in base is.
pub const MODEL: &str = "det-m";

/// Where the file lives in the source tree (what errors name).
const FILE: &str = "runtime/assets/det-m-base.safetensors";

static DET_M: &[u8] = include_bytes!("../../assets/det-m-base.safetensors");

/// The built-in base as a `model` for `input`-pixel images, or `None` when `model` has none.
/// The weights do not depend on the input size (every layer is a convolution), so the one
/// file serves every size the recipe packs at.
pub fn for_model(model: &str, input: u32) -> Option<Result<Checkpoint, super::checkpoint::Error>> {
    (model == MODEL).then(|| {
        let mut base = Checkpoint::decode(Path::new(FILE), DET_M)?;
        base.model.input = input;
        Ok(base)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::checkpoint::StateTensor;
    use crate::model::{Arch, ModelConfig};

    #[test]
    fn the_shipped_base_is_a_whole_det_m_of_weights_alone() {
        let base = for_model(MODEL, 320).expect("det-m has a base").unwrap();
        assert_eq!(base.model.name, MODEL);
        assert_eq!(
            base.model.input, 320,
            "the asked size, whatever it was trained at"
        );
        assert_eq!(
            base.model,
            ModelConfig::named_at(MODEL, base.model.classes, 320).unwrap(),
            "the preset's width, depth and levels"
        );
        let arch = Arch::new(&base.model);
        for spec in arch.params() {
            let w = base
                .get(&spec.name)
                .unwrap_or_else(|| panic!("no {}", spec.name));
            assert_eq!(w.len(), spec.len(), "{}", spec.name);
            assert!(w.iter().all(|v| v.is_finite()), "{}", spec.name);
            assert!(w.iter().any(|&v| v != 0.0), "{} is all zeros", spec.name);
        }
        assert_eq!(
            base.tensors.len(),
            arch.params().len(),
            "no optimizer state"
        );
        assert!(base
            .tensors
            .iter()
            .all(|t| StateTensor::param_of(&t.0) == t.0));
        assert_eq!(base.classes.len() as u32, base.model.classes);
        assert!(for_model("det-s", 128).is_none());
        assert!(for_model("det-l", 320).is_none());
    }

    #[test]
    fn the_base_differs_from_the_initial_weights() {
        // A trained base, not a freshly initialised model saved by mistake.
        let base = for_model(MODEL, 256).unwrap().unwrap();
        let initial = Checkpoint::initial(base.model.clone(), base.classes.clone(), 0);
        let moved = initial
            .tensors
            .iter()
            .filter(|(name, _, v)| base.get(name) != Some(v.as_slice()))
            .count();
        assert_eq!(moved, initial.tensors.len());
    }
}
