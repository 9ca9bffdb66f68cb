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

/// Lets the allocator reuse freed activation buffers instead of returning
/// them to the system after every op. Call it once at the start of a
/// process that runs models (the CLI does).
///
/// By default glibc serves large blocks (up to a threshold that adapts,
/// from 128 KiB) with fresh mappings and trims the heap's free top after
/// each free: every op's output then costs page faults and the kernel
/// zeroing its pages again (~5% of Gemma 3's prompt processing). Raising
/// the mapping and trim thresholds keeps those pages for the next op; the
/// peak memory stays the same, as the same buffers are reused.
///
/// `RUSTORCH_MALLOC_DEFAULTS=1` leaves glibc's settings alone.
pub fn keep_freed_buffers() {
    if std::env::var_os("RUSTORCH_MALLOC_DEFAULTS").is_some_and(|v| v == "1") {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocation parameters; blocks
    // already allocated are unaffected.
    unsafe {
        // One arena for every thread: per-thread arenas each keep their own
        // freed blocks, and which of them a buffer lands in varies from run
        // to run (Gemma 3's peak moved between 289 and 306 MiB). Our
        // threads allocate per op and per row, not per element, so they
        // rarely wait for the shared arena.
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }
}
