//! Each thread's own copy of the tensors that batch-1 kernels split in bands of rows pass
//! from one to the next (the stem, the separable pairs of [`super::separable::forward_bands`],
//! the pointwise convs and the upsampling add of [`super::banded`]).
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
//! So where a banded kernel writes a tensor that only banded kernels read ([`banded_tensors`]),
//! each part writes its band into a copy of its own: part 0 into the tensor itself, part `t`
//! into copy `t` of [`BandCopies`], which places it at the same offset in each of
//! `threads − 1` arenas laid out as the main one is, over these tensors alone. A part
//! addresses its copy exactly as the tensor ([`PartCopies::part`]). Before it reads such a
//! tensor, a part copies into its own copy the rows at its band's edge that other parts own
//! ([`pull_rows`]): the only floats that pass between the threads.
//!
//! Those rows pass through an edge buffer of their own: each part, having written its band,
//! copies there its band's first row where a part comes before it and its last where one
//! comes after ([`publish_edges`]), and the parts that need them read them from there. Read
//! from the owner's copy instead, in every plane, they had dragged the lines beside them (the
//! owner's own rows, which it reads next) to the other core too: with that, the depthwise
//! convs of det-s's 8 × 8 planes took 2.4× as long as without the pull.
//!
//! Which part owns a row: the one whose [`part_range`] of the plane's rows, over the pool's
//! threads, holds it. Every banded kernel splits its output rows so.

use std::ops::Range;

use super::arena::Arena;
use super::scratch::part_range;
use crate::base::MemoryPlan;
use crate::compute::recording::{Recording, TensorId};
use crate::compute::storage::ArenaPlan;

/// A kernel of an entry that reads and writes tensors band by band: the steps it runs, the
/// tensors it reads in bands and the one it writes so.
#[derive(Debug, Clone)]
pub(super) struct BandedKernel {
    pub steps: Range<usize>,
    pub reads: [Option<TensorId>; 2],
    pub writes: TensorId,
    /// Rows of the planes of the tensor it writes.
    pub rows: usize,
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

/// The copies of the banded tensors for parts `1..threads`, and every part's edge rows of
/// them (see the module docs).
#[derive(Debug)]
pub(super) struct BandCopies {
    /// Where each banded tensor sits in each copy.
    layout: ArenaPlan,
    /// `copies` arenas of `layout.len` floats, end to end.
    arena: Arena,
    copies: usize,
    /// Per tensor: where its edge rows start in `edges` (`None`: it has none).
    edge_at: Vec<Option<usize>>,
    edges: Arena,
    /// Floats in `edges`.
    edges_len: usize,
}

impl BandCopies {
    /// Copies for `threads − 1` parts of the tensors `rows` gives the planes' heights of
    /// (none where it gives none), those whose lifetimes never overlap at overlapping offsets
    /// (`kernels` as for [`ArenaPlan::shared`]), and edge rows for each of `threads` parts.
    pub fn new(
        rec: &Recording,
        kernels: &dyn Fn(usize) -> Vec<bool>,
        rows: &[Option<usize>],
        threads: usize,
    ) -> BandCopies {
        let (layout, copies, edge_at, edges) = Self::plan(rec, kernels, rows, threads);
        BandCopies {
            arena: Arena::zeroed(layout.len * copies),
            layout,
            copies,
            edge_at,
            edges: Arena::zeroed(edges),
            edges_len: edges,
        }
    }

    /// The copies' layout and count, and each tensor's edge rows' offset and their floats in
    /// all (see [`BandCopies::new`]).
    fn plan(
        rec: &Recording,
        kernels: &dyn Fn(usize) -> Vec<bool>,
        rows: &[Option<usize>],
        threads: usize,
    ) -> (ArenaPlan, usize, Vec<Option<usize>>, usize) {
        let layout = ArenaPlan::shared_among(rec, kernels, &|t| rows[t.index()].is_some());
        let copies = if rows.iter().any(Option::is_some) {
            threads.saturating_sub(1)
        } else {
            0
        };
        let mut edges = 0;
        let edge_at = rows
            .iter()
            .zip(&rec.tensors)
            .map(|(h, t)| {
                h.filter(|_| copies > 0).map(|h| {
                    let at = edges;
                    // First and last row of each part's band, every plane: 2·threads rows
                    // of len / h floats, on a line of their own.
                    edges += (2 * threads * t.len / h).next_multiple_of(16);
                    at
                })
            })
            .collect();
        (layout, copies, edge_at, edges)
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        4 * (self.layout.len * self.copies + self.edges_len) as u64
    }

