//! Row copies ([`RowCopy`]): the gather of a multi-scale head's levels into one output, and
//! the scatter of its gradient back.

use crate::compute::ops::RowCopy;

/// Copies `op.rows` rows of `op.len` floats from `src` to `dst` at their strides and offsets;
/// nothing else of `dst` is written.
pub fn row_copy(op: &RowCopy, src: &[f32], dst: &mut [f32]) {
    assert!(
        src.len() >= op.src_len() && dst.len() >= op.dst_len(),
        "copy: short tensors"
    );
    let len = op.len as usize;
    for r in 0..op.rows as usize {
        let s = op.src_offset as usize + r * op.src_stride as usize;
        let d = op.dst_offset as usize + r * op.dst_stride as usize;
        dst[d..d + len].copy_from_slice(&src[s..s + len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_then_scatter_round_trips_and_leaves_the_rest() {
        // Two rows of 3 from a packed source into the middle of rows of 5, and back.
        let gather = RowCopy::gather(2, 3, 5, 1, 10);
        let src = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut dst = [-1.0; 10];
        row_copy(&gather, &src, &mut dst);
        assert!(
            RowCopy::gather(2, 3, 5, 3, 10).validate().is_err(),
            "a row past the end"
        );
        assert!(RowCopy::gather(2, 3, 5, 2, 10).validate().is_ok());
        assert_eq!(dst, [-1.0, 1.0, 2.0, 3.0, -1.0, -1.0, 4.0, 5.0, 6.0, -1.0]);
        assert!(!gather.writes_whole());
        let scatter = gather.reversed();
        assert!(scatter.writes_whole());
        let mut back = [0.0; 6];
        row_copy(&scatter, &dst, &mut back);
        assert_eq!(back, src);
    }
}
