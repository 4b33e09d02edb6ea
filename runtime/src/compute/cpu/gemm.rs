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

/// What is applied to each element of C as it is stored: `relu?(… + bias[i])` for row `i`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Epilogue<'a> {
    /// One value per row of C, added after the product.
    pub bias: Option<&'a [f32]>,
    /// `max(0, ·)` last.
    pub relu: bool,
}

impl Epilogue<'_> {
    /// `relu?(v + bias[i])`, the scalar form of what the register tiles do.
    #[inline(always)]
    fn apply(&self, i: usize, v: f32) -> f32 {
        let v = match self.bias {
            Some(b) => v + b[i],
            None => v,
        };
        if self.relu {
            v.max(0.0)
        } else {
            v
        }
    }
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

/// [`sgemm`] followed by `ep` on every element of C, in the same pass where the CPU allows
/// (the AVX2 row path): `C ← relu?(alpha·A·B + beta·C + bias)`.
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
    if let Some(bias) = ep.bias {
        assert!(bias.len() >= m, "sgemm: {} biases for {m} rows", bias.len());
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
        if kernels::fused(m, k, n, alpha, a, b, beta, c, ldc, ep) {
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
        kernels::accumulate(m, k, n, alpha, a, b, c, ldc);
    }
    if ep.bias.is_some() || ep.relu {
        for i in 0..m {
            for v in &mut c[i * ldc..i * ldc + n] {
                *v = ep.apply(i, *v);
            }
        }
    }
}

/// The product loops, compiled twice on x86-64 (baseline SSE2, and AVX2 + FMA picked at run
/// time); elsewhere once (NEON is baseline on aarch64). They allocate nothing: the training
/// step's "no allocation after warm-up" rule holds inside the GEMM too (a packing GEMM such
/// as `matrixmultiply` allocates its packing buffers on every call).
mod kernels {
    use super::{Epilogue, Mat};

