//! Each thread's own copy of the tensors that batch-1 separable pairs pass from one to the
//! next in bands of rows ([`super::separable::forward_bands`]).
//!
//! A band of rows of an NCHW tensor is a run of part of a plane in every channel: at two
//! threads, the threads' parts of a tensor alternate through memory every half plane. No
//! thread reads what another wrote (but for the rows at a band's edge), yet the cores'
//! prefetchers do: running on past the end of its own run in one plane, a core fetches the
//! start of the other's run, lines the other core has just written and must then fetch back.
//! det-s's separable pairs at two threads took 1.3–2.4× as long per band as one thread took
//! for the same band, and a test program on this VM showed the cause alone: two threads each
//! writing their half of every plane of a tensor, then the next, took 1.3× (64 × 64 planes)
//! to 2.3× (16 × 16) as long as one thread doing both halves, where two threads writing
//! each its own contiguous half took no longer.
//!
//! So where a banded pair writes a tensor that only banded pairs read ([`banded_tensors`]),
//! each part writes its band into a copy of its own: part 0 into the tensor itself, part `t`
//! into copy `t` of [`BandCopies`], which places it at the same offset in each of
//! `threads − 1` arenas laid out as the main one is, over these tensors alone. A part
//! addresses its copy exactly as the tensor ([`PartCopies::part`]). Before it reads such a
//! tensor, a part copies into its own copy the rows at its band's edge that other parts own
//! ([`pull_rows`]): the only floats that pass between the threads.
//!
//! Which part owns a row: the one whose [`part_range`] of the plane's rows, over the pool's
//! threads, holds it. Every banded kernel splits its output rows so.

use std::ops::Range;

use super::arena::Arena;
use super::scratch::part_range;
use crate::balance::MemoryPlan;
use crate::compute::recording::{Recording, TensorId};
use crate::compute::storage::ArenaPlan;

/// A kernel of an entry that reads and writes tensors band by band: the steps it runs, the
/// tensors it reads in bands and the one it writes so.
#[derive(Debug, Clone)]
pub(super) struct BandedKernel {
    pub steps: Range<usize>,
    pub reads: [Option<TensorId>; 2],
    pub writes: TensorId,
}

/// Per tensor of `rec`: whether, in entry `entry` whose banded kernels are `kernels`, it is
/// written by one of them and read by others only (so that each part may keep its band in a
/// copy of its own). Nothing else may touch it: no other step, the host, or another entry
/// before writing it ([`super::fusion::private`]).
pub(super) fn banded_tensors(rec: &Recording, entry: usize, kernels: &[BandedKernel]) -> Vec<bool> {
    let mut banded = vec![false; rec.tensors.len()];
    for k in kernels {
        let readers: Vec<&BandedKernel> = kernels
            .iter()
            .filter(|r| r.reads.contains(&Some(k.writes)))
            .collect();
        let steps: Vec<usize> = readers
            .iter()
            .flat_map(|r| r.steps.clone())
            .chain(k.steps.clone())
            .collect();
        banded[k.writes.index()] =
            !readers.is_empty() && super::fusion::private(rec, entry, k.writes, &steps);
    }
    banded
}

/// The copies of the banded tensors for parts `1..threads` (see the module docs).
#[derive(Debug)]
pub(super) struct BandCopies {
    /// Where each banded tensor sits in each copy.
    layout: ArenaPlan,
    /// `copies` arenas of `layout.len` floats, end to end.
    arena: Arena,
    copies: usize,
}

