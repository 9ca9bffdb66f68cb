//! A global allocator that keeps freed small and mid-sized blocks per
//! thread for reuse, in front of the system allocator.
//!
//! A decode step runs hundreds of small ops. Each allocates a few dozen
//! small blocks (shapes, strides, the executor's lists: SmolLM2's 576-float
//! add makes 33 of 16-127 bytes) and an output of a few kilobytes, and
//! frees them again. glibc's per-thread cache keeps 7 blocks per size and
//! none above 1032 bytes (before 2.42): the rest of each burst of frees goes
//! through `_int_free` into the shared bins, the next allocations through
//! `_int_malloc`, and a kilobyte-sized request consolidates the fast bins
//! first. In a profile of that add, half of the op's time was in glibc.
//! Here a freed block goes onto a per-thread list of its size class (its
//! first word links the list) and the next request of that class takes it
//! back: a pop or a push, no locks, no merging. The add went from about
//! 1.0 to 0.7 us (`cargo run --release -p rustorch-cpu --example op_cost`
//! against `--example op_cost_block_cache`).
//!
//! Classes: 16-byte steps up to 1 KiB (up to `SMALL_DEPTH` blocks each),
//! 256-byte steps up to 64 KiB (up to `MID_DEPTH` each); larger blocks and
//! alignments above 16 go straight to the system. A thread keeps at most
//! `THREAD_BUDGET` bytes (beyond it, frees go to the system at once); this
//! is memory glibc would keep in its bins anyway, so peak memory does not
//! grow. Blocks in a thread's lists when it exits are not returned (rayon's
//! workers and the main thread live as long as the process).
//!
//! Opt in from a binary (rustorch-cli does):
//! `#[global_allocator] static A: rustorch_core::block_cache::BlockCache = rustorch_core::block_cache::BlockCache;`

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;

/// Small classes: 16-byte steps from 16 to `SMALL_MAX` bytes.
const SMALL_STEP: usize = 16;
const SMALL_MAX: usize = 1024;
const SMALL_CLASSES: usize = SMALL_MAX / SMALL_STEP;
/// Mid classes: 256-byte steps above `SMALL_MAX` up to `MID_MAX` bytes.
const MID_STEP: usize = 256;
const MID_MAX: usize = 64 * 1024;
const MID_CLASSES: usize = (MID_MAX - SMALL_MAX) / MID_STEP;
const CLASSES: usize = SMALL_CLASSES + MID_CLASSES;
/// Blocks kept per small class: more than one op's burst of frees.
const SMALL_DEPTH: u16 = 64;
/// Blocks kept per mid class (a few live outputs of one size).
const MID_DEPTH: u16 = 4;
/// Bytes kept per thread, all classes together.
const THREAD_BUDGET: usize = 256 * 1024;
/// The alignment of every block the system's malloc returns (x86-64 and
/// AArch64 glibc, musl, macOS): cached layouts may not ask for more.
const BLOCK_ALIGN: usize = 16;

/// A thread's free lists: per class the head of a list linked through each
/// block's first word, and its length.
struct Lists {
    heads: [*mut u8; CLASSES],
    counts: [u16; CLASSES],
    bytes: usize,
}

thread_local! {
    // A const initializer and no `Drop`: no lazy registration and no
    // allocation on first use, so the allocator may touch it.
    static LISTS: UnsafeCell<Lists> = const {
        UnsafeCell::new(Lists {
            heads: [ptr::null_mut(); CLASSES],
            counts: [0; CLASSES],
            bytes: 0,
        })
    };
}

/// The allocator (see the module's comment).
pub struct BlockCache;

/// A cached request's class: its index, its blocks' size, how many blocks
/// the class keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Class {
    index: usize,
    block: usize,
    depth: u16,
}

