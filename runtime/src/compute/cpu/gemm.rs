//! Single-precision matrix product over strided views (transposes are free), allocation-free.
//!
//! The shapes of det-s are small (at most 64 rows of C, a few hundred of k) and wide (up to
//! 4096 columns): tiling C's columns and updating four rows per pass over B keeps the work in
//! cache, and the inner loops are plain slices that the compiler vectorises (AVX2 + FMA when
//! the CPU has them, chosen at run time).

/// A matrix view: its data and its (row, column) strides, in elements.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

/// Row-major view: element `(i, j)` at `data[i·ld + j]`.
pub(crate) fn rm(data: &[f32], ld: usize) -> Mat<'_> {
    Mat {
        data,
        rs: ld,
        cs: 1,
    }
}

/// Transposed view of a row-major matrix with leading dimension `ld`: element `(i, j)` at
/// `data[j·ld + i]`.
pub(crate) fn tr(data: &[f32], ld: usize) -> Mat<'_> {
    Mat {
        data,
        rs: 1,
        cs: ld,
    }
}

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
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        ldc >= n || m == 1,
        "sgemm: C rows overlap (ldc {ldc} < n {n})"
    );
    assert!(
        last(m, n, ldc, 1) < c.len(),
        "sgemm: C ({m}×{n}, ldc {ldc}) outside its slice of {}",
        c.len()
    );
    if k == 0 {
        for i in 0..m {
            for v in &mut c[i * ldc..i * ldc + n] {
                *v = if beta == 0.0 { 0.0 } else { beta * *v };
            }
        }
        return;
    }
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
    // Scale C by beta first (beta = 0 overwrites: C may hold NaN), then accumulate A·B.
    for i in 0..m {
        let row = &mut c[i * ldc..i * ldc + n];
        if beta == 0.0 {
            row.fill(0.0);
        } else if beta != 1.0 {
            row.iter_mut().for_each(|v| *v *= beta);
        }
    }
    kernels::accumulate(m, k, n, alpha, a, b, c, ldc);
}

/// The product loops, compiled twice on x86-64 (baseline SSE2, and AVX2 + FMA picked at run
/// time); elsewhere once (NEON is baseline on aarch64). They allocate nothing: the training
/// step's "no allocation after warm-up" rule holds inside the GEMM too (a packing GEMM such
/// as `matrixmultiply` allocates its packing buffers on every call).
mod kernels {
    use super::Mat;