impl BandCopies {
    /// Copies for `threads − 1` parts of the tensors `tensors` marks (none where it marks
    /// none), those whose lifetimes never overlap at overlapping offsets (`kernels` as for
    /// [`ArenaPlan::shared`]).
    pub fn new(
        rec: &Recording,
        kernels: &dyn Fn(usize) -> Vec<bool>,
        tensors: &[bool],
        threads: usize,
    ) -> BandCopies {
        let layout = ArenaPlan::shared_among(rec, kernels, &|t| tensors[t.index()]);
        let copies = if tensors.contains(&true) {
            threads.saturating_sub(1)
        } else {
            0
        };
        BandCopies {
            arena: Arena::zeroed(layout.len * copies),
            layout,
            copies,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        4 * (self.layout.len * self.copies) as u64
    }

    pub fn add_to(&self, plan: &mut MemoryPlan) {
        if self.copies > 0 {
            plan.add(
                "cpu engine: band copies of batch-1 activations",
                self.copies as u64,
                4 * self.layout.len as u64,
            );
        }
    }

    /// Tensor `id` of `len` floats at `main`, as the parts of a banded kernel see it: banded
    /// (each part its own copy) where `banded`, else the one tensor for every part.
    pub fn view(&self, main: *mut f32, id: TensorId, len: usize, banded: bool) -> PartCopies {
        if !banded || self.copies == 0 {
            return PartCopies::single(main, len);
        }
        let at = self.layout.offset(id);
        PartCopies {
            main,
            replica: self.arena.at(at, len),
            step: self.layout.len,
            len,
        }
    }
}

/// A tensor as each part of a banded kernel sees it (see the module docs): part `t`'s copy
/// at [`PartCopies::part`].
#[derive(Debug, Clone, Copy)]
pub(super) struct PartCopies {
    /// The tensor: part 0's copy, and every part's where not banded.
    main: *mut f32,
    /// Part 1's copy, part `t`'s `(t − 1)·step` floats further; null where not banded.
    replica: *mut f32,
    step: usize,
    /// Floats of the tensor (and of each copy).
    pub len: usize,
}

// SAFETY: only pointers into memory that outlives the kernel call the value is made for;
// what keeps the parts' reads and writes through them apart is each use's own `unsafe`.
unsafe impl Send for PartCopies {}
// SAFETY: as for `Send`: the value itself is never written through `&`.
unsafe impl Sync for PartCopies {}

impl PartCopies {
    /// One tensor, not banded: every part's copy is the tensor.
    pub fn single(main: *mut f32, len: usize) -> PartCopies {
        PartCopies {
            main,
            replica: std::ptr::null_mut(),
            step: 0,
            len,
        }
    }

    /// A tensor only read, not banded: every part's copy is the tensor, and nothing writes
    /// through the view ([`pull_rows`] writes banded tensors only).
    pub fn reading(tensor: &[f32]) -> PartCopies {
        PartCopies::single(tensor.as_ptr().cast_mut(), tensor.len())
    }

    /// A tensor whose parts `1..` have copies at `replica`, `step` floats apart (for tests;
    /// the engine's come from [`BandCopies::view`]).
    #[cfg(test)]
    pub fn banded_at(main: *mut f32, replica: *mut f32, step: usize, len: usize) -> PartCopies {
        assert!(step >= len);
        PartCopies {
            main,
            replica,
            step,
            len,
        }
    }

    pub fn is_banded(&self) -> bool {
        !self.replica.is_null()
    }

    /// The first float of part `t`'s copy.
    pub fn part(&self, t: usize) -> *mut f32 {
        if t == 0 || !self.is_banded() {
            self.main
        } else {
            self.replica.wrapping_add((t - 1) * self.step)
        }
    }

