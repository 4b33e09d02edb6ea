//! Single-precision matrix product over strided views (transposes are free), allocation-free.
//!
//! The shapes of det-s are small (at most 64 rows of C, a few hundred of k) and wide (up to
//! 4096 columns). The operands are checked here once; the loops are the active kernel set's
//! (see [`super::kernels`]). They allocate nothing: the training step's "no allocation after
//! warm-up" rule holds inside the GEMM too (a packing GEMM such as `matrixmultiply` allocates
//! its packing buffers on every call).

use super::kernels::{self, Kernels};
pub(crate) use super::kernels::{rm, tr, Epilogue, Mat};

/// Index of the last element of an `rows × cols` view (which must not be empty).
fn last(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    (rows - 1) * rs + (cols - 1) * cs
}

/// `C ← alpha·A·B + beta·C`, with `A` `m × k`, `B` `k × n` and `C` `m × n` row-major with
/// leading dimension `ldc`. With `beta = 0`, `C` is not read (it may hold anything, NaN too).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    sgemm_ep(m, k, n, alpha, a, b, beta, c, ldc, Epilogue::default());
}

/// [`sgemm`] followed by `ep` on every element of C, in the same pass where the kernel set
/// has a fused kernel: `C ← relu?(alpha·A·B + beta·C + bias)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_ep(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    ep: Epilogue<'_>,
) {
    sgemm_with(kernels::active(), m, k, n, alpha, a, b, beta, c, ldc, ep);
}

/// [`sgemm_ep`] with the kernels of `kern`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_with(
    kern: &Kernels,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    ep: Epilogue<'_>,
) {
    if m == 0 || n == 0 {
        return;
    }
    check_operands(m, k, n, a, b, c, ldc, ep);
    if k > 0 {
        // With both operands contiguous along k, the dot path pays a horizontal sum per
        // element of C and k block; the row path a transposing copy of B, which m rows of C
        // share. Measured on det-s's `dW = G·Xᵀ`: the row path wins while k ≤ 4·m.
        let dots = a.cs == 1 && b.rs == 1 && b.cs != 1 && k > 4 * m;
        if let (false, Some(fused)) = (dots, kern.gemm_fused) {
            // SAFETY: a `Kernels` comes only from the table of a set this CPU runs; A, B, C
            // and the biases were checked just above.
            unsafe { fused(m, k, n, alpha, a, b, beta, c.as_mut_ptr(), ldc, ep) };
            return;
        }
    }
    // Scale C by beta first (beta = 0 overwrites: C may hold NaN), then accumulate A·B, then
    // the epilogue in a pass of its own.
    for i in 0..m {
        let row = &mut c[i * ldc..i * ldc + n];
        if beta == 0.0 {
            row.fill(0.0);
        } else if beta != 1.0 {
            row.iter_mut().for_each(|v| *v *= beta);
        }
    }
    if k > 0 {
        // SAFETY: as above.
        unsafe { (kern.gemm_accumulate)(m, k, n, alpha, a, b, c, ldc) };
    }
    if ep.bias.is_some() || ep.relu || ep.residual.is_some() {
        for i in 0..m {
            for (j, v) in c[i * ldc..i * ldc + n].iter_mut().enumerate() {
                *v = ep.apply(i, i * ldc + j, *v);
            }
        }
    }
}

