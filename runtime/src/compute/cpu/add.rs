//! The residual add and gradient accumulation ([`Add`]), split over the pool's threads when
//! the tensors are large (a training batch's activations are megabytes: one core does not
//! reach the memory's bandwidth).

use super::pool::Pool;
use super::scratch::{run_parts, split_parts};
use crate::compute::ops::Add;

/// Elementwise work on fewer floats than this stays on the calling thread: waking the pool
/// costs more than it saves.
pub(crate) const PARALLEL_MIN: usize = 1 << 16;

/// Parts to split `n` floats of elementwise work into on `pool`.
pub(crate) fn elementwise_parts(pool: Option<&Pool>, n: usize) -> usize {
    pool.map_or(1, Pool::threads).min(n / PARALLEL_MIN).max(1)
}

/// `out = a + b`.
pub fn add(op: &Add, a: &[f32], b: &[f32], out: &mut [f32], pool: Option<&Pool>) {
    let n = op.len as usize;
    assert!(
        a.len() >= n && b.len() >= n && out.len() >= n,
        "add: tensors shorter than {n}"
    );
    let parts = elementwise_parts(pool, n);
    run_parts(pool, split_parts(&mut out[..n], n, 1, parts), |(r, o)| {
        for ((o, x), y) in o.iter_mut().zip(&a[r.clone()]).zip(&b[r]) {
            *o = x + y;
        }
    });
}

/// `dst += src`.
pub fn add_assign(op: &Add, dst: &mut [f32], src: &[f32], pool: Option<&Pool>) {
    let n = op.len as usize;
    assert!(
        dst.len() >= n && src.len() >= n,
        "add_assign: tensors shorter than {n}"
    );
    let parts = elementwise_parts(pool, n);
    run_parts(pool, split_parts(&mut dst[..n], n, 1, parts), |(r, d)| {
        for (d, s) in d.iter_mut().zip(&src[r]) {
            *d += s;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_and_accumulates_only_len_elements() {
        let op = Add { len: 3 };
        let mut out = [9.0; 4];
        add(
            &op,
            &[1.0, 2.0, 3.0, 4.0],
            &[0.5, -2.0, 1.0, 4.0],
            &mut out,
            None,
        );
        assert_eq!(out, [1.5, 0.0, 4.0, 9.0]);
        add_assign(&op, &mut out, &[1.0, 1.0, 1.0, 1.0], None);
        assert_eq!(out, [2.5, 1.0, 5.0, 9.0]);
    }

    /// Large tensors split over threads give the single thread's sums exactly.
    #[test]
    fn the_split_over_threads_covers_every_element() {
        let n = 3 * PARALLEL_MIN + 5;
        let op = Add { len: n as u32 };
        let a: Vec<f32> = (0..n + 1).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n + 1).map(|i| 0.5 * i as f32).collect();
        let pool = Pool::new(3);
        assert_eq!(elementwise_parts(Some(&pool), n), 3);
        let mut out = vec![f32::NAN; n + 1];
        add(&op, &a, &b, &mut out, Some(&pool));
        add_assign(&op, &mut out, &a, Some(&pool));
        assert!(out[..n]
            .iter()
            .enumerate()
            .all(|(i, &v)| v == 2.5 * i as f32));
        assert!(out[n].is_nan(), "past len untouched");
    }
}