#[inline]
fn class_of(layout: Layout) -> Option<Class> {
    let size = layout.size();
    if size == 0 || size > MID_MAX || layout.align() > BLOCK_ALIGN {
        return None;
    }
    Some(if size <= SMALL_MAX {
        let index = (size - 1) / SMALL_STEP;
        Class {
            index,
            block: (index + 1) * SMALL_STEP,
            depth: SMALL_DEPTH,
        }
    } else {
        let k = (size - SMALL_MAX - 1) / MID_STEP;
        Class {
            index: SMALL_CLASSES + k,
            block: SMALL_MAX + (k + 1) * MID_STEP,
            depth: MID_DEPTH,
        }
    })
}

/// The layout a class's blocks are allocated from the system with.
#[inline]
fn block_layout(c: Class) -> Layout {
    // SAFETY: a nonzero size below isize::MAX and a power-of-two alignment.
    unsafe { Layout::from_size_align_unchecked(c.block, BLOCK_ALIGN) }
}

/// Pops a block of class `c` from this thread's list (null when empty).
#[inline]
fn pop(c: Class) -> *mut u8 {
    LISTS
        .try_with(|l| {
            // SAFETY: the lists are this thread's own and nothing below
            // re-enters the allocator while they are borrowed.
            let l = unsafe { &mut *l.get() };
            let p = l.heads[c.index];
            if !p.is_null() {
                // SAFETY: a listed block is free, at least 16 bytes, 16-byte
                // aligned, and its first word holds the next block.
                l.heads[c.index] = unsafe { *(p as *mut *mut u8) };
                l.counts[c.index] -= 1;
                l.bytes -= c.block;
            }
            p
        })
        .unwrap_or(ptr::null_mut())
}

/// Pushes block `p` of class `c` onto this thread's list if there is room;
/// whether it did.
#[inline]
fn push(p: *mut u8, c: Class) -> bool {
    LISTS
        .try_with(|l| {
            // SAFETY: as in `pop`.
            let l = unsafe { &mut *l.get() };
            if l.counts[c.index] >= c.depth || l.bytes + c.block > THREAD_BUDGET {
                return false;
            }
            // SAFETY: the caller gave up `p`, a block of at least 16 bytes
            // aligned to 16: its first word may hold the link.
            unsafe { *(p as *mut *mut u8) = l.heads[c.index] };
            l.heads[c.index] = p;
            l.counts[c.index] += 1;
            l.bytes += c.block;
            true
        })
        .unwrap_or(false)
}

// SAFETY: every block handed out for a cached layout has its class's size
// (at least `layout.size()`) and malloc's 16-byte alignment (at least
// `layout.align()`), and is owned by exactly one place: its user, or one
// thread's free list. Layouts outside the cached range go to the system
// allocator unchanged, and `dealloc` sees the same layout `alloc` saw, so
// each block returns to the allocator that made it.
unsafe impl GlobalAlloc for BlockCache {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match class_of(layout) {
            Some(c) => {
                let p = pop(c);
                if !p.is_null() {
                    return p;
                }
                // SAFETY: a valid nonzero layout.
                unsafe { System.alloc(block_layout(c)) }
            }
            // SAFETY: forwarded as given.
            None => unsafe { System.alloc(layout) },
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match class_of(layout) {
            Some(c) => {
                let p = pop(c);
                if !p.is_null() {
                    // SAFETY: the block holds at least `layout.size()` bytes.
                    unsafe { ptr::write_bytes(p, 0, layout.size()) };
                    return p;
                }
                // SAFETY: a valid nonzero layout.
                unsafe { System.alloc_zeroed(block_layout(c)) }
            }
            // SAFETY: forwarded as given.
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        match class_of(layout) {
            Some(c) => {
                if !push(p, c) {
                    // SAFETY: `p` came from `System.alloc*` with this layout.
                    unsafe { System.dealloc(p, block_layout(c)) }
                }
            }
            // SAFETY: `p` came from the system allocator with `layout`.
            None => unsafe { System.dealloc(p, layout) },
        }
    }

