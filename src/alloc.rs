//! The global allocator of the `lockstep` binary and of the benches that measure it: mimalloc, asked
//! through its plain entry points whenever the alignment asked for is one every block of theirs has.
//!
//! `mimalloc::MiMalloc` asks mimalloc for every allocation by its aligned entry point (`mi_malloc_aligned`). In
//! mimalloc 3 that entry point keeps its fast path only while the thread's page of the size class has a free
//! block; past that, a size that is not a power of two takes its over-allocating path, about 275 instructions a
//! call: 2.6 % of a 10 000-row simulator run's instructions went there (callgrind, 202 000 calls). The plain
//! `mi_malloc` gives every block the alignment of a machine word (its size classes are whole words), which is all
//! nearly every Rust allocation asks for, and its slow path is mimalloc's ordinary one. Allocation addresses never
//! reach a trace, so no run changes. The library itself sets no allocator: a user's own binary picks its own.

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc, mi_zalloc_aligned,
};
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// The largest alignment, in bytes, that every block of mimalloc's plain `mi_malloc` has: a machine word.
pub const PLAIN_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc as a global allocator: its plain entry points for alignments up to [`PLAIN_ALIGN`] bytes, its aligned
/// ones above. Use as `#[global_allocator] static ALLOCATOR: lockstep::alloc::Mimalloc = lockstep::alloc::Mimalloc;`.
pub struct Mimalloc;

// SAFETY: every pointer handed out comes from mimalloc with at least `layout.size()` bytes, aligned to
// `layout.align()` (by `PLAIN_ALIGN`'s guarantee or by the aligned entry point), and goes back to mimalloc's
// `mi_free` or `mi_realloc*`, which take blocks of either entry point.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocation functions take any size; the alignment is a power of two (`Layout`).
        unsafe {
            match layout.align() <= PLAIN_ALIGN {
                true => mi_malloc(layout.size()) as *mut u8,
                false => mi_malloc_aligned(layout.size(), layout.align()) as *mut u8,
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe {
            match layout.align() <= PLAIN_ALIGN {
                true => mi_zalloc(layout.size()) as *mut u8,
                false => mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8,
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc (the caller's contract).
        unsafe { mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the caller's contract); the block keeps its
        // alignment, which `PLAIN_ALIGN` or the aligned entry point gives.
        unsafe {
            match layout.align() <= PLAIN_ALIGN {
                true => mi_realloc(ptr as *mut c_void, new_size) as *mut u8,
                false => mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_have_the_alignment_asked_for() {
        for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in [align, align * 3, 24, 40, 1000, 1032, 5000, 70_000]
                .into_iter()
                .filter(|size: &usize| size.is_multiple_of(align))
            {
                let layout = Layout::from_size_align(size, align).expect("a valid layout");
                // SAFETY: a non-zero size; each block is written within its size, then freed once.
                unsafe {
                    let ptr = Mimalloc.alloc(layout);
                    assert!(
                        !ptr.is_null() && (ptr as usize).is_multiple_of(align),
                        "size {size} align {align}: {ptr:?}"
                    );
                    ptr.write_bytes(7, size);
                    let grown = Mimalloc.realloc(ptr, layout, size * 2);
                    assert!(
                        !grown.is_null() && (grown as usize).is_multiple_of(align),
                        "realloc of size {size} align {align}"
                    );
                    assert_eq!(*grown.add(size - 1), 7, "realloc keeps the contents");
                    Mimalloc.dealloc(grown, Layout::from_size_align(size * 2, align).expect("a valid layout"));
                    let zeroed = Mimalloc.alloc_zeroed(layout);
                    assert!(
                        (zeroed as usize).is_multiple_of(align) && *zeroed.add(size - 1) == 0,
                        "alloc_zeroed, size {size}"
                    );
                    Mimalloc.dealloc(zeroed, layout);
                }
            }
        }
    }
}
