//! Every GPU kernel against its CPU twin, through the whole path a model takes: a
//! [`Recording`], lowered, set up by [`VulkanExec`] and replayed, with the Khronos validation
//! layer on (any message fails the test). Shapes are random-ish and deliberately awkward:
//! odd sizes, strides 1–3, grids that do not fill a GEMM tile, sums long enough to be split.
//!
//! Tolerance: [`assert_close`] (`compute::cpu::gradcheck`) at `1e-4` relative, per element
//! `|gpu − cpu| ≤ 1e-4 · max(|cpu|, 1e-2 · max|cpu|)`; the floor keeps elements much smaller
//! than the tensor's largest (sums that cancel) to an absolute error of `1e-6 · max|cpu|`.
//! Integer results (classes, counts, decode order) must match exactly.

use super::exec::VulkanExec;
use super::testing::{assert_clean, engine};
use crate::compute::cpu::gradcheck::{assert_close, random_vec};
use crate::compute::cpu::{self, Scratch};
use crate::compute::ops::{
    AdamW, Add, CenterLoss, Conv2d, Decode, Normalize, SgdMomentum, Targets, Upsample2x,
};
use crate::compute::recording::{
    Elem, Recording, Role, Step, TensorId, DETECTION_BYTES, HYPER_LEN, LOSS_LEN,
};
use crate::loader::order::SplitMix64;

/// The comparison tolerance (module docs).
const TOL: f64 = 1e-4;

fn close(name: &str, got: &[f32], want: &[f32]) {
    let want: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
    assert_close(name, got, &want, TOL);
}

/// The recording on a validated engine, or `None` (skipped) without Vulkan.
fn gpu(test: &str, rec: &Recording) -> Option<VulkanExec> {
    let engine = engine(test)?;
    Some(VulkanExec::new(engine, rec, false, None).unwrap())
}

fn read(exec: &mut VulkanExec, id: TensorId, len: usize) -> Vec<f32> {
    let mut v = vec![0.0; len];
    exec.read_f32(id, &mut v).unwrap();
    v
}

/// Reference implementations written from the op docs (`compute/ops.rs`), the CPU side of
/// the comparison for the kernels whose CPU twins live outside this branch so far.
pub(crate) mod reference {
    use super::*;

    pub fn add(op: &Add, a: &[f32], b: &[f32], out: &mut [f32]) {
        for i in 0..op.len as usize {
            out[i] = a[i] + b[i];
        }
    }

    pub fn add_assign(op: &Add, dst: &mut [f32], src: &[f32]) {
        for i in 0..op.len as usize {
            dst[i] += src[i];
        }
    }

    pub fn upsample2x_forward(op: &Upsample2x, x: &[f32], y: &mut [f32]) {
        let (h, w) = (op.h as usize, op.w as usize);
        for bc in 0..(op.n * op.c) as usize {
            for oy in 0..2 * h {
                for ox in 0..2 * w {
                    y[(bc * 2 * h + oy) * 2 * w + ox] = x[(bc * h + oy / 2) * w + ox / 2];
                }
            }
        }
    }

    pub fn upsample2x_backward(op: &Upsample2x, gy: &[f32], gx: &mut [f32]) {
        let (h, w) = (op.h as usize, op.w as usize);
        gx.fill(0.0);
        for bc in 0..(op.n * op.c) as usize {
            for oy in 0..2 * h {
                for ox in 0..2 * w {
                    gx[(bc * h + oy / 2) * w + ox / 2] += gy[(bc * 2 * h + oy) * 2 * w + ox];
                }
            }
        }
    }

    pub fn normalize(op: &Normalize, records: &[u8], out: &mut [f32]) {
        let (h, w) = (op.h as usize, op.w as usize);
        for b in 0..op.n as usize {
            for c in 0..3 {
                for y in 0..h {
                    for x in 0..w {
                        let xs = if op.flip { w - 1 - x } else { x };
                        let byte = records[b * op.record_stride as usize + (y * w + xs) * 3 + c];
                        out[((b * 3 + c) * h + y) * w + x] = f32::from(byte) / 255.0;
                    }
                }
            }
        }
    }

    fn le_u32(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }

    /// CenterNet's `gaussian_radius`, as published.
    fn gaussian_radius(h: f32, w: f32, overlap: f32) -> f32 {
        let b1 = h + w;
        let c1 = w * h * (1.0 - overlap) / (1.0 + overlap);
        let r1 = (b1 + (b1 * b1 - 4.0 * c1).sqrt()) / 2.0;
        let b2 = 2.0 * (h + w);
        let c2 = (1.0 - overlap) * w * h;
        let r2 = (b2 + (b2 * b2 - 16.0 * c2).sqrt()) / 2.0;
        let a3 = 4.0 * overlap;
        let b3 = -2.0 * overlap * (h + w);
        let c3 = (overlap - 1.0) * w * h;
        let r3 = (b3 + (b3 * b3 - 4.0 * a3 * c3).sqrt()) / 2.0;
        r1.min(r2).min(r3)
    }