    /// `C += alpha·A·B` (bounds checked by the caller).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn accumulate(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: Mat<'_>,
        b: Mat<'_>,
        c: &mut [f32],
        ldc: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above), all the function needs.
            unsafe { accumulate_avx2(m, k, n, alpha, a, b, c, ldc) };
            return;
        }
        accumulate_generic(m, k, n, alpha, a, b, c, ldc);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn accumulate_avx2(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: Mat<'_>,
        b: Mat<'_>,
        c: &mut [f32],
        ldc: usize,
    ) {
        body(m, k, n, alpha, a, b, c, ldc);
    }

    #[allow(clippy::too_many_arguments)]
    fn accumulate_generic(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: Mat<'_>,
        b: Mat<'_>,
        c: &mut [f32],
        ldc: usize,
    ) {
        body(m, k, n, alpha, a, b, c, ldc);
    }

    /// `C(i, cols) += Σ_p A(i, p)·B(p, cols)` (B's rows contiguous).
    #[inline(always)]
    fn edge_row(
        i: usize,
        cols: std::ops::Range<usize>,
        k: usize,
        at: &impl Fn(usize, usize) -> f32,
        b: Mat<'_>,
        c: &mut [f32],
        ldc: usize,
    ) {
        if cols.is_empty() {
            return;
        }
        let row = &mut c[i * ldc + cols.start..i * ldc + cols.end];
        for p in 0..k {
            let av = at(i, p);
            let brow = &b.data[p * b.rs + cols.start..p * b.rs + cols.end];
            for (cv, bv) in row.iter_mut().zip(brow) {
                *cv += av * bv;
            }
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn body(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: Mat<'_>,
        b: Mat<'_>,
        c: &mut [f32],
        ldc: usize,
    ) {
        let at = |i: usize, p: usize| alpha * a.data[i * a.rs + p * a.cs];
        if b.cs == 1 {
            // Rows of B are contiguous. Register tiles of 4 rows × 16 columns of C are summed
            // over all of k in fixed-size arrays (which the compiler keeps in vector
            // registers), then added to C once; what is left over goes element by element.
            let (m4, n16) = (m - m % 4, n - n % 16);
            for i in (0..m4).step_by(4) {
                for j in (0..n16).step_by(16) {
                    let mut acc = [[0f32; 16]; 4];
                    for p in 0..k {
                        let brow: &[f32; 16] =
                            b.data[p * b.rs + j..][..16].try_into().expect("16 columns");
                        for (r, acc_row) in acc.iter_mut().enumerate() {
                            let av = at(i + r, p);
                            for l in 0..16 {
                                acc_row[l] += av * brow[l];
                            }
                        }
                    }
                    for (r, acc_row) in acc.iter().enumerate() {
                        let out = &mut c[(i + r) * ldc + j..][..16];
                        for l in 0..16 {
                            out[l] += acc_row[l];
                        }
                    }
                }
            }
            // The right-hand columns of the tiled rows, then the bottom rows.
            for i in 0..m4 {
                edge_row(i, n16..n, k, &at, b, c, ldc);
            }
            for i in m4..m {
                edge_row(i, 0..n, k, &at, b, c, ldc);
            }
        } else if a.cs == 1 && b.rs == 1 {
            // Both operands contiguous along k: each element of C is a dot product, summed in
            // eight lanes (so it vectorises without reordering the caller cannot allow).
            for i in 0..m {
                let arow = &a.data[i * a.rs..][..k];
                for j in 0..n {
                    let bcol = &b.data[j * b.cs..][..k];
                    let mut lanes = [0f32; 8];
                    let (ac, bc) = (arow.chunks_exact(8), bcol.chunks_exact(8));
                    let (ar, br) = (ac.remainder(), bc.remainder());
                    for (x, y) in ac.zip(bc) {
                        for l in 0..8 {
                            lanes[l] += x[l] * y[l];
                        }
                    }
                    let mut sum = lanes.iter().sum::<f32>();
                    for (x, y) in ar.iter().zip(br) {
                        sum += x * y;
                    }
                    c[i * ldc + j] += alpha * sum;
                }
            }
        } else {
            for i in 0..m {
                for p in 0..k {
                    let av = at(i, p);
                    for j in 0..n {
                        c[i * ldc + j] += av * b.data[p * b.rs + j * b.cs];
                    }
                }
            }
        }
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
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.73).cos()).collect();
        for (av, bv) in [
            (rm(&a, k), rm(&b, n)),
            (tr(&a, m), rm(&b, n)),
            (rm(&a, k), tr(&b, k)),
        ] {
            let mut c = vec![f32::NAN; m * n];
            sgemm(m, k, n, 1.0, av, bv, 0.0, &mut c, n);
            let want = naive(m, k, n, av, bv);
            for (x, y) in c.iter().zip(&want) {
                assert!(
                    (*x as f64 - y).abs() <= 1e-6 * (1.0 + y.abs()),
                    "{x} vs {y}"
                );
            }
            // beta = 1 accumulates.
            sgemm(m, k, n, 1.0, av, bv, 1.0, &mut c, n);
            for (x, y) in c.iter().zip(&want) {
                assert!((*x as f64 - 2.0 * y).abs() <= 1e-6 * (1.0 + y.abs()));
            }
        }
        let mut c = vec![3.0; 4];
        sgemm(2, 0, 2, 1.0, rm(&[], 0), rm(&[], 0), 0.5, &mut c, 2);
        assert_eq!(c, [1.5; 4]);
    }

    #[test]
    #[should_panic(expected = "outside its slice")]
    fn short_slices_are_refused() {
        let a = [1.0; 5];
        let mut c = [0.0; 4];
        sgemm(2, 3, 2, 1.0, rm(&a, 3), rm(&a, 2), 0.0, &mut c, 2);
    }
}