    #[inline]
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` is valid for this alignment.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class_of(layout), class_of(new_layout)) {
            // Both outside the cached range: the system's realloc (which
            // may resize in place).
            // SAFETY: `p` came from the system allocator with `layout`.
            (None, None) => unsafe { System.realloc(p, layout, new_size) },
            // The same class: the block already fits.
            (Some(a), Some(b)) if a == b => p,
            _ => {
                // SAFETY: `new_layout` is valid; both blocks hold at least
                // the bytes copied; `p` is given up only once copied.
                unsafe {
                    let q = self.alloc(new_layout);
                    if !q.is_null() {
                        ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                        self.dealloc(p, layout);
                    }
                    q
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(size: usize) -> Layout {
        Layout::from_size_align(size, 8).unwrap()
    }

    #[test]
    fn classes_cover_the_range_in_steps() {
        let block = |s| class_of(l(s)).map(|c| (c.index, c.block));
        assert_eq!(block(0), None);
        assert_eq!(block(1), Some((0, 16)));
        assert_eq!(block(16), Some((0, 16)));
        assert_eq!(block(17), Some((1, 32)));
        assert_eq!(block(1024), Some((SMALL_CLASSES - 1, 1024)));
        assert_eq!(block(1025), Some((SMALL_CLASSES, 1280)));
        assert_eq!(block(2304), Some((SMALL_CLASSES + 4, 2304)));
        assert_eq!(block(MID_MAX), Some((CLASSES - 1, MID_MAX)));
        assert_eq!(block(MID_MAX + 1), None);
        assert_eq!(class_of(Layout::from_size_align(4096, 64).unwrap()), None);
        // Every size maps to a class whose blocks hold it, in increasing order.
        let mut last = 0;
        for s in 1..=MID_MAX {
            let c = class_of(l(s)).unwrap();
            assert!(c.block >= s && c.index >= last && c.index < CLASSES, "{s}: {c:?}");
            last = c.index;
        }
    }

    #[test]
    fn blocks_are_reused_zeroed_and_resized() {
        let a = BlockCache;
        unsafe {
            let p = a.alloc(l(3000));
            assert!(!p.is_null());
            ptr::write_bytes(p, 0xAB, 3000);
            a.dealloc(p, l(3000));
            // The same class gives the same block back, zeroed when asked.
            let q = a.alloc_zeroed(l(2900));
            assert_eq!(q, p);
            assert!((0..2900).all(|i| *q.add(i) == 0));
            ptr::write_bytes(q, 7, 2900);
            // Growing out of the cached range keeps the contents.
            let r = a.realloc(q, l(2900), 100_000);
            assert!((0..2900).all(|i| *r.add(i) == 7));
            // Shrinking into it too, and within one class nothing moves.
            let s = a.realloc(r, l(100_000), 40);
            assert!((0..40).all(|i| *s.add(i) == 7));
            assert_eq!(a.realloc(s, l(40), 48), s);
            a.dealloc(s, l(48));
            // Small blocks: a burst of frees is taken back in reverse order.
            let small: Vec<*mut u8> = (0..20).map(|_| a.alloc(l(24))).collect();
            for &b in &small {
                a.dealloc(b, l(24));
            }
            let again: Vec<*mut u8> = (0..20).map(|_| a.alloc(l(24))).collect();
            assert!(again.iter().rev().eq(small.iter()));
            for &b in &again {
                a.dealloc(b, l(24));
            }
        }
    }

    #[test]
    fn lists_stay_within_their_bounds() {
        let a = BlockCache;
        let big = Layout::from_size_align(MID_MAX, 16).unwrap();
        let c = class_of(big).unwrap();
        unsafe {
            let blocks: Vec<*mut u8> = (0..16).map(|_| a.alloc(big)).collect();
            for &p in &blocks {
                a.dealloc(p, big);
            }
            LISTS.with(|lists| {
                let lists = &*lists.get();
                assert!(lists.bytes <= THREAD_BUDGET);
                assert_eq!(lists.counts[c.index], MID_DEPTH);
            });
            // Emptied again for the other tests on this thread.
            for _ in 0..MID_DEPTH {
                System.dealloc(a.alloc(big), block_layout(c));
            }
        }
    }
}
