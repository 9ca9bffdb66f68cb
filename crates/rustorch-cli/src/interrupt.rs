//! Ctrl-C in `chat`: during a reply it stops the reply; at the prompt the
//! first press shows a hint and the second exits (status 130, as a shell
//! reports a SIGINT).
//!
//! The SIGINT handler only touches atomics and calls `write` and `_exit`,
//! which are async-signal-safe. It is installed with SA_RESTART so that a
//! read of stdin interrupted at the prompt goes on waiting.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

static GENERATING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);
static AT_PROMPT_PRESSES: AtomicU32 = AtomicU32::new(0);

const HINT: &[u8] = b"\n(Ctrl-C again to exit, or Ctrl-D)\n> ";

#[cfg(unix)]
extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) {
        STOP.store(true, Ordering::SeqCst);
        return;
    }
    if AT_PROMPT_PRESSES.fetch_add(1, Ordering::SeqCst) >= 1 {
        // SAFETY: _exit is async-signal-safe and takes no pointers.
        unsafe { libc::_exit(130) };
    }
    // SAFETY: HINT is a static byte string valid for its whole length; write
    // is async-signal-safe. A failed write only loses the hint.
    unsafe {
        libc::write(1, HINT.as_ptr().cast(), HINT.len());
    }
}

/// Installs the handler (a no-op where there are no POSIX signals).
pub fn install() {
    #[cfg(unix)]
    // SAFETY: the sigaction struct is zeroed and then filled with a valid
    // handler address, an empty mask and flags; sigaction only reads it.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// A reply starts: Ctrl-C now stops it.
pub fn begin_reply() {
    STOP.store(false, Ordering::SeqCst);
    GENERATING.store(true, Ordering::SeqCst);
}

/// The reply is over: Ctrl-C now counts toward exiting.
pub fn end_reply() {
    GENERATING.store(false, Ordering::SeqCst);
    AT_PROMPT_PRESSES.store(0, Ordering::SeqCst);
}

/// Ctrl-C was pressed during the current reply.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// A line was read at the prompt: start counting presses again.
pub fn line_read() {
    AT_PROMPT_PRESSES.store(0, Ordering::SeqCst);
}
