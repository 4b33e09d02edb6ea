//! Nearest-neighbour upsampling by 2 ([`Upsample2x`]) and its gradient.

use crate::compute::ops::Upsample2x;

/// `y(b, c, y, x) = x(b, c, y/2, x/2)`.
pub fn upsample2x_forward(op: &Upsample2x, x: &[f32], y: &mut [f32]) {
    let (h, w) = (op.h as usize, op.w as usize);
    assert!(
        x.len() >= op.input_len() && y.len() >= op.output_len(),
        "upsample: short tensors"
    );
    let planes = op.n as usize * op.c as usize;
    for p in 0..planes {
        let src = &x[p * h * w..(p + 1) * h * w];
        let dst = &mut y[p * 4 * h * w..(p + 1) * 4 * h * w];
        for (oy, row) in dst.chunks_exact_mut(2 * w).enumerate() {
            let line = &src[(oy / 2) * w..(oy / 2 + 1) * w];
            for (pair, v) in row.chunks_exact_mut(2).zip(line) {
                pair[0] = *v;
                pair[1] = *v;
            }
        }
    }
}

/// `gx(b, c, y, x)` = the sum of the four output gradients `x` was copied to.
pub fn upsample2x_backward(op: &Upsample2x, gy: &[f32], gx: &mut [f32]) {
    let (h, w) = (op.h as usize, op.w as usize);
    assert!(
        gy.len() >= op.output_len() && gx.len() >= op.input_len(),
        "upsample: short tensors"
    );
    let planes = op.n as usize * op.c as usize;
    for p in 0..planes {
        let src = &gy[p * 4 * h * w..(p + 1) * 4 * h * w];
        let dst = &mut gx[p * h * w..(p + 1) * h * w];
        for (iy, row) in dst.chunks_exact_mut(w).enumerate() {
            let top = &src[2 * iy * 2 * w..(2 * iy + 1) * 2 * w];
            let bottom = &src[(2 * iy + 1) * 2 * w..(2 * iy + 2) * 2 * w];
            for (ix, g) in row.iter_mut().enumerate() {
                *g = (top[2 * ix] + top[2 * ix + 1]) + (bottom[2 * ix] + bottom[2 * ix + 1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::SplitMix64;
    use crate::compute::cpu::gradcheck::random_vec;

    #[test]
    fn forward_copies_each_pixel_into_a_2x2_block() {
        let op = Upsample2x {
            n: 1,
            c: 1,
            h: 2,
            w: 3,
        };
        let mut y = vec![0.0; 24];
        upsample2x_forward(&op, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &mut y);
        assert_eq!(&y[..6], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        assert_eq!(&y[6..12], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        assert_eq!(&y[18..], &[4.0, 4.0, 5.0, 5.0, 6.0, 6.0]);
    }

    /// The backward pass is the adjoint of the forward one: `<up(x), g> = <x, up'(g)>`, checked
    /// in `f64` on odd shapes (every term is a product of two `f32`s, exact in `f64`).
    #[test]
    fn backward_is_the_adjoint_of_forward() {
        let mut rng = SplitMix64::new(7);
        for (n, c, h, w) in [(1, 1, 1, 1), (2, 3, 5, 7), (1, 4, 3, 2)] {
            let op = Upsample2x { n, c, h, w };
            let x = random_vec(&mut rng, op.input_len(), -1.0, 1.0);
            let g = random_vec(&mut rng, op.output_len(), -1.0, 1.0);
            let (mut y, mut gx) = (vec![0.0; op.output_len()], vec![0.0; op.input_len()]);
            upsample2x_forward(&op, &x, &mut y);
            upsample2x_backward(&op, &g, &mut gx);
            let lhs: f64 = y.iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum();
            let rhs: f64 = x.iter().zip(&gx).map(|(a, b)| *a as f64 * *b as f64).sum();
            assert!(
                (lhs - rhs).abs() <= 1e-5 * lhs.abs().max(1.0),
                "{lhs} vs {rhs}"
            );
        }
    }
}