    /// Adds what [`BandCopies::new`] would allocate for the same arguments to `plan`.
    pub fn add_planned(
        rec: &Recording,
        kernels: &dyn Fn(usize) -> Vec<bool>,
        rows: &[Option<usize>],
        threads: usize,
        plan: &mut MemoryPlan,
    ) {
        let (layout, copies, _, edges) = Self::plan(rec, kernels, rows, threads);
        if copies > 0 {
            plan.add(
                "cpu engine: band copies of batch-1 activations",
                copies as u64,
                4 * layout.len as u64,
            );
            plan.add(
                "cpu engine: band edge rows of batch-1 activations",
                1,
                4 * edges as u64,
            );
        }
    }

    /// Tensor `id` of `len` floats at `main`, as the parts of a banded kernel see it: banded
    /// (each part its own copy) where `banded`, else the one tensor for every part.
    pub fn view(&self, main: *mut f32, id: TensorId, len: usize, banded: bool) -> PartCopies {
        let edge_at = self.edge_at[id.index()];
        let (true, Some(edge_at)) = (banded && self.copies > 0, edge_at) else {
            return PartCopies::single(main, len);
        };
        let at = self.layout.offset(id);
        PartCopies {
            main,
            replica: self.arena.at(at, len),
            step: self.layout.len,
            edges: self.edges.at(edge_at, 0),
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
    /// The parts' edge rows ([`publish_edges`]); null where not banded.
    edges: *mut f32,
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
            edges: std::ptr::null_mut(),
            len,
        }
    }

    /// A tensor written, not banded: every part's copy is the tensor.
    pub fn writing(tensor: &mut [f32]) -> PartCopies {
        PartCopies::single(tensor.as_mut_ptr(), tensor.len())
    }

    /// A tensor only read, not banded: every part's copy is the tensor, and nothing writes
    /// through the view ([`pull_rows`] writes banded tensors only).
    pub fn reading(tensor: &[f32]) -> PartCopies {
        PartCopies::single(tensor.as_ptr().cast_mut(), tensor.len())
    }