    pub fn render_targets(op: &Targets, records: &[u8], out: &mut [f32]) {
        let (gh, gw) = (op.grid_h as i64, op.grid_w as i64);
        let plane = (gh * gw) as usize;
        let k = op.classes as usize;
        let stride = op.stride as f32;
        let image_w = (op.grid_w * op.stride) as f32;
        out.fill(0.0);
        for b in 0..op.n as usize {
            let meta = b * op.record_stride as usize + op.meta_offset as usize;
            let count = (le_u32(records, meta + 4) & 0xffff).min(op.max_boxes) as usize;
            let base = b * (k + 5) * plane;
            for i in 0..count {
                let at = meta + 40 + 20 * i;
                let class = le_u32(records, at) as usize;
                let f = |o: usize| f32::from_bits(le_u32(records, at + o));
                let (mut x0, y0, mut x1, y1) = (f(4), f(8), f(12), f(16));
                if op.flip {
                    (x0, x1) = (image_w - x1, image_w - x0);
                }
                let (cx, cy) = ((x0 + x1) / 2.0 / stride, (y0 + y1) / 2.0 / stride);
                let (bw, bh) = ((x1 - x0) / stride, (y1 - y0) / stride);
                let ccx = (cx.floor() as i64).clamp(0, gw - 1);
                let ccy = (cy.floor() as i64).clamp(0, gh - 1);
                let r = (gaussian_radius(bh, bw, op.min_overlap).floor() as i64).max(0);
                let sigma = (2 * r + 1) as f32 / 6.0;
                if class < k {
                    for y in (ccy - r).max(0)..=(ccy + r).min(gh - 1) {
                        for x in (ccx - r).max(0)..=(ccx + r).min(gw - 1) {
                            let (dx, dy) = (x - ccx, y - ccy);
                            let v = (-((dx * dx + dy * dy) as f32) / (2.0 * sigma * sigma)).exp();
                            let o = &mut out[base + class * plane + (y * gw + x) as usize];
                            *o = o.max(v);
                        }
                    }
                }
                let cell = base + (ccy * gw + ccx) as usize;
                out[cell + k * plane] = cx - cx.floor();
                out[cell + (k + 1) * plane] = cy - cy.floor();
                out[cell + (k + 2) * plane] = bw.ln();
                out[cell + (k + 3) * plane] = bh.ln();
                out[cell + (k + 4) * plane] = 1.0;
            }
        }
    }

    fn softplus(x: f64) -> f64 {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }

    fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    /// `[total, focal, offset, size, centres]`, in `f64`.
    pub fn center_loss(op: &CenterLoss, pred: &[f32], target: &[f32]) -> [f32; LOSS_LEN] {
        let plane = (op.grid_h * op.grid_w) as usize;
        let k = op.classes as usize;
        let (a, be) = (f64::from(op.alpha), f64::from(op.beta));
        let (mut focal, mut off, mut size, mut centres) = (0.0, 0.0, 0.0, 0.0);
        for b in 0..op.n as usize {
            for q in 0..plane {
                let p = |c: usize| f64::from(pred[(b * (k + 4) + c) * plane + q]);
                let t = |c: usize| f64::from(target[(b * (k + 5) + c) * plane + q]);
                for c in 0..k {
                    let (l, y) = (p(c), t(c));
                    focal += if y == 1.0 {
                        sigmoid(-l).powf(a) * softplus(-l)
                    } else {
                        (1.0 - y).powf(be) * sigmoid(l).powf(a) * softplus(l)
                    };
                }
                if t(k + 4) > 0.0 {
                    off += (p(k) - t(k)).abs() + (p(k + 1) - t(k + 1)).abs();
                    size += (p(k + 2) - t(k + 2)).abs() + (p(k + 3) - t(k + 3)).abs();
                    centres += 1.0;
                }
            }
        }
        let n = f64::max(1.0, centres);
        let (focal, off, size) = (
            focal / n,
            f64::from(op.offset_weight) * off / n,
            f64::from(op.size_weight) * size / n,
        );
        [
            (focal + off + size) as f32,
            focal as f32,
            off as f32,
            size as f32,
            centres as f32,
        ]
    }

    pub fn center_loss_backward(
        op: &CenterLoss,
        pred: &[f32],
        target: &[f32],
        centres: f32,
        grad: &mut [f32],
    ) {
        let plane = (op.grid_h * op.grid_w) as usize;
        let k = op.classes as usize;
        let (a, be) = (f64::from(op.alpha), f64::from(op.beta));
        let inv = 1.0 / f64::max(1.0, f64::from(centres));
        for b in 0..op.n as usize {
            for q in 0..plane {
                let t = |c: usize| f64::from(target[(b * (k + 5) + c) * plane + q]);
                for c in 0..k + 4 {
                    let i = (b * (k + 4) + c) * plane + q;
                    let l = f64::from(pred[i]);
                    let g = if c < k {
                        let (p, qq, y) = (sigmoid(l), sigmoid(-l), t(c));
                        if y == 1.0 {
                            -qq.powf(a) * (a * p * softplus(-l) + qq)
                        } else {
                            (1.0 - y).powf(be) * p.powf(a) * (a * qq * softplus(l) + p)
                        }
                    } else if t(k + 4) > 0.0 {
                        let d = l - t(c);
                        let w = if c < k + 2 {
                            op.offset_weight
                        } else {
                            op.size_weight
                        };
                        f64::from(w) * if d == 0.0 { 0.0 } else { d.signum() }
                    } else {
                        0.0
                    };
                    grad[i] = (g * inv) as f32;
                }
            }
        }
    }

    pub fn adamw(op: &AdamW, w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        let (c1, c2) = op.bias_corrections();
        for i in 0..op.len as usize {
            w[i] *= 1.0 - op.lr * op.weight_decay;
            m[i] = op.beta1 * m[i] + (1.0 - op.beta1) * g[i];
            v[i] = op.beta2 * v[i] + (1.0 - op.beta2) * g[i] * g[i];
            w[i] -= op.lr * (m[i] / c1) / ((v[i] / c2).sqrt() + op.eps);
        }
    }

    pub fn sgd_momentum(op: &SgdMomentum, w: &mut [f32], g: &[f32], vel: &mut [f32]) {
        for i in 0..op.len as usize {
            let gi = g[i] + op.weight_decay * w[i];
            vel[i] = op.momentum * vel[i] + gi;
            w[i] -= op.lr * vel[i];
        }
    }