    /// The whole of `C ← ep(alpha·A·B + beta·C)` in one pass where a fused kernel fits the
    /// operands and the CPU (bounds checked by the caller); `false`: nothing done.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused(
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
    ) -> bool {
        // With both operands contiguous along k, the dot path pays a horizontal sum per
        // element of C and k block; the row path a transposing copy of B, which m rows of C
        // share. Measured on det-s's `dW = G·Xᵀ`: the row path wins while k ≤ 4·m.
        let dots = a.cs == 1 && b.rs == 1 && b.cs != 1 && k > 4 * m;
        #[cfg(target_arch = "x86_64")]
        if !dots
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above), all it needs.
            unsafe { rows_avx2(m, k, n, alpha, a, b, beta, c, ldc, ep) };
            return true;
        }
        let _ = (m, k, n, alpha, a, b, beta, c, ldc, ep, dots);
        false
    }

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
            if a.cs == 1 && b.rs == 1 {
                // SAFETY: the CPU has AVX2 and FMA (checked just above), all it needs.
                unsafe { dots_avx2(m, k, n, alpha, a, b, c, ldc) };
            } else {
                // SAFETY: the CPU has AVX2 and FMA (checked just above), all it needs.
                unsafe { accumulate_avx2(m, k, n, alpha, a, b, c, ldc) };
            }
            return;
        }
        accumulate_generic(m, k, n, alpha, a, b, c, ldc);
    }

    /// Rows of B packed per column tile by [`rows_avx2`]: a `KC × 16` panel (16 KiB, on the
    /// stack).
    #[cfg(target_arch = "x86_64")]
    const KC: usize = 256;

    /// The `b.cs == 1` path with explicit FMA and the epilogue fused: C in register tiles of
    /// up to 4 rows × 16 columns (eight accumulators), each B row of the tile loaded once per
    /// row set and each A element broadcast once, stored once.
    ///
    /// Column tiles are the outer loop: a tile's `k × 16` block of B is first copied into a
    /// contiguous panel (zero-padded past a ragged last column), which stays in L1 while every
    /// row set passes over it. Read in place, B's rows lie a plane apart — often a multiple of
    /// 4 KiB, so they all fall into the same L1 set and every row set would fetch them again.
    /// `k` past [`KC`] goes in blocks, C carrying the partial sums between them.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_avx2(
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
        let mut panel = [0f32; KC * 16];
        for j in (0..n).step_by(16) {
            let w = (n - j).min(16);
            for k0 in (0..k).step_by(KC) {
                let kl = KC.min(k - k0);
                pack_panel(&mut panel, b, k0, kl, j, w);
                let t = RowTiles {
                    a,
                    k0,
                    panel: &panel[..kl * 16],
                    alpha,
                    // Blocks after the first add to what C holds; the last stores the result.
                    beta: if k0 == 0 { beta } else { 1.0 },
                    ep: if k0 + kl == k {
                        ep
                    } else {
                        Epilogue::default()
                    },
                    c: c.as_mut_ptr(),
                    ldc,
                };
                for i in (0..m).step_by(4) {
                    // SAFETY: AVX2 and FMA as for this function; the tile (rows i.., columns
                    // j..j + w) lies inside A and C, whose last elements the caller checked.
                    unsafe {
                        match (m - i).min(4) {
                            4 => t.tile::<4>(i, j, w),
                            3 => t.tile::<3>(i, j, w),
                            2 => t.tile::<2>(i, j, w),
                            _ => t.tile::<1>(i, j, w),
                        }
                    }
                }
            }
        }
    }

    /// Copies rows `k0 .. k0 + kl`, columns `j .. j + w` of B into `panel` (16 floats a row,
    /// zero past `w`). B's rows contiguous: a row at a time. B transposed (its columns
    /// contiguous, as Xᵀ in `dW = G·Xᵀ`): a column at a time, which makes the product an
    /// outer-product sum with no horizontal additions.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn pack_panel(
        panel: &mut [f32; KC * 16],
        b: Mat<'_>,
        k0: usize,
        kl: usize,
        j: usize,
        w: usize,
    ) {
        let rows = panel.chunks_exact_mut(16).take(kl);
        if b.cs == 1 {
            for (p, row) in rows.enumerate() {
                let src = &b.data[(k0 + p) * b.rs + j..][..w];
                if let (Ok(d), Ok(s)) = (<&mut [f32; 16]>::try_from(&mut *row), src.try_into()) {
                    // A fixed-size copy: inlined, where a slice copy calls memmove.
                    *d = *<&[f32; 16]>::clone(&s);
                } else {
                    row[..w].copy_from_slice(src);
                    row[w..].fill(0.0);
                }
            }
            return;
        }
        if w < 16 {
            rows.for_each(|row| row[w..].fill(0.0));
        }
        for q in 0..w {
            let col = (j + q) * b.cs + k0 * b.rs;
            for p in 0..kl {
                panel[p * 16 + q] = b.data[col + p * b.rs];
            }
        }
    }

    /// One k block of [`rows_avx2`]: A from column `k0`, B's packed panel (`kl × 16`), C as a
    /// raw pointer so tiles can be written through it.
    #[cfg(target_arch = "x86_64")]
    struct RowTiles<'a> {
        a: Mat<'a>,
        k0: usize,
        panel: &'a [f32],
        alpha: f32,
        beta: f32,
        ep: Epilogue<'a>,
        c: *mut f32,
        ldc: usize,
    }

    #[cfg(target_arch = "x86_64")]
    impl RowTiles<'_> {
        /// Rows `i .. i + R`, columns `j .. j + w` (`w ≤ 16`) of C.
        ///
        /// Safety: the CPU has AVX2 and FMA; rows `i .. i + R` and columns `k0 .. k0 + kl`
        /// are inside A, and rows `i .. i + R`, columns `j .. j + w` inside C (whose last
        /// elements the caller checked against their slices).
        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn tile<const R: usize>(&self, i: usize, j: usize, w: usize) {
            use std::arch::x86_64::{
                __m256i, _mm256_add_ps, _mm256_broadcast_ss, _mm256_cmpgt_epi32, _mm256_fmadd_ps,
                _mm256_loadu_ps, _mm256_maskload_ps, _mm256_maskstore_ps, _mm256_max_ps,
                _mm256_mul_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32,
                _mm256_setzero_ps, _mm256_storeu_ps,
            };
            let a = &self.a;
            let full = w == 16;
            // Lane l of half h is live when 8·h + l < w.
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mask: [__m256i; 2] = [
                _mm256_cmpgt_epi32(_mm256_set1_epi32(w as i32), lanes),
                _mm256_cmpgt_epi32(_mm256_set1_epi32(w as i32 - 8), lanes),
            ];
            // SAFETY (all raw accesses below): panel reads 16·p .. 16·p + 16 for
            // p < panel.len()/16; A reads (i + r, k0 + p) with r < R, p < kl; C accesses
            // (i + r)·ldc + j + 8h .. + 8, live lanes only when ragged; all inside the checked
            // views. Pointers that may point past them are formed with wrapping arithmetic.
            unsafe {
                let mut ap: [*const f32; R] = std::array::from_fn(|r| {
                    a.data
                        .as_ptr()
                        .wrapping_add((i + r) * a.rs + self.k0 * a.cs)
                });
                let mut acc = [[_mm256_setzero_ps(); 2]; R];
                for row in self.panel.chunks_exact(16) {
                    let b0 = _mm256_loadu_ps(row.as_ptr());
                    let b1 = _mm256_loadu_ps(row.as_ptr().add(8));
                    for r in 0..R {
                        let av = _mm256_broadcast_ss(&*ap[r]);
                        ap[r] = ap[r].wrapping_add(a.cs);
                        acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
                        acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
                    }
                }
                let (al, be) = (_mm256_set1_ps(self.alpha), _mm256_set1_ps(self.beta));
                for (r, acc_r) in acc.iter().enumerate() {
                    let bias = self.ep.bias.map(|bs| _mm256_set1_ps(bs[i + r]));
                    for (h, v) in acc_r.iter().enumerate() {
                        let o = self.c.wrapping_add((i + r) * self.ldc + j + 8 * h);
                        let mut v = _mm256_mul_ps(al, *v);
                        if self.beta != 0.0 {
                            let old = if full {
                                _mm256_loadu_ps(o)
                            } else {
                                _mm256_maskload_ps(o, mask[h])
                            };
                            v = _mm256_fmadd_ps(be, old, v);
                        }
                        if let Some(bv) = bias {
                            v = _mm256_add_ps(v, bv);
                        }
                        if self.ep.relu {
                            v = _mm256_max_ps(v, _mm256_setzero_ps());
                        }
                        if full {
                            _mm256_storeu_ps(o, v);
                        } else {
                            _mm256_maskstore_ps(o, mask[h], v);
                        }
                    }
                }
            }
        }
    }

    /// The dot path of [`body`] (both operands contiguous along k, as in `dW += G·Xᵀ`) with
    /// explicit AVX2: the compiler's own vectoriser makes a shuffle-bound mess of a register
    /// tile. Tiles of 4 rows × 2 columns of C share their loads (6 vector loads per 8 FMAs
    /// instead of 16), and k is cut into blocks so that the block's rows of B stay in cache
    /// while every row tile passes over them.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn dots_avx2(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: Mat<'_>,
        b: Mat<'_>,
        c: &mut [f32],
        ldc: usize,
    ) {
        const KC: usize = 512;
        let (m4, n2) = (m - m % 4, n - n % 2);
        for k0 in (0..k).step_by(KC) {
            let kl = KC.min(k - k0);
            let arow = |i: usize| &a.data[i * a.rs + k0..][..kl];
            let bcol = |j: usize| &b.data[j * b.cs + k0..][..kl];
            for i in (0..m4).step_by(4) {
                let ar = [arow(i), arow(i + 1), arow(i + 2), arow(i + 3)];
                for j in (0..n2).step_by(2) {
                    // SAFETY: dots_avx2 runs only on CPUs with AVX2 and FMA.
                    let s = unsafe { dot_tile_avx2(ar, [bcol(j), bcol(j + 1)]) };
                    for (r, sr) in s.iter().enumerate() {
                        for (q, v) in sr.iter().enumerate() {
                            c[(i + r) * ldc + j + q] += alpha * v;
                        }
                    }
                }
                for j in n2..n {
                    // SAFETY: as above.
                    let s = unsafe { dot_tile_avx2(ar, [bcol(j)]) };
                    for (r, sr) in s.iter().enumerate() {
                        c[(i + r) * ldc + j] += alpha * sr[0];
                    }
                }
            }
            for i in m4..m {
                for j in 0..n {
                    // SAFETY: as above.
                    let s = unsafe { dot_tile_avx2([arow(i)], [bcol(j)]) };
                    c[i * ldc + j] += alpha * s[0][0];
                }
            }
        }
    }

    /// `R × Q` dot products of equally long rows; every loaded vector of `a` serves `Q`
    /// products and every one of `b` serves `R`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn dot_tile_avx2<const R: usize, const Q: usize>(
        a: [&[f32]; R],
        b: [&[f32]; Q],
    ) -> [[f32; Q]; R] {
        use std::arch::x86_64::{
            __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_storeu_ps,
        };
        let kl = a[0].len();
        let n8 = kl / 8;
        // Cut every row to kl first (panics if one is shorter), so reading 8 floats at 8·p
        // for p < n8 stays inside each of them.
        let ap = a.map(|s| s[..kl].as_ptr());
        let bp = b.map(|s| s[..kl].as_ptr());
        let mut out = [[0f32; Q]; R];
        // SAFETY: the CPU has AVX2 and FMA (the caller's contract); every load reads
        // 8·p .. 8·p + 8 ≤ kl floats of a row checked above, and loadu/storeu need no
        // alignment.
        unsafe {
            let mut acc: [[__m256; Q]; R] = [[_mm256_setzero_ps(); Q]; R];
            for p in 0..n8 {
                let mut bv = [_mm256_setzero_ps(); Q];
                for q in 0..Q {
                    bv[q] = _mm256_loadu_ps(bp[q].add(8 * p));
                }
                for r in 0..R {
                    let av = _mm256_loadu_ps(ap[r].add(8 * p));
                    for q in 0..Q {
                        acc[r][q] = _mm256_fmadd_ps(av, bv[q], acc[r][q]);
                    }
                }
            }
            for r in 0..R {
                for q in 0..Q {
                    let mut v = [0f32; 8];
                    _mm256_storeu_ps(v.as_mut_ptr(), acc[r][q]);
                    let mut s = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
                    for p in n8 * 8..kl {
                        s += a[r][p] * b[q][p];
                    }
                    out[r][q] = s;
                }
            }
        }
        out
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
        // Shapes with edges past every tile, and k past the row path's block of 256 and the dot
        // path's of 512.
        for (m, k, n) in [(5, 7, 3), (9, 1100, 5), (6, 20, 37), (7, 300, 18)] {
            products_match(m, k, n);
        }
        let mut c = vec![3.0; 4];
        sgemm(2, 0, 2, 1.0, rm(&[], 0), rm(&[], 0), 0.5, &mut c, 2);
        assert_eq!(c, [1.5; 4]);
    }

    fn products_match(m: usize, k: usize, n: usize) {
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.73).cos()).collect();
        for (av, bv) in [
            (rm(&a, k), rm(&b, n)),
            (tr(&a, m), rm(&b, n)),
            (rm(&a, k), tr(&b, k)),
        ] {
            // f32 rounding grows with k; an indexing slip would be off by O(1).
            let tol = 1e-6 * (1 + k / 64) as f64;
            let mut c = vec![f32::NAN; m * n];
            sgemm(m, k, n, 1.0, av, bv, 0.0, &mut c, n);
            let want = naive(m, k, n, av, bv);
            for (x, y) in c.iter().zip(&want) {
                assert!((*x as f64 - y).abs() <= tol * (1.0 + y.abs()), "{x} vs {y}");
            }
            // beta = 1 accumulates.
            sgemm(m, k, n, 1.0, av, bv, 1.0, &mut c, n);
            for (x, y) in c.iter().zip(&want) {
                assert!((*x as f64 - 2.0 * y).abs() <= tol * (1.0 + y.abs()));
            }
        }
    }

    /// Bias and ReLU fused into the store, with beta 0 (C holds NaN) and 1, on ragged tiles.
    #[test]
    fn epilogue_adds_bias_then_relu() {
        let (m, k, n) = (7, 5, 21);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.73).cos()).collect();
        let bias: Vec<f32> = (0..m).map(|i| i as f32 * 0.3 - 1.0).collect();
        let want = naive(m, k, n, rm(&a, k), rm(&b, n));
        let ep = Epilogue {
            bias: Some(&bias),
            relu: true,
        };
        let mut c = vec![f32::NAN; m * n];
        sgemm_ep(m, k, n, 1.0, rm(&a, k), rm(&b, n), 0.0, &mut c, n, ep);
        let expect = |i: usize, base: f64| (base + bias[i] as f64).max(0.0);
        for (idx, (x, y)) in c.iter().zip(&want).enumerate() {
            let e = expect(idx / n, *y);
            assert!(
                (*x as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()),
                "{x} vs {e}"
            );
        }
        let before = c.clone();
        sgemm_ep(m, k, n, 1.0, rm(&a, k), rm(&b, n), 1.0, &mut c, n, ep);
        for (idx, ((x, y), old)) in c.iter().zip(&want).zip(&before).enumerate() {
            let e = expect(idx / n, *y + *old as f64);
            assert!(
                (*x as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()),
                "{x} vs {e}"
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