    /// A tensor whose parts `1..` have copies at `replica`, `step` floats apart, and edge
    /// rows at `edges` (for tests; the engine's come from [`BandCopies::view`]).
    #[cfg(test)]
    pub fn banded_at(
        main: *mut f32,
        replica: *mut f32,
        step: usize,
        edges: *mut f32,
        len: usize,
    ) -> PartCopies {
        assert!(step >= len);
        PartCopies {
            main,
            replica,
            step,
            edges,
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

/// Part `t`'s edge row `side` (0: its band's first row, 1: its last) of every plane of a
/// tensor of `h`-row planes: `len / h` floats.
fn edge(x: &PartCopies, t: usize, side: usize, h: usize) -> *mut f32 {
    x.edges.wrapping_add((2 * t + side) * (x.len / h))
}

/// Copies part `t`'s band's first row (where a part comes before it) and last row (where
/// one comes after it) of planes `planes` (each `h × w`) of banded tensor `x` from its copy
/// to its edge rows, for the parts that read them next
/// ([`pull_rows`]); does nothing where `x` is not banded. Part `t` calls it having written
/// its band of those planes.
///
/// # Safety
/// `x`'s copies hold `planes.end` planes of `h × w`; part `t`'s band of them in its copy was
/// written and is not written while this runs; nothing but part `t` touches its edge rows
/// meanwhile.
pub(super) unsafe fn publish_edges(
    x: &PartCopies,
    t: usize,
    parts: usize,
    planes: Range<usize>,
    (h, w): (usize, usize),
) {
    let own = part_range(h, parts, t);
    if !x.is_banded() || own.is_empty() {
        return;
    }
    assert!(x.len.is_multiple_of(h * w) && planes.end * h * w <= x.len);
    let from = x.part(t);
    // The first row only where a part above could need it, the last where one below could.
    let sides = [(t > 0, 0, own.start), (t + 1 < parts, 1, own.end - 1)];
    for (_, side, row) in sides.into_iter().filter(|s| s.0) {
        let to = edge(x, t, side, h);
        for plane in planes.clone() {
            // SAFETY: row `row` of every plane lies inside the copy, and its edge rows hold
            // `planes · w` floats (`BandCopies::plan`); the caller's promise keeps them apart
            // from every other access.
            unsafe {
                std::ptr::copy_nonoverlapping(from.add((plane * h + row) * w), to.add(plane * w), w)
            };
        }
    }
}

/// Copies rows `rows` of planes `planes` (each `h × w`) of banded tensor `x` that parts other
/// than `t` own into part `t`'s copy, for a kernel whose part `t` then reads those rows, from
/// their owners' edge rows ([`publish_edges`]) where the owner published them, else from
/// the owner's copy; does nothing where `x` is not banded.
///
/// # Safety
/// `x`'s copies hold `planes.end` planes of `h × w`, and every part published its edge rows
/// after writing its band; while this runs, no part writes the rows it owns, in its copy or
/// its edge rows (it may write rows it does not own, in its own copy), and nothing but this
/// part touches part `t`'s copy.
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
    assert!(x.len.is_multiple_of(h * w) && planes.end * h * w <= x.len && rows.end <= h);
    let own = part_range(h, parts, t);
    let to = x.part(t);
    for row in rows.filter(|r| !own.contains(r)) {
        let owner = owner(h, parts, row);
        let band = part_range(h, parts, owner);
        // Where row `row` of plane p lies in what it is read from: the owner's edge rows
        // where it published this one (its last row for the parts after it, its first for
        // those before), else its copy.
        let published = (owner < t && row == band.end - 1) || (owner > t && row == band.start);
        let (from, at): (*const f32, &dyn Fn(usize) -> usize) = if published {
            (edge(x, owner, usize::from(owner < t), h), &|p| p * w)
        } else {
            (x.part(owner), &|p| (p * h + row) * w)
        };
        for plane in planes.clone() {
            // SAFETY: `at(plane) + w` lies inside the owner's edge rows or copy (their sizes,
            // asserted above and in `BandCopies::plan`), and row `row` of the plane inside
            // part `t`'s copy; the owner does not write the row now, and part `t`'s copy is
            // this part's alone (the caller's promise); the two are distinct memory.
            unsafe {
                std::ptr::copy_nonoverlapping(from.add(at(plane)), to.add((plane * h + row) * w), w)
            };
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

    /// Part `t` of `parts` pulls rows `rows` of two planes of `h × 2` whose copies each hold
    /// only their own rows (the others poisoned) and whose parts have published their edge
    /// rows (and then had the rows they published for part `t` poisoned in their copies, so
    /// that only the edge rows can give them): part `t`'s copy then holds rows `rows` of both
    /// planes, its own rows untouched, the rest still poisoned.
    fn check_pull(h: usize, parts: usize, t: usize, rows: Range<usize>) {
        let (w, planes) = (2, 2);
        let len = planes * h * w;
        let value = |plane: usize, row: usize, col: usize| (100 * plane + 10 * row + col) as f32;
        let at = |u: usize, plane: usize, row: usize| u * len + (plane * h + row) * w;
        let mut copies = vec![f32::NAN; parts * len];
        for u in 0..parts {
            for plane in 0..planes {
                for row in part_range(h, parts, u) {
                    for col in 0..w {
                        copies[at(u, plane, row) + col] = value(plane, row, col);
                    }
                }
            }
        }
        let mut edges = vec![f32::NAN; 2 * parts * len / h];
        let base = copies.as_mut_ptr();
        let x = PartCopies::banded_at(base, base.wrapping_add(len), len, edges.as_mut_ptr(), len);
        for u in 0..parts {
            // SAFETY: `parts` copies of `len` floats in `copies`, their edge rows in
            // `edges`; one thread.
            unsafe { publish_edges(&x, u, parts, 0..planes, (h, w)) };
        }
        for u in (0..parts).filter(|&u| u != t) {
            // The row part `u` published for part `t`: its last one for the parts after it,
            // its first for those before.
            let band = part_range(h, parts, u);
            let published = if u < t {
                band.last()
            } else {
                band.clone().next()
            };
            if let Some(row) = published {
                for plane in 0..planes {
                    copies[at(u, plane, row)] = -1.0;
                }
            }
        }
        // SAFETY: as above.
        unsafe { pull_rows(&x, t, parts, 0..planes, (h, w), rows.clone()) };
        for plane in 0..planes {
            for row in 0..h {
                for col in 0..w {
                    let got = copies[at(t, plane, row) + col];
                    let mine = part_range(h, parts, t).contains(&row);
                    if mine || rows.contains(&row) {
                        assert_eq!(got, value(plane, row, col), "plane {plane} row {row}");
                    } else {
                        assert!(got.is_nan(), "plane {plane} row {row} written");
                    }
                }
            }
        }
    }

    #[test]
    fn a_pull_copies_the_rows_other_parts_own_and_nothing_else() {
        // Rows 1 and 4: part 0's last and part 2's first, from their edge rows.
        check_pull(6, 3, 1, 1..5);
        // Rows 0 and 1 of part 0's band 0..3 (not published for a part after it: from its
        // copy) and row 2 (its last, from its edge rows); part 1 of 4 pulling from parts 0, 2
        // and 3.
        check_pull(6, 2, 1, 0..6);
        check_pull(7, 4, 1, 0..7);
        // A band of one row, its first and last at once; a part with no rows pulls nothing.
        check_pull(3, 3, 1, 0..3);
        check_pull(2, 3, 2, 0..0);
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
