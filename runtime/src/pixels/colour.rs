//! The last step of the pass: one output row's resampled channels to 8-bit RGB.

use super::ColourSpace;

/// YUV to RGB as `R = ys·(Y − y0) + rv·(V − 128)`, `G = ys·(Y − y0) − gu·(U − 128) −
/// gv·(V − 128)`, `B = ys·(Y − y0) + bu·(U − 128)`, from the matrix's luma weights and range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct YuvToRgb {
    ys: f32,
    y0: f32,
    rv: f32,
    gu: f32,
    gv: f32,
    bu: f32,
}

impl YuvToRgb {
    pub fn new(space: ColourSpace) -> Self {
        let (kr, kb, full) = space.matrix();
        let kg = 1.0 - kr - kb;
        // Limited range: luma 16–235 (219 steps), chroma 16–240 (224 steps).
        let (ys, y0, cs) = if full {
            (1.0, 0.0, 1.0)
        } else {
            (255.0 / 219.0, 16.0, 255.0 / 224.0)
        };
        YuvToRgb {
            ys,
            y0,
            rv: 2.0 * (1.0 - kr) * cs,
            gu: 2.0 * (1.0 - kb) * kb / kg * cs,
            gv: 2.0 * (1.0 - kr) * kr / kg * cs,
            bu: 2.0 * (1.0 - kb) * cs,
        }
    }

    /// The matrix as `[ys, y0, rv, gu, gv, bu]` (see the type's docs), for the GPU kernel.
    pub fn coefficients(&self) -> [f32; 6] {
        [self.ys, self.y0, self.rv, self.gu, self.gv, self.bu]
    }

    /// RGB of one YUV sample, unclipped.
    pub fn rgb(&self, y: f32, u: f32, v: f32) -> [f32; 3] {
        let l = self.ys * (y - self.y0);
        let (d, e) = (u - 128.0, v - 128.0);
        [
            l + self.rv * e,
            l - self.gu * d - self.gv * e,
            l + self.bu * d,
        ]
    }
}

/// What the resampled channels are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Channels {
    Rgb,
    Gray,
    Yuv(YuvToRgb),
}

/// A resampled value as a byte: clipped, rounded to nearest (ties to even).
#[inline(always)]
fn byte(v: f32) -> u8 {
    // Adding 2²³ to a float in [0, 255] leaves its rounded value in the low mantissa bits:
    // a rounding the compiler vectorises, where a float-to-integer cast checks for overflow.
    const ROUND: f32 = 8_388_608.0;
    ((v.clamp(0.0, 255.0) + ROUND).to_bits() & 0xFF) as u8
}

/// Pixels converted a block at a time: fixed-size arrays the compiler keeps in vector
/// registers, then interleaved into the output.
const BLOCK: usize = 16;

/// Writes `n` pixels of RGB into `out` (`3·n` bytes) from the channel rows `c` (each ≥ `n`).
pub(super) fn to_rgb(channels: Channels, c: [&[f32]; 3], out: &mut [u8]) {
    let n = out.len() / 3;
    let mut start = 0;
    while start < n {
        let len = BLOCK.min(n - start);
        let mut rgb = [[0.0f32; BLOCK]; 3];
        for (k, plane) in rgb.iter_mut().enumerate() {
            plane[..len].copy_from_slice(&c[k][start..start + len]);
        }
        let [a, b, d] = &mut rgb;
        match channels {
            Channels::Rgb => {}
            Channels::Gray => {
                *b = *a;
                *d = *a;
            }
            Channels::Yuv(m) => {
                for i in 0..BLOCK {
                    let [r, g, bl] = m.rgb(a[i], b[i], d[i]);
                    (a[i], b[i], d[i]) = (r, g, bl);
                }
            }
        }
        let bytes = rgb.map(|plane| plane.map(byte));
        for (i, px) in out[start * 3..(start + len) * 3]
            .chunks_exact_mut(3)
            .enumerate()
        {
            px.copy_from_slice(&[bytes[0][i], bytes[1][i], bytes[2][i]]);
        }
        start += len;
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limited_range_black_white_and_primaries() {
        let m = YuvToRgb::new(ColourSpace::Bt601Limited);
        let px = |y, u, v| m.rgb(y, u, v).map(byte);
        assert_eq!(px(16.0, 128.0, 128.0), [0, 0, 0]);
        assert_eq!(px(235.0, 128.0, 128.0), [255, 255, 255]);
        // BT.601 limited red is Y 81, U 90, V 240.
        let red = px(81.0, 90.0, 240.0);
        assert!(red[0] >= 254 && red[1] <= 1 && red[2] <= 1, "{red:?}");
    }

    /// RGB to YUV by the matrix's definition (Y = Kr·R + Kg·G + Kb·B, Pb = (B − Y) / 2(1 −
    /// Kb), Pr = (R − Y) / 2(1 − Kr)), then scaled to the range: an independent inverse.
    fn forward(space: ColourSpace, rgb: [f32; 3]) -> [f32; 3] {
        let (kr, kb, full) = space.matrix();
        let [r, g, b] = rgb;
        let y = kr * r + (1.0 - kr - kb) * g + kb * b;
        let pb = (b - y) / (2.0 * (1.0 - kb));
        let pr = (r - y) / (2.0 * (1.0 - kr));
        if full {
            [y, pb + 128.0, pr + 128.0]
        } else {
            [
                16.0 + y * 219.0 / 255.0,
                128.0 + pb * 224.0 / 255.0,
                128.0 + pr * 224.0 / 255.0,
            ]
        }
    }

    #[test]
    fn every_space_inverts_its_own_definition() {
        for space in ColourSpace::ALL {
            let m = YuvToRgb::new(space);
            for rgb in [
                [255.0, 0.0, 0.0],
                [0.0, 255.0, 0.0],
                [0.0, 0.0, 255.0],
                [12.0, 200.0, 99.0],
            ] {
                let [y, u, v] = forward(space, rgb);
                let back = m.rgb(y, u, v);
                for c in 0..3 {
                    assert!(
                        (back[c] - rgb[c]).abs() < 0.01,
                        "{space:?} {rgb:?} → {back:?}"
                    );
                }
            }
        }
    }
}
