//! Returning freed heap memory to the system during model loading.

/// Gives the heap pages freed so far back to the system.
///
/// glibc keeps freed small blocks resident for reuse. The parsed metadata the
/// loader frees before copying the weights is a quarter of a million small
/// strings for Gemma 3; left resident, it would count toward peak memory
/// (issue 5 budgets file + KV cache + 15%). Other allocators and systems
/// return memory on their own terms, so this does nothing there.
pub(crate) fn return_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of glibc's arenas; it
    // touches no allocation in use and may be called at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