    /// Part `t`'s copy, to read.
    ///
    /// # Safety
    /// Part `t`'s copy lives (and holds floats) for `'a`, and nothing writes it meanwhile.
    pub unsafe fn read<'a>(&self, t: usize) -> &'a [f32] {
        // SAFETY: the caller's promise; `len` floats is the copy's length.
        unsafe { std::slice::from_raw_parts(self.part(t), self.len) }
    }
}

/// Which of `parts` parts owns row `row` of a plane of `h` rows (see the module docs).
fn owner(h: usize, parts: usize, row: usize) -> usize {
    (0..parts)
        .find(|&u| part_range(h, parts, u).contains(&row))
        .unwrap_or_else(|| panic!("row {row} of a plane of {h}"))
}

/// Copies rows `rows` of planes `planes` (each `h × w`) of banded tensor `x` that parts other
/// than `t` own from their copies into part `t`'s, for a kernel whose part `t` then reads
/// those rows; does nothing where `x` is not banded.
///
/// # Safety
/// `x`'s copies hold `planes.end` planes of `h × w`; while this runs, no other part writes
/// the rows it owns in its copy (it may write rows it does not own, in its own copy), and
/// nothing but this part touches part `t`'s copy.
pub(super) unsafe fn pull_rows(
    x: &PartCopies,
    t: usize,
    parts: usize,
    planes: Range<usize>,
    (h, w): (usize, usize),
    rows: Range<usize>,
) {
    if !x.is_banded() {
        return;
    }
    assert!(planes.end * h * w <= x.len && rows.end <= h);
    let own = part_range(h, parts, t);
    let to = x.part(t);
    for row in rows.filter(|r| !own.contains(r)) {
        let from = x.part(owner(h, parts, row));
        for plane in planes.clone() {
            let at = plane * h * w + row * w;
            // SAFETY: `at + w ≤ planes.end·h·w ≤ len` (asserted above), inside both copies;
            // the row is the owner's, which no one writes now, and part `t`'s copy is this
            // part's alone (the caller's promise); the copies are distinct memory.
            unsafe { std::ptr::copy_nonoverlapping(from.add(at), to.add(at), w) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_has_one_owner_that_holds_it() {
        for h in [1, 2, 3, 7, 8, 64] {
            for parts in [1, 2, 3, 4, 16] {
                for row in 0..h {
                    assert!(part_range(h, parts, owner(h, parts, row)).contains(&row));
                }
            }
        }
    }

    /// Three parts, two planes of 6 × 2: each copy holds only its own rows (the others
    /// poisoned); after the pull, part 1's copy holds rows 1..5 of both planes, its own rows
    /// untouched, the rest still poisoned.
    #[test]
    fn a_pull_copies_the_rows_other_parts_own_and_nothing_else() {
        let (h, w, planes, parts) = (6, 2, 2, 3);
        let len = planes * h * w;
        let value = |plane: usize, row: usize, col: usize| (100 * plane + 10 * row + col) as f32;
        let mut copies = vec![f32::NAN; parts * len];
        for t in 0..parts {
            for plane in 0..planes {
                for row in part_range(h, parts, t) {
                    for col in 0..w {
                        copies[t * len + plane * h * w + row * w + col] = value(plane, row, col);
                    }
                }
            }
        }
        let base = copies.as_mut_ptr();
        let x = PartCopies::banded_at(base, base.wrapping_add(len), len, len);
        // SAFETY: three copies of `len` floats in `copies`; one thread.
        unsafe { pull_rows(&x, 1, parts, 0..planes, (h, w), 1..5) };
        for plane in 0..planes {
            for row in 0..h {
                for col in 0..w {
                    let got = copies[len + plane * h * w + row * w + col];
                    if (1..5).contains(&row) {
                        assert_eq!(got, value(plane, row, col), "plane {plane} row {row}");
                    } else {
                        assert!(got.is_nan(), "plane {plane} row {row} written");
                    }
                }
            }
        }
    }

    #[test]
    fn a_tensor_not_banded_is_the_same_for_every_part() {
        let mut v = vec![1.0f32; 8];
        let x = PartCopies::single(v.as_mut_ptr(), 8);
        assert!(!x.is_banded());
        assert_eq!(x.part(0), x.part(3));
        // SAFETY: `v` lives, and nothing writes it while the view is read.
        assert_eq!(unsafe { x.read(2) }, &v[..]);
    }
}
