//! A bounds-checked, safe wrapper around `matrixmultiply::sgemm`.
//!
//! `matrixmultiply` picks its micro-kernel per CPU at run time (AVX/FMA, SSE2, NEON, …) and
//! takes raw pointers with arbitrary strides, which makes transposes free. This file holds the
//! CPU engine's only `unsafe` block: it checks that every element the product reads or writes
//! lies inside the slices it was given, and that no two elements of `C` alias.

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
    let s = |x: usize| x as isize;
    // SAFETY: the asserts above keep every element of A, B and C that sgemm touches (row i <
    // rows, column j < cols, strides non-negative) inside its slice; the elements of C do not
    // alias one another (column stride 1, row stride ≥ n, or a single row); C is an exclusive
    // borrow, so it cannot overlap A or B.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            s(a.rs),
            s(a.cs),
            b.data.as_ptr(),
            s(b.rs),
            s(b.cs),
            beta,
            c.as_mut_ptr(),
            s(ldc),
            1,
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