    /// Detections per image as `(class, score, [x0, y0, x1, y1])`, best first.
    pub fn decode(op: &Decode, pred: &[f32]) -> Vec<Vec<(u32, f32, [f32; 4])>> {
        let (gh, gw) = (op.grid_h as i64, op.grid_w as i64);
        let plane = (gh * gw) as usize;
        let k = op.classes as usize;
        let s = op.stride as f32;
        (0..op.n as usize)
            .map(|b| {
                let img = &pred[b * (k + 4) * plane..][..(k + 4) * plane];
                let mut cands: Vec<(f32, usize)> = Vec::new();
                for c in 0..k {
                    for y in 0..gh {
                        for x in 0..gw {
                            let l = img[c * plane + (y * gw + x) as usize];
                            let mut peak = true;
                            for yy in (y - 1).max(0)..=(y + 1).min(gh - 1) {
                                for xx in (x - 1).max(0)..=(x + 1).min(gw - 1) {
                                    peak &= img[c * plane + (yy * gw + xx) as usize] <= l;
                                }
                            }
                            let score = 1.0 / (1.0 + (-l).exp());
                            if peak && score >= op.threshold {
                                cands.push((score, c * plane + (y * gw + x) as usize));
                            }
                        }
                    }
                }
                cands.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                cands.truncate(op.top_k as usize);
                cands
                    .into_iter()
                    .map(|(score, cell)| {
                        let (c, q) = (cell / plane, cell % plane);
                        let (y, x) = ((q / gw as usize) as f32, (q % gw as usize) as f32);
                        let cx = (x + img[k * plane + q]) * s;
                        let cy = (y + img[(k + 1) * plane + q]) * s;
                        let bw = img[(k + 2) * plane + q].exp() * s;
                        let bh = img[(k + 3) * plane + q].exp() * s;
                        let bx = [cx - bw / 2.0, cy - bh / 2.0, cx + bw / 2.0, cy + bh / 2.0];
                        (c as u32, score, bx)
                    })
                    .collect()
            })
            .collect()
    }
}

/// Runs a recording's steps on the CPU: the conv twin of `compute::cpu` and the
/// [`reference`] kernels, over zeroed tensors (what `CpuExec` does).
pub(crate) struct RefExec {
    rec: Recording,
    f32s: Vec<Vec<f32>>,
    bytes: Vec<Vec<u8>>,
    scratch: Scratch,
}

impl RefExec {
    pub fn new(rec: &Recording) -> RefExec {
        rec.validate().unwrap();
        let mut scratch = Scratch::new(2);
        for e in &rec.entries {
            for s in &e.steps {
                match s {
                    Step::ConvForward { op, .. } => {
                        scratch.reserve(cpu::conv2d_forward_scratch_len(op))
                    }
                    Step::ConvBackward { op, .. } => {
                        scratch.reserve(cpu::conv2d_backward_scratch_len(op))
                    }
                    _ => {}
                }
            }
        }
        let f32s = rec
            .tensors
            .iter()
            .map(|t| vec![0.0; if t.elem == Elem::F32 { t.len } else { 0 }])
            .collect();
        let bytes = rec
            .tensors
            .iter()
            .map(|t| vec![0; if t.elem == Elem::Bytes { t.len } else { 0 }])
            .collect();
        RefExec {
            rec: rec.clone(),
            f32s,
            bytes,
            scratch,
        }
    }

    pub fn write_f32(&mut self, id: TensorId, data: &[f32]) {
        self.f32s[id.index()].copy_from_slice(data);
    }

    pub fn read_f32(&self, id: TensorId) -> Vec<f32> {
        self.f32s[id.index()].clone()
    }

    pub fn write_bytes(&mut self, id: TensorId, data: &[u8]) {
        self.bytes[id.index()][..data.len()].copy_from_slice(data);
    }

    pub fn read_bytes(&self, id: TensorId) -> Vec<u8> {
        self.bytes[id.index()].clone()
    }

    fn take(&mut self, id: TensorId) -> Vec<f32> {
        std::mem::take(&mut self.f32s[id.index()])
    }

    fn put(&mut self, id: TensorId, v: Vec<f32>) {
        self.f32s[id.index()] = v;
    }

    pub fn run(&mut self, entry: usize) {
        for i in 0..self.rec.entries[entry].steps.len() {
            let step = self.rec.entries[entry].steps[i].clone();
            self.step(&step);
        }
    }

