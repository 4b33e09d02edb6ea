//! Test helpers: random data, central finite differences and the comparison the kernel tests
//! use (compiled for tests only).
//!
//! Two kinds of gradient check, with their tolerances:
//!
//! - **Tight, `1e-4` relative**: the kernel's analytic `f32` gradient against central
//!   differences `(f(x + h) − f(x − h)) / 2h` of an independent `f64` reference of the forward
//!   function, with `h = 1e-6` ([`numeric_grad_f64`]). The convolutions are linear in each
//!   input between ReLU kinks, so the difference quotient is exact up to `f64` rounding
//!   (`~1e-16·|f|/h ≈ 1e-10`); for the smooth losses the truncation error `h²·f'''/6` is
//!   `~1e-12`. What is left is the `f32` kernel's own rounding, `~1e-6` relative. Coordinates
//!   whose `±h` evaluations fall on different sides of a kink (the reference returns a
//!   signature of its discrete choices, e.g. the ReLU pattern) are skipped and counted.
//! - **Loose, `1e-2` relative**: central differences of the `f32` kernel itself
//!   ([`numeric_grad_f32`], `h = 1e-2` on values of order 1). Each `f32` evaluation of a sum of
//!   `m` terms carries a rounding error of order `√m·2⁻²⁴·|f|`; divided by `2h` that is
//!   `~1e-4..1e-3` of the gradient, so `1e-2` is the tightest bound that holds with margin.
//!   It checks the kernel's forward and backward agree with each other, with no reference.
//!
//! The comparison ([`assert_close`]) is per element: `|got − want| ≤ tol · max(|want|, floor)`
//! with `floor = 1e-2 · max |want|`, so an element much smaller than the largest is held to an
//! absolute error `tol · 1e-2 · max |want|` rather than to a relative error that `f32`
//! cancellation could not meet.

use crate::base::SplitMix64;

/// `len` values uniform in `[lo, hi)`.
pub fn random_vec(rng: &mut SplitMix64, len: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..len).map(|_| lo + (hi - lo) * rng.next_f32()).collect()
}

/// Central differences of `f` at `x` (in `f64`) with step `h`. `f` returns its value and a
/// signature of its discrete choices; a coordinate whose `x ± h` signatures differ (a kink lies
/// between them) gets `NaN`, which [`assert_close`] skips.
pub fn numeric_grad_f64(x: &[f64], h: f64, mut f: impl FnMut(&[f64]) -> (f64, u64)) -> Vec<f64> {
    let mut x = x.to_vec();
    (0..x.len())
        .map(|i| {
            let v = x[i];
            x[i] = v + h;
            let (fp, sp) = f(&x);
            x[i] = v - h;
            let (fm, sm) = f(&x);
            x[i] = v;
            if sp == sm {
                (fp - fm) / (2.0 * h)
            } else {
                f64::NAN
            }
        })
        .collect()
}

/// Central differences of the `f32` function `f` at `x`, divided by the step actually taken
/// (`(x + h) − (x − h)` after rounding to `f32`).
pub fn numeric_grad_f32(x: &[f32], h: f32, mut f: impl FnMut(&[f32]) -> f64) -> Vec<f64> {
    let mut x = x.to_vec();
    (0..x.len())
        .map(|i| {
            let v = x[i];
            x[i] = v + h;
            let (xp, fp) = (x[i], f(&x));
            x[i] = v - h;
            let (xm, fm) = (x[i], f(&x));
            x[i] = v;
            (fp - fm) / (xp as f64 - xm as f64)
        })
        .collect()
}

/// Hash of a sign pattern (a ReLU's active set), for [`numeric_grad_f64`].
pub fn sign_signature(values: impl IntoIterator<Item = f64>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in values {
        h = (h ^ u64::from(v > 0.0)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Largest error of `got` against `want` in the metric of the module docs, and the number of
/// `NaN` (skipped) references.
pub fn max_rel_error(got: &[f32], want: &[f64]) -> (f64, usize) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let scale = want
        .iter()
        .filter(|w| !w.is_nan())
        .fold(0.0f64, |m, w| m.max(w.abs()));
    let floor = (1e-2 * scale).max(f64::MIN_POSITIVE);
    let mut worst = 0.0f64;
    let mut skipped = 0;
    for (&g, &w) in got.iter().zip(want) {
        if w.is_nan() {
            skipped += 1;
            continue;
        }
        let e = (g as f64 - w).abs() / w.abs().max(floor);
        worst = if e.is_nan() {
            f64::INFINITY
        } else {
            worst.max(e)
        };
    }
    (worst, skipped)
}

/// Panics, naming the worst element, when `got` and `want` differ by more than `tol` (module
/// docs), or when more than 5 % of the references were skipped.
pub fn assert_close(name: &str, got: &[f32], want: &[f64], tol: f64) {
    let (worst, skipped) = max_rel_error(got, want);
    if worst > tol {
        let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
        let floor = (1e-2 * scale).max(f64::MIN_POSITIVE);
        let (i, g, w) = got
            .iter()
            .zip(want)
            .enumerate()
            .filter(|(_, (_, w))| !w.is_nan())
            .map(|(i, (g, w))| (i, *g, *w))
            .max_by(|a, b| {
                let ea = (a.1 as f64 - a.2).abs() / a.2.abs().max(floor);
                let eb = (b.1 as f64 - b.2).abs() / b.2.abs().max(floor);
                ea.total_cmp(&eb)
            })
            .unwrap();
        panic!("{name}: relative error {worst:.3e} > {tol:.0e} at element {i}: got {g}, want {w}");
    }
    assert!(
        skipped * 20 <= want.len(),
        "{name}: {skipped} of {} coordinates skipped at kinks",
        want.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finite_differences_of_known_functions() {
        let x = [0.5f64, -1.25, 2.0];
        let g = numeric_grad_f64(&x, 1e-6, |x| (x[0] * x[0] + x[1].sin() * x[2], 0));
        let want = [1.0, (-1.25f64).cos() * 2.0, (-1.25f64).sin()];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-8, "{a} vs {b}");
        }
        let g = numeric_grad_f32(&[0.5f32, 3.0], 1e-2, |x| {
            (x[0] as f64).powi(2) + 2.0 * x[1] as f64
        });
        assert!((g[0] - 1.0).abs() < 1e-5 && (g[1] - 2.0).abs() < 1e-5);
        // A kink between x − h and x + h is skipped.
        let g = numeric_grad_f64(&[0.0, 1.0], 1e-6, |x| {
            (x[0].max(0.0) + x[1], sign_signature(x.iter().copied()))
        });
        assert!(g[0].is_nan() && (g[1] - 1.0).abs() < 1e-8);
    }

    #[test]
    fn closeness_metric() {
        assert_eq!(max_rel_error(&[1.0, 0.0], &[1.0, 0.0]).0, 0.0);
        // 1e-5 absolute on an element 1e-3 of the largest: judged against 1e-2 · 1.
        let (e, _) = max_rel_error(&[1.0, 1e-5 + 1e-5], &[1.0, 1e-5]);
        assert!((e - 1e-3).abs() < 1e-6);
        // One skipped coordinate in twenty is within the 5 % allowed.
        let mut got = [2.0f32; 20];
        let mut want = [2.0f64; 20];
        got[3] = f32::NAN;
        want[3] = f64::NAN;
        assert_close("ok", &got, &want, 1e-4);
    }

    #[test]
    #[should_panic(expected = "relative error")]
    fn closeness_fails_loudly() {
        assert_close("bad", &[1.0, 2.0], &[1.0, 2.1], 1e-4);
    }
}
