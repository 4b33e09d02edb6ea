//! The residual add and gradient accumulation ([`Add`]).

use crate::compute::ops::Add;

/// `out = a + b`.
pub fn add(op: &Add, a: &[f32], b: &[f32], out: &mut [f32]) {
    let n = op.len as usize;
    assert!(
        a.len() >= n && b.len() >= n && out.len() >= n,
        "add: tensors shorter than {n}"
    );
    for ((o, x), y) in out[..n].iter_mut().zip(&a[..n]).zip(&b[..n]) {
        *o = x + y;
    }
}

/// `dst += src`.
pub fn add_assign(op: &Add, dst: &mut [f32], src: &[f32]) {
    let n = op.len as usize;
    assert!(
        dst.len() >= n && src.len() >= n,
        "add_assign: tensors shorter than {n}"
    );
    for (d, s) in dst[..n].iter_mut().zip(&src[..n]) {
        *d += s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_and_accumulates_only_len_elements() {
        let op = Add { len: 3 };
        let mut out = [9.0; 4];
        add(&op, &[1.0, 2.0, 3.0, 4.0], &[0.5, -2.0, 1.0, 4.0], &mut out);
        assert_eq!(out, [1.5, 0.0, 4.0, 9.0]);
        add_assign(&op, &mut out, &[1.0, 1.0, 1.0, 1.0]);
        assert_eq!(out, [2.5, 1.0, 5.0, 9.0]);
    }
}
