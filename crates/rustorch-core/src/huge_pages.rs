//! Transparent huge pages for large buffers that are streamed again and
//! again, such as a model's weights.
//!
//! A token's generation reads every weight once, hundreds of megabytes
//! from memory. With 4 KiB pages that is a TLB miss and a page walk every
//! 4 KiB; with 2 MiB pages, one every 2 MiB. Linux backs anonymous memory
//! with huge pages only where the program asks (`madvise(MADV_HUGEPAGE)`)
//! when transparent huge pages are in their common "madvise" mode; the
//! advice must come before the pages are first touched. Where the kernel
//! has no huge pages to give, or the advice fails, memory is as before:
//! the advice changes speed, never contents. `RUSTORCH_HUGEPAGES=0` turns
//! it off.

/// Asks for huge pages under the spare capacity of `buf` (call it on a
/// fresh `Vec::with_capacity`, before writing). Only the whole 2 MiB pages
/// inside the allocation are advised.
pub fn advise<T>(buf: &mut Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let bytes = buf.capacity() * std::mem::size_of::<T>();
        if bytes < HUGE || std::env::var("RUSTORCH_HUGEPAGES").is_ok_and(|v| v == "0") {
            return;
        }
        let start = buf.as_mut_ptr() as usize;
        let (first, end) = (start.next_multiple_of(HUGE), (start + bytes) / HUGE * HUGE);
        if end > first {
            // SAFETY: [first, end) lies inside the Vec's own allocation;
            // MADV_HUGEPAGE changes how the kernel backs those pages, not
            // their contents, and a failure is harmless (ignored).
            let _ = unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}