/// Panics unless A (`m × k`), B (`k × n`), C (`m × n`, leading dimension `ldc`) and the
/// biases lie inside their slices: what the kernels' safety contracts ask of their callers.
#[allow(clippy::too_many_arguments)]
fn check_operands(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &[f32],
    ldc: usize,
    ep: Epilogue<'_>,
) {
    assert!(
        ldc >= n || m == 1,
        "sgemm: C rows overlap (ldc {ldc} < n {n})"
    );
    assert!(
        last(m, n, ldc, 1) < c.len(),
        "sgemm: C ({m}×{n}, ldc {ldc}) outside its slice of {}",
        c.len()
    );
    if let Some(bias) = ep.bias {
        assert!(bias.len() >= m, "sgemm: {} biases for {m} rows", bias.len());
    }
    if let Some(res) = ep.residual {
        assert!(
            last(m, n, ldc, 1) < res.len(),
            "sgemm: residual ({m}×{n}, ldc {ldc}) outside its slice of {}",
            res.len()
        );
    }
    if k > 0 {
        assert!(
            last(m, k, a.rs, a.cs) < a.data.len(),
            "sgemm: A ({m}×{k}) outside its slice of {}",
            a.data.len()
        );
        assert!(
            last(k, n, b.rs, b.cs) < b.data.len(),
            "sgemm: B ({k}×{n}) outside its slice of {}",
            b.data.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, k: usize, n: usize, a: Mat, b: Mat) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for l in 0..k {
                    c[i * n + j] +=
                        a.data[i * a.rs + l * a.cs] as f64 * b.data[l * b.rs + j * b.cs] as f64;
                }
            }
        }
        c
    }

    #[test]
    fn products_with_transposes_match_the_naive_loop() {
        // Shapes with edges past every tile, k past the row path's block of 256 and the dot
        // path's of 512, and short k with several column tiles per panel buffer, ragged.
        for (m, k, n) in [
            (5, 7, 3),
            (9, 1100, 5),
            (6, 20, 37),
            (7, 300, 18),
            (5, 16, 533),
            (4, 128, 70),
            // The row path (k ≤ 4m) with a transposed B over two k blocks, ragged in both.
            (80, 300, 21),
        ] {
            products_match(m, k, n);
        }
        let mut c = vec![3.0; 4];
        sgemm(2, 0, 2, 1.0, rm(&[], 0), rm(&[], 0), 0.5, &mut c, 2);
        assert_eq!(c, [1.5; 4]);
    }

    /// The kernels of every set this CPU runs.
    fn tables() -> Vec<&'static Kernels> {
        kernels::KernelSet::here()
            .into_iter()
            .filter_map(kernels::table)
            .collect()
    }

    fn products_match(m: usize, k: usize, n: usize) {
        for kern in tables() {
            products_match_with(kern, m, k, n);
        }
    }

    fn products_match_with(kern: &Kernels, m: usize, k: usize, n: usize) {
        let set = kern.set;
        let sgemm = |m, k, n, alpha, a, b, beta, c: &mut [f32], ldc| {
            sgemm_with(
                kern,
                m,
                k,
                n,
                alpha,
                a,
                b,
                beta,
                c,
                ldc,
                Epilogue::default(),
            )
        };
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.73).cos()).collect();
        for (av, bv) in [
            (rm(&a, k), rm(&b, n)),
            (tr(&a, m), rm(&b, n)),
            (rm(&a, k), tr(&b, k)),
        ] {
            // f32 rounding grows with k (terms up to 1 in size, sums that cancel); an indexing
            // slip would be off by O(1).
            let tol = 1e-7 * (k + 8) as f64;
            let mut c = vec![f32::NAN; m * n];
            sgemm(m, k, n, 1.0, av, bv, 0.0, &mut c, n);
            let want = naive(m, k, n, av, bv);
            for (x, y) in c.iter().zip(&want) {
                assert!(
                    (*x as f64 - y).abs() <= tol * (1.0 + y.abs()),
                    "{set}: {x} vs {y}"
                );
            }
            // beta = 1 accumulates.
            sgemm(m, k, n, 1.0, av, bv, 1.0, &mut c, n);
            for (x, y) in c.iter().zip(&want) {
                assert!(
                    (*x as f64 - 2.0 * y).abs() <= tol * (1.0 + y.abs()),
                    "{set} {m}×{k}×{n}: {x} vs {}",
                    2.0 * y
                );
            }
            // alpha ≠ 1 scales the product, not what C held.
            sgemm(m, k, n, -0.5, av, bv, 1.0, &mut c, n);
            for (x, y) in c.iter().zip(&want) {
                assert!(
                    (*x as f64 - 1.5 * y).abs() <= tol * (1.0 + y.abs()),
                    "{set} {m}×{k}×{n}, alpha −0.5: {x} vs {}",
                    1.5 * y
                );
            }
        }
    }

    /// Bias, ReLU and a residual fused into the store, with beta 0 (C holds NaN) and 1, on
    /// ragged tiles.
    #[test]
    fn epilogue_adds_bias_then_relu() {
        for kern in tables() {
            epilogue_with(kern);
        }
    }

    fn epilogue_with(kern: &Kernels) {
        let set = kern.set;
        let sgemm_ep = |m, k, n, alpha, a, b, beta, c: &mut [f32], ldc, ep| {
            sgemm_with(kern, m, k, n, alpha, a, b, beta, c, ldc, ep)
        };
        // 11 rows: a whole tile of every set's height (4 and 8) and a ragged one.
        let (m, k, n) = (11, 5, 21);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.73).cos()).collect();
        let bias: Vec<f32> = (0..m).map(|i| i as f32 * 0.3 - 1.0).collect();
        let want = naive(m, k, n, rm(&a, k), rm(&b, n));
        let ep = Epilogue {
            bias: Some(&bias),
            relu: true,
            residual: None,
        };
        let mut c = vec![f32::NAN; m * n];
        sgemm_ep(m, k, n, 1.0, rm(&a, k), rm(&b, n), 0.0, &mut c, n, ep);
        let expect = |i: usize, base: f64| (base + bias[i] as f64).max(0.0);
        for (idx, (x, y)) in c.iter().zip(&want).enumerate() {
            let e = expect(idx / n, *y);
            assert!(
                (*x as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()),
                "{set}: {x} vs {e}"
            );
        }
        // A residual, C-shaped with a wider leading dimension than n, added after the ReLU.
        let ldc = n + 3;
        let res: Vec<f32> = (0..m * ldc).map(|i| (i as f32 * 0.29).sin()).collect();
        let mut cw = vec![f32::NAN; m * ldc];
        let ep_res = Epilogue {
            residual: Some(&res),
            ..ep
        };
        sgemm_ep(
            m,
            k,
            n,
            1.0,
            rm(&a, k),
            rm(&b, n),
            0.0,
            &mut cw,
            ldc,
            ep_res,
        );
        for i in 0..m {
            for j in 0..n {
                let (x, e) = (
                    cw[i * ldc + j],
                    expect(i, want[i * n + j]) + res[i * ldc + j] as f64,
                );
                assert!(
                    (x as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()),
                    "{set} residual ({i}, {j}): {x} vs {e}"
                );
            }
        }
        let before = c.clone();
        sgemm_ep(m, k, n, 1.0, rm(&a, k), rm(&b, n), 1.0, &mut c, n, ep);
        for (idx, ((x, y), old)) in c.iter().zip(&want).zip(&before).enumerate() {
            let e = expect(idx / n, *y + *old as f64);
            assert!(
                (*x as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()),
                "{set}: {x} vs {e}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "outside its slice")]
    fn short_slices_are_refused() {
        let a = [1.0; 5];
        let mut c = [0.0; 4];
        sgemm(2, 3, 2, 1.0, rm(&a, 3), rm(&a, 2), 0.0, &mut c, 2);
    }
}