    fn step(&mut self, step: &Step) {
        match *step {
            Step::ConvForward { op, x, w, b, y } => {
                let mut out = self.take(y);
                let f = &self.f32s;
                let (xi, wi, bi) = (&f[x.index()], &f[w.index()], &f[b.index()]);
                cpu::conv2d_forward(&op, xi, wi, bi, &mut out, &mut self.scratch);
                self.put(y, out);
            }
            Step::ConvBackward {
                op,
                x,
                w,
                y,
                gy,
                gx,
                gw,
                gb,
            } => {
                let (mut gwv, mut gbv) = (self.take(gw), self.take(gb));
                let mut gxv = gx.map(|t| self.take(t));
                let f = &self.f32s;
                cpu::conv2d_backward(
                    &op,
                    &f[x.index()],
                    &f[w.index()],
                    &f[y.index()],
                    &f[gy.index()],
                    gxv.as_deref_mut(),
                    &mut gwv,
                    &mut gbv,
                    &mut self.scratch,
                );
                self.put(gw, gwv);
                self.put(gb, gbv);
                if let (Some(t), Some(v)) = (gx, gxv) {
                    self.put(t, v);
                }
            }
            Step::Add { op, a, b, out } => {
                let mut o = self.take(out);
                reference::add(&op, &self.f32s[a.index()], &self.f32s[b.index()], &mut o);
                self.put(out, o);
            }
            Step::AddAssign { op, dst, src } => {
                let mut d = self.take(dst);
                reference::add_assign(&op, &mut d, &self.f32s[src.index()]);
                self.put(dst, d);
            }
            Step::UpsampleForward { op, x, y } => {
                let mut o = self.take(y);
                reference::upsample2x_forward(&op, &self.f32s[x.index()], &mut o);
                self.put(y, o);
            }
            Step::UpsampleBackward { op, gy, gx } => {
                let mut o = self.take(gx);
                reference::upsample2x_backward(&op, &self.f32s[gy.index()], &mut o);
                self.put(gx, o);
            }
            Step::Normalize { op, records, out } => {
                let mut o = self.take(out);
                reference::normalize(&op, &self.bytes[records.index()], &mut o);
                self.put(out, o);
            }
            Step::Targets { op, records, out } => {
                let mut o = self.take(out);
                reference::render_targets(&op, &self.bytes[records.index()], &mut o);
                self.put(out, o);
            }
            Step::LossForward {
                op,
                pred,
                target,
                loss,
            } => {
                let f = &self.f32s;
                let l = reference::center_loss(&op, &f[pred.index()], &f[target.index()]);
                self.put(loss, l.to_vec());
            }
            Step::LossBackward {
                op,
                pred,
                target,
                loss,
                grad,
            } => {
                let mut g = self.take(grad);
                let f = &self.f32s;
                let centres = f[loss.index()][4];
                reference::center_loss_backward(
                    &op,
                    &f[pred.index()],
                    &f[target.index()],
                    centres,
                    &mut g,
                );
                self.put(grad, g);
            }
            Step::AdamW {
                op,
                param,
                grad,
                m,
                v,
                hyper,
            } => {
                let h = self.f32s[hyper.index()].clone();
                let op = AdamW {
                    lr: h[0],
                    step: h[1] as u32,
                    ..op
                };
                let (mut p, mut mv, mut vv) = (self.take(param), self.take(m), self.take(v));
                reference::adamw(&op, &mut p, &self.f32s[grad.index()], &mut mv, &mut vv);
                self.put(param, p);
                self.put(m, mv);
                self.put(v, vv);
            }
            Step::Sgd {
                op,
                param,
                grad,
                velocity,
                hyper,
            } => {
                let op = SgdMomentum {
                    lr: self.f32s[hyper.index()][0],
                    ..op
                };
                let (mut p, mut vel) = (self.take(param), self.take(velocity));
                reference::sgd_momentum(&op, &mut p, &self.f32s[grad.index()], &mut vel);
                self.put(param, p);
                self.put(velocity, vel);
            }
            Step::Decode {
                op,
                pred,
                dets,
                counts,
            } => {
                let found = reference::decode(&op, &self.f32s[pred.index()]);
                let mut d = std::mem::take(&mut self.bytes[dets.index()]);
                let c = &mut self.bytes[counts.index()];
                d.fill(0);
                for (b, list) in found.iter().enumerate() {
                    c[4 * b..4 * b + 4].copy_from_slice(&(list.len() as u32).to_le_bytes());
                    for (j, (class, score, bx)) in list.iter().enumerate() {
                        let at = DETECTION_BYTES * (b * op.top_k as usize + j);
                        let words = [
                            *class,
                            score.to_bits(),
                            bx[0].to_bits(),
                            bx[1].to_bits(),
                            bx[2].to_bits(),
                            bx[3].to_bits(),
                        ];
                        for (w, v) in words.iter().enumerate() {
                            d[at + 4 * w..at + 4 * w + 4].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
                self.bytes[dets.index()] = d;
            }
        }
    }
}

/// Detections of a bytes tensor as `(count, [class, score, x0, y0, x1, y1])` per image.
fn detections(dets: &[u8], counts: &[u8], op: &Decode) -> Vec<Vec<(u32, [f32; 5])>> {
    (0..op.n as usize)
        .map(|b| {
            let count = u32::from_le_bytes(counts[4 * b..4 * b + 4].try_into().unwrap());
            (0..count as usize)
                .map(|j| {
                    let at = DETECTION_BYTES * (b * op.top_k as usize + j);
                    let w = |i: usize| {
                        u32::from_le_bytes(dets[at + 4 * i..at + 4 * i + 4].try_into().unwrap())
                    };
                    let f = |i: usize| f32::from_bits(w(i));
                    (w(0), [f(1), f(2), f(3), f(4), f(5)])
                })
                .collect()
        })
        .collect()
}

fn conv_cases() -> Vec<Conv2d> {
    let grouped = |n, c_in, h, w, c_out, k, s, groups, relu| Conv2d {
        groups,
        ..Conv2d::dense(n, c_in, h, w, c_out, k, s, relu)
    };
    vec![
        // Dense: det-s's stem shape on an odd image; a 5×5 kernel; stride 3; a 1×1 with
        // stride 2 (dense, not pointwise); a sum long enough to be split over the batch.
        Conv2d::dense(2, 3, 13, 11, 16, 3, 2, true),
        Conv2d::dense(1, 5, 9, 6, 7, 5, 1, false),
        Conv2d::dense(3, 2, 10, 8, 3, 3, 3, true),
        Conv2d::dense(2, 6, 7, 9, 5, 1, 2, false),
        Conv2d::dense(3, 3, 40, 41, 8, 3, 1, true),
        // Grouped: two and three groups.
        grouped(2, 4, 7, 5, 6, 3, 1, 2, true),
        grouped(1, 6, 8, 8, 9, 3, 2, 3, false),
        // Pointwise: more channels than a tile, odd planes; a split weight gradient.
        Conv2d::pointwise(3, 33, 5, 7, 65, true),
        Conv2d::pointwise(2, 4, 50, 51, 4, false),
        // Depthwise: strides 1 and 2, a 5×5 kernel, no padding, a split weight gradient.
        Conv2d::depthwise(2, 5, 9, 7, 3, 2, true),
        Conv2d::depthwise(1, 3, 6, 11, 5, 1, false),
        Conv2d {
            pad: 0,
            ..Conv2d::depthwise(2, 4, 7, 7, 3, 1, true)
        },
        Conv2d::depthwise(2, 2, 48, 49, 3, 1, true),
    ]
}

#[test]
fn conv_forward_and_backward_match_the_cpu_twin() {
    let mut rng = SplitMix64::new(11);
    let cases = conv_cases();
    let mut rec = Recording::new();
    struct Ids {
        x: TensorId,
        w: TensorId,
        b: TensorId,
        y: TensorId,
        y_in: TensorId,
        gy: TensorId,
        gx: TensorId,
        gw: TensorId,
        gb: TensorId,
    }
    let mut ids = Vec::new();
    for (i, op) in cases.iter().enumerate() {
        let op = *op;
        let t =
            |rec: &mut Recording, name: &str, len, role| rec.f32(&format!("{name}{i}"), len, role);
        let id = Ids {
            x: t(&mut rec, "x", op.input_len(), Role::Input),
            w: t(&mut rec, "w", op.weight_len(), Role::Param),
            b: t(&mut rec, "b", op.bias_len(), Role::Param),
            y: t(&mut rec, "y", op.output_len(), Role::Output),
            y_in: t(&mut rec, "y_in", op.output_len(), Role::Input),
            gy: t(&mut rec, "gy", op.output_len(), Role::Input),
            gx: t(&mut rec, "gx", op.input_len(), Role::Output),
            gw: t(&mut rec, "gw", op.weight_len(), Role::Output),
            gb: t(&mut rec, "gb", op.bias_len(), Role::Output),
        };
        // The backward pass gets the CPU's forward output as `y` (the ReLU mask), so both
        // engines mask the same elements.
        rec.entry(
            &format!("case{i}"),
            vec![
                Step::ConvForward {
                    op,
                    x: id.x,
                    w: id.w,
                    b: id.b,
                    y: id.y,
                },
                Step::ConvBackward {
                    op,
                    x: id.x,
                    w: id.w,
                    y: id.y_in,
                    gy: id.gy,
                    gx: Some(id.gx),
                    gw: id.gw,
                    gb: id.gb,
                },
            ],
        );
        ids.push(id);
    }
    let Some(mut exec) = gpu("conv_forward_and_backward", &rec) else {
        return;
    };
    let mut scratch = Scratch::new(2);
    for (i, (op, id)) in cases.iter().zip(&ids).enumerate() {
        scratch.reserve(cpu::conv2d_forward_scratch_len(op));
        scratch.reserve(cpu::conv2d_backward_scratch_len(op));
        let x = random_vec(&mut rng, op.input_len(), -1.0, 1.0);
        let w = random_vec(&mut rng, op.weight_len(), -1.0, 1.0);
        let b = random_vec(&mut rng, op.bias_len(), -0.5, 0.5);
        let gy = random_vec(&mut rng, op.output_len(), -1.0, 1.0);
        let mut y = vec![0.0; op.output_len()];
        cpu::conv2d_forward(op, &x, &w, &b, &mut y, &mut scratch);
        let (mut gx, mut gw, mut gb) = (
            vec![0.0; op.input_len()],
            vec![0.0; op.weight_len()],
            vec![0.0; op.bias_len()],
        );
        cpu::conv2d_backward(
            op,
            &x,
            &w,
            &y,
            &gy,
            Some(&mut gx),
            &mut gw,
            &mut gb,
            &mut scratch,
        );
        for (t, v) in [
            (id.x, &x),
            (id.w, &w),
            (id.b, &b),
            (id.y_in, &y),
            (id.gy, &gy),
        ] {
            exec.write_f32(t, v).unwrap();
        }
        exec.run(i).unwrap();
        let what = format!("{:?} {op:?}", op.kind());
        close(&format!("y of {what}"), &read(&mut exec, id.y, y.len()), &y);
        close(
            &format!("gx of {what}"),
            &read(&mut exec, id.gx, gx.len()),
            &gx,
        );
        close(
            &format!("gw of {what}"),
            &read(&mut exec, id.gw, gw.len()),
            &gw,
        );
        close(
            &format!("gb of {what}"),
            &read(&mut exec, id.gb, gb.len()),
            &gb,
        );
    }
    // The split reductions were exercised: dense, pointwise and depthwise cases above are
    // long enough to be cut into parts.
    let reduces = (0..cases.len())
        .filter(|&e| exec.kernels(e).iter().any(|k| k.0 == "conv2d_grad_reduce"))
        .count();
    assert!(reduces >= 3, "{reduces} cases split their weight gradient");
    assert_clean(exec.engine());
}

#[test]
fn elementwise_kernels_match_the_reference() {
    let mut rng = SplitMix64::new(12);
    let mut rec = Recording::new();
    let add = Add { len: 1001 };
    let a = rec.f32("a", 1001, Role::Input);
    let b = rec.f32("b", 1001, Role::Input);
    let sum = rec.f32("sum", 1001, Role::Output);
    let acc = rec.f32("acc", 1001, Role::Output);
    let up = Upsample2x {
        n: 2,
        c: 3,
        h: 5,
        w: 7,
    };
    let ux = rec.f32("ux", up.input_len(), Role::Input);
    let uy = rec.f32("uy", up.output_len(), Role::Output);
    let ugy = rec.f32("ugy", up.output_len(), Role::Input);
    let ugx = rec.f32("ugx", up.input_len(), Role::Output);
    let norms = [false, true].map(|flip| Normalize {
        n: 3,
        h: 5,
        w: 7,
        record_stride: 5 * 7 * 3 + 9,
        flip,
    });
    let records = rec.tensor(
        "records",
        norms[0].input_bytes() + 3,
        Elem::Bytes,
        Role::Input,
    );
    let outs = [0, 1].map(|i| rec.f32(&format!("norm{i}"), norms[0].output_len(), Role::Output));
    let adam = AdamW {
        len: 777,
        lr: 0.0,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 1,
    };
    let sgd = SgdMomentum {
        len: 777,
        lr: 0.0,
        momentum: 0.9,
        weight_decay: 1e-3,
    };
    let param = rec.f32("param", 777, Role::Param);
    let grad = rec.f32("grad", 777, Role::Input);
    let m = rec.f32("m", 777, Role::State);
    let v = rec.f32("v", 777, Role::State);
    let sparam = rec.f32("sparam", 777, Role::Param);
    let vel = rec.f32("vel", 777, Role::State);
    let hyper = rec.f32("hyper", HYPER_LEN, Role::Input);
    let mut steps = vec![
        Step::Add {
            op: add,
            a,
            b,
            out: sum,
        },
        Step::Add {
            op: add,
            a,
            b,
            out: acc,
        },
        Step::AddAssign {
            op: add,
            dst: acc,
            src: sum,
        },
        Step::UpsampleForward {
            op: up,
            x: ux,
            y: uy,
        },
        Step::UpsampleBackward {
            op: up,
            gy: ugy,
            gx: ugx,
        },
    ];
    for (op, out) in norms.iter().zip(outs) {
        steps.push(Step::Normalize {
            op: *op,
            records,
            out,
        });
    }
    steps.push(Step::AdamW {
        op: adam,
        param,
        grad,
        m,
        v,
        hyper,
    });
    steps.push(Step::Sgd {
        op: sgd,
        param: sparam,
        grad,
        velocity: vel,
        hyper,
    });
    rec.entry("all", steps);
    let Some(mut exec) = gpu("elementwise_kernels", &rec) else {
        return;
    };
    let mut cpu = RefExec::new(&rec);
    for t in [a, b, ux, ugy, param, sparam, grad] {
        let len = rec.get(t).len;
        let data = random_vec(&mut rng, len, -2.0, 2.0);
        exec.write_f32(t, &data).unwrap();
        cpu.write_f32(t, &data);
    }
    let bytes: Vec<u8> = (0..rec.get(records).len)
        .map(|_| (rng.next_u64() >> 56) as u8)
        .collect();
    exec.write_bytes(records, &bytes).unwrap();
    cpu.write_bytes(records, &bytes);
    // Three optimizer steps with a changing learning rate: state carries over and the
    // bias corrections come from `hyper` each time.
    for step in 1..=3u32 {
        let op = AdamW { step, ..adam };
        let (c1, c2) = op.bias_corrections();
        let h = [1e-2 * step as f32, step as f32, c1, c2];
        exec.write_f32(hyper, &h).unwrap();
        cpu.write_f32(hyper, &h);
        exec.run(0).unwrap();
        cpu.run(0);
        for t in [
            sum, acc, uy, ugx, outs[0], outs[1], param, m, v, sparam, vel,
        ] {
            let name = &rec.get(t).name;
            let got = read(&mut exec, t, rec.get(t).len);
            close(&format!("{name} after step {step}"), &got, &cpu.read_f32(t));
        }
    }
    assert_clean(exec.engine());
}

/// `n` records of `layout`-like shape: random image bytes, random boxes.
fn records_with_boxes(
    rng: &mut SplitMix64,
    n: usize,
    side: u32,
    classes: u32,
    layout: &crate::format::RecordLayout,
) -> Vec<u8> {
    use crate::format::{RecordBox, RecordMeta};
    let mut out = vec![0u8; n * layout.record_size];
    for (i, rec) in out.chunks_exact_mut(layout.record_size).enumerate() {
        let image: Vec<u8> = (0..layout.image_bytes)
            .map(|_| (rng.next_u64() >> 56) as u8)
            .collect();
        let count = (rng.next_u64() % (u64::from(layout.max_boxes) + 1)) as usize;
        let s = side as f32;
        let boxes: Vec<RecordBox> = (0..count)
            .map(|_| {
                let w = 4.0 + rng.next_f32() * (s / 2.0);
                let h = 4.0 + rng.next_f32() * (s / 2.0);
                let x0 = rng.next_f32() * (s - w);
                let y0 = rng.next_f32() * (s - h);
                RecordBox {
                    class: (rng.next_u64() % u64::from(classes)) as u32,
                    x0,
                    y0,
                    x1: x0 + w,
                    y1: y0 + h,
                }
            })
            .collect();
        let meta = RecordMeta {
            index: i as u64,
            ..RecordMeta::default()
        };
        layout.encode(rec, &image, &meta, &boxes);
    }
    out
}

#[test]
fn targets_loss_and_loss_gradient_match_the_reference() {
    use crate::format::RecordLayout;
    let mut rng = SplitMix64::new(13);
    // (batch, classes, grid, max boxes): one loss part, and 9·16·16 = 2304 cells in two.
    let shapes = [(3u32, 3u32, 8u32, 5u32), (9, 2, 16, 12)];
    let mut rec = Recording::new();
    let mut cases = Vec::new();
    for (i, &(n, classes, grid, max_boxes)) in shapes.iter().enumerate() {
        let layout = RecordLayout::new(grid * 8, grid * 8, 3, max_boxes).unwrap();
        let records = rec.tensor(
            &format!("records{i}"),
            n as usize * layout.record_size,
            Elem::Bytes,
            Role::Input,
        );
        let mut steps = Vec::new();
        let mut outs = Vec::new();
        for flip in [false, true] {
            let op = Targets {
                n,
                classes,
                grid_h: grid,
                grid_w: grid,
                stride: 8,
                max_boxes,
                record_stride: layout.record_size as u32,
                meta_offset: layout.image_bytes as u32,
                min_overlap: 0.7,
                flip,
            };
            let out = rec.f32(&format!("targets{i}{flip}"), op.output_len(), Role::Output);
            steps.push(Step::Targets { op, records, out });
            outs.push(out);
        }
        let loss_op = CenterLoss {
            offset_weight: 0.5,
            size_weight: 2.0,
            ..CenterLoss::det_s(n, classes, grid, grid)
        };
        let pred = rec.f32(&format!("pred{i}"), loss_op.pred_len(), Role::Input);
        let loss = rec.f32(&format!("loss{i}"), LOSS_LEN, Role::Output);
        let grad = rec.f32(&format!("grad{i}"), loss_op.pred_len(), Role::Output);
        steps.push(Step::LossForward {
            op: loss_op,
            pred,
            target: outs[1],
            loss,
        });
        steps.push(Step::LossBackward {
            op: loss_op,
            pred,
            target: outs[1],
            loss,
            grad,
        });
        rec.entry(&format!("case{i}"), steps);
        cases.push((layout, records, outs, pred, loss, grad, n, classes, grid));
    }
    let Some(mut exec) = gpu("targets_loss_and_loss_gradient", &rec) else {
        return;
    };
    let mut cpu = RefExec::new(&rec);
    for (i, (layout, records, outs, pred, loss, grad, n, classes, grid)) in cases.iter().enumerate()
    {
        let bytes = records_with_boxes(&mut rng, *n as usize, grid * 8, *classes, layout);
        exec.write_bytes(*records, &bytes).unwrap();
        cpu.write_bytes(*records, &bytes);
        // Logits over a wide range, so both tails of the focal loss are exercised.
        let p = random_vec(&mut rng, rec.get(*pred).len, -8.0, 8.0);
        exec.write_f32(*pred, &p).unwrap();
        cpu.write_f32(*pred, &p);
        exec.run(i).unwrap();
        cpu.run(i);
        for &t in outs.iter().chain([loss, grad]) {
            let name = &rec.get(t).name;
            close(name, &read(&mut exec, t, rec.get(t).len), &cpu.read_f32(t));
        }
        let l = cpu.read_f32(*loss);
        assert!(l[4] >= 1.0, "case {i}: some centres ({l:?})");
        let parts = exec.kernels(i).iter().any(|k| k.0 == "loss_finish");
        assert_eq!(parts, i == 1, "case {i}: the loss is split into parts");
    }
    assert_clean(exec.engine());
}

#[test]
fn decode_matches_the_reference_in_order_and_values() {
    let mut rng = SplitMix64::new(14);
    let ops = [
        // Fewer candidates than top_k; more than top_k; a grid bigger than one sort window
        // (3·24·24 = 1728 cells > 1024 − 100), so the selection takes several rounds.
        Decode {
            n: 2,
            classes: 2,
            grid_h: 5,
            grid_w: 7,
            stride: 8,
            threshold: 0.3,
            top_k: 100,
        },
        Decode {
            n: 3,
            classes: 3,
            grid_h: 9,
            grid_w: 8,
            stride: 4,
            threshold: 0.0,
            top_k: 7,
        },
        Decode {
            n: 2,
            classes: 3,
            grid_h: 24,
            grid_w: 24,
            stride: 8,
            threshold: 0.05,
            top_k: 100,
        },
    ];
    let mut rec = Recording::new();
    let mut ids = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let pred = rec.f32(&format!("pred{i}"), op.input_len(), Role::Input);
        let dets = rec.tensor(
            &format!("dets{i}"),
            op.output_len() * DETECTION_BYTES,
            Elem::Bytes,
            Role::Output,
        );
        let counts = rec.tensor(
            &format!("counts{i}"),
            4 * op.n as usize,
            Elem::Bytes,
            Role::Output,
        );
        rec.entry(
            &format!("case{i}"),
            vec![Step::Decode {
                op: *op,
                pred,
                dets,
                counts,
            }],
        );
        ids.push((pred, dets, counts));
    }
    let Some(mut exec) = gpu("decode", &rec) else {
        return;
    };
    let mut cpu = RefExec::new(&rec);
    for (i, (op, &(pred, dets, counts))) in ops.iter().zip(&ids).enumerate() {
        let plane = (op.grid_h * op.grid_w) as usize;
        let k = op.classes as usize;
        let mut p = random_vec(&mut rng, op.input_len(), -4.0, 2.0);
        // Plateaus of equal logits (two adjacent cells, and the same value on two classes):
        // equal scores, ordered by (class, y, x).
        for b in 0..op.n as usize {
            let img = &mut p[b * (k + 4) * plane..][..(k + 4) * plane];
            img[plane / 2] = 3.0;
            img[plane / 2 + 1] = 3.0;
            img[plane + 3] = 3.0;
            for v in &mut img[k * plane..(k + 2) * plane] {
                *v = v.abs() / 2.0;
            }
        }
        exec.write_f32(pred, &p).unwrap();
        cpu.write_f32(pred, &p);
        exec.run(i).unwrap();
        cpu.run(i);
        let (mut d, mut c) = (vec![0u8; rec.get(dets).len], vec![0u8; rec.get(counts).len]);
        exec.read_bytes(dets, &mut d).unwrap();
        exec.read_bytes(counts, &mut c).unwrap();
        let got = detections(&d, &c, op);
        let want = detections(&cpu.read_bytes(dets), &cpu.read_bytes(counts), op);
        for (b, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "case {i} image {b}: detection count");
            assert!(
                !g.is_empty(),
                "case {i} image {b}: no detections to compare"
            );
            let classes: Vec<u32> = g.iter().map(|d| d.0).collect();
            let want_classes: Vec<u32> = w.iter().map(|d| d.0).collect();
            assert_eq!(
                classes, want_classes,
                "case {i} image {b}: classes in order"
            );
            let flat =
                |v: &Vec<(u32, [f32; 5])>| -> Vec<f32> { v.iter().flat_map(|d| d.1).collect() };
            close(
                &format!("case {i} image {b} detections"),
                &flat(g),
                &flat(w),
            );
        }
        if i == 1 {
            assert!(got.iter().all(|g| g.len() == 7), "top_k caps the count");
        }
    }
    assert_clean(exec.engine());
}

#[test]
fn memory_budget_is_checked_before_allocating() {
    use crate::format::RecordLayout;
    use crate::model::arch::{Arch, ModelConfig};
    use crate::model::graph::{GraphOptions, ModelGraph};
    let arch = Arch::new(&ModelConfig::named("det-s", 2).unwrap());
    let layout = RecordLayout::new(128, 128, 3, 8).unwrap();
    let g = ModelGraph::build(&arch, 8, &layout, &GraphOptions::default()).unwrap();
    let needed = VulkanExec::needed_bytes(&g.recording).unwrap();
    assert!(needed > g.recording.bytes(), "scratch is counted");
    let Some(engine) = engine("memory_budget") else {
        return;
    };
    let e = VulkanExec::new(engine, &g.recording, false, Some(needed - 1)).unwrap_err();
    assert!(e.contains(&format!("needs {needed} bytes")), "{e}");
    assert!(e.contains("over the memory budget"), "{e}");
    assert!(e.contains("the largest tensors: "), "{e}");
    assert!(
        e.contains("a batch of at most about 7 would fit (it is 8)"),
        "{e}"
    );
    let engine = super::testing::engine("memory_budget").unwrap();
    let e = VulkanExec::new(engine, &g.recording, false, Some(1000)).unwrap_err();
    assert!(e.contains("no batch fits"), "{e}");
    let engine = super::testing::engine("memory_budget").unwrap();
    let exec = VulkanExec::new(engine, &g.recording, false, Some(needed)).unwrap();
    assert_eq!(exec.bytes(), needed);
    let report = exec.engine().allocation_report();
    assert!(report.get("scratch.conv-partial").is_some());
    assert_eq!(report.buffers.len(), g.recording.tensors.len() + 2);
    assert_clean(exec.engine());
}

/// Tolerance of the whole-model comparison: the [`TOL`] metric, looser because rounding
/// differences of ~100 kernels in a row (forward, backward through 19 convolutions, AdamW)
/// add up; measured worst on lavapipe about 1e-4 (the stem's weight gradient, a sum of
/// 8192 terms at the end of the chain).
const MODEL_TOL: f64 = 5e-4;

/// Compares every `f32` tensor `keep` selects; returns how many.
fn compare_tensors(
    what: &str,
    rec: &Recording,
    exec: &mut VulkanExec,
    cpu: &RefExec,
    keep: impl Fn(&crate::compute::recording::Tensor) -> bool,
) -> usize {
    let mut compared = 0;
    for (i, t) in rec.tensors.iter().enumerate() {
        if t.elem != Elem::F32 || !keep(t) {
            continue;
        }
        let id = TensorId(i as u32);
        let got = read(exec, id, t.len);
        let want: Vec<f64> = cpu.read_f32(id).iter().map(|&v| f64::from(v)).collect();
        assert_close(&format!("{what}: {}", t.name), &got, &want, MODEL_TOL);
        compared += 1;
    }
    compared
}

#[test]
fn det_s_train_steps_match_the_cpu() {
    use crate::format::RecordLayout;
    use crate::model::arch::{Arch, ModelConfig};
    use crate::model::graph::{GraphOptions, ModelGraph, ENTRY_EVAL, ENTRY_INFER, ENTRY_TRAIN};
    use crate::model::init::init_params;
    let arch = Arch::new(&ModelConfig::named("det-s", 2).unwrap());
    let layout = RecordLayout::new(128, 128, 3, 8).unwrap();
    let options = GraphOptions::default();
    let g = ModelGraph::build(&arch, 2, &layout, &options).unwrap();
    let rec = &g.recording;
    let Some(mut exec) = gpu("det_s_train_steps", rec) else {
        return;
    };
    let mut cpu = RefExec::new(rec);
    for (p, v) in g.params.iter().zip(init_params(&arch, 7)) {
        exec.write_f32(p.value, &v).unwrap();
        cpu.write_f32(p.value, &v);
    }
    let mut rng = SplitMix64::new(15);
    let records = records_with_boxes(&mut rng, 2, 128, 2, &layout);
    exec.write_bytes(g.records, &records).unwrap();
    cpu.write_bytes(g.records, &records);
    let train = g.entry(ENTRY_TRAIN);
    let mut losses = Vec::new();
    for step in 1..=3u32 {
        let adam = AdamW {
            len: 1,
            lr: 1e-3,
            beta1: options.beta1,
            beta2: options.beta2,
            eps: options.eps,
            weight_decay: options.weight_decay,
            step,
        };
        let (c1, c2) = adam.bias_corrections();
        let hyper = [adam.lr, step as f32, c1, c2];
        exec.write_f32(g.hyper, &hyper).unwrap();
        cpu.write_f32(g.hyper, &hyper);
        exec.run(train).unwrap();
        cpu.run(train);
        let loss = read(&mut exec, g.loss, LOSS_LEN);
        close(
            &format!("loss of step {step}"),
            &loss,
            &cpu.read_f32(g.loss),
        );
        losses.push(loss[0]);
        // Every activation, target and gradient of the step, then the updated parameters
        // and AdamW moments.
        let n = compare_tensors(&format!("step {step}"), rec, &mut exec, &cpu, |_| true);
        assert_eq!(
            n,
            rec.tensors.len() - 3,
            "all but records, detections, counts"
        );
    }
    assert!(
        losses[2] < losses[0],
        "three steps on one batch lower its loss: {losses:?}"
    );

    // Evaluation and inference on the trained weights: the loss, and the detections as the
    // reference decodes the GPU's own output (decode compares logits exactly, so it is fed
    // the same numbers).
    let eval = g.entry(ENTRY_EVAL);
    exec.run(eval).unwrap();
    cpu.run(eval);
    close(
        "eval loss",
        &read(&mut exec, g.loss, LOSS_LEN),
        &cpu.read_f32(g.loss),
    );
    let infer = g.entry(ENTRY_INFER);
    exec.run(infer).unwrap();
    let pred = read(&mut exec, g.pred, rec.get(g.pred).len);
    cpu.run(infer);
    assert_close(
        "infer output",
        &pred,
        &cpu.read_f32(g.pred)
            .iter()
            .map(|&v| f64::from(v))
            .collect::<Vec<_>>(),
        MODEL_TOL,
    );
    let mut reference = RefExec::new(rec);
    reference.write_f32(g.pred, &pred);
    let decode_only = reference.rec.entry(
        "decode",
        vec![rec.entries[infer].steps.last().unwrap().clone()],
    );
    reference.run(decode_only);
    let (mut d, mut c) = (
        vec![0u8; rec.get(g.dets).len],
        vec![0u8; rec.get(g.counts).len],
    );
    exec.read_bytes(g.dets, &mut d).unwrap();
    exec.read_bytes(g.counts, &mut c).unwrap();
    let got = detections(&d, &c, &g.decode);
    let want = detections(
        &reference.read_bytes(g.dets),
        &reference.read_bytes(g.counts),
        &g.decode,
    );
    for (b, (got, want)) in got.iter().zip(&want).enumerate() {
        assert!(!got.is_empty(), "image {b}: detections");
        let classes = |v: &Vec<(u32, [f32; 5])>| v.iter().map(|d| d.0).collect::<Vec<_>>();
        assert_eq!(classes(got), classes(want), "image {b}: classes in order");
        let flat = |v: &Vec<(u32, [f32; 5])>| v.iter().flat_map(|d| d.1).collect::<Vec<_>>();
        close(&format!("image {b} detections"), &flat(got), &flat(want));
    }
    assert_clean(exec.engine());
}
