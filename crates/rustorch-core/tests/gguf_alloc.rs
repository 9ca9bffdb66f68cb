//! The parser never allocates more than the file justifies: with a counting
//! allocator, parsing each malformed file (huge counts and lengths
//! included) and each valid one stays within a small multiple of its size.
//!
//! One test in this binary, so no other test allocates while it measures.

use rustorch_core::gguf::Gguf;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        LARGEST.fetch_max(layout.size(), Ordering::SeqCst);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn parsing_allocates_in_proportion_to_the_file() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf");
    let mut files = Vec::new();
    for dir in ["valid", "malformed"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "gguf") {
                files.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    assert!(files.len() > 50);
    let mut report = Vec::new();
    for (path, bytes) in &files {
        let base = LIVE.load(Ordering::SeqCst);
        PEAK.store(base, Ordering::SeqCst);
        LARGEST.store(0, Ordering::SeqCst);
        // `from_vec` skips the copy `from_bytes` makes, so only parsing counts.
        let result = Gguf::from_vec(bytes.clone());
        let peak = PEAK.load(Ordering::SeqCst) - base;
        let largest = LARGEST.load(Ordering::SeqCst);
        drop(result);
        // Typed arrays and strings cost a few times their encoded size at
        // most (a String is 24 bytes for 8 on disk), plus fixed overhead
        // (hash tables, error messages).
        let limit = 8 * bytes.len() + 16 * 1024;
        if peak > limit {
            report.push(format!(
                "{}: peak {peak} bytes, largest allocation {largest}, file {} bytes",
                path.display(),
                bytes.len()
            ));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}
