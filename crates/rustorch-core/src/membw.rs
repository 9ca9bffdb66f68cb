//! The machine's memory read bandwidth, measured the way token generation
//! reads a model's weights.
//!
//! Generating a token streams every weight once from memory, so its speed
//! is bounded by how fast the cores in use can read DRAM. Issue 5 asks what
//! fraction of that bound a generation reaches; this measures the bound on
//! the same threads and pages the weights use: one buffer far larger than
//! the caches, on huge pages where the kernel gives them (as the loader
//! asks for the weights, `huge_pages::advise`), read through the thread
//! team in the runs a matrix-vector product claims (`team::for_each`).
//! The best of several passes counts: a pass is slowed by other work on
//! the machine, never sped up by it.

use crate::error::{Error, Result};
use crate::team;
use std::time::Instant;

/// One measurement: the best pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadBandwidth {
    /// Bytes read per pass.
    pub bytes: usize,
    /// Passes timed (after one untimed pass that warms the TLB and pages).
    pub passes: usize,
    /// The threads that read (the team's, i.e. rayon's pool).
    pub threads: usize,
    /// The best pass's bytes per second.
    pub bytes_per_s: f64,
}

impl ReadBandwidth {
    /// Bandwidth in GB/s (10^9 bytes per second, as STREAM reports it).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes_per_s / 1e9
    }
}

/// Words summed per claimed run: 1 MiB, so that a claim's counter traffic
/// is negligible beside its reads and the prefetchers stream long runs.
const RUN_WORDS: usize = 1 << 17;

/// Reads a fresh buffer of `bytes` (rounded down to whole MiB, at least 1
/// MiB) `passes` times with the threads of rayon's pool and returns the
/// best pass. The buffer is allocated here and freed before returning;
/// a size the system cannot give is an error, not an abort.
pub fn measure_read_bandwidth(bytes: usize, passes: usize) -> Result<ReadBandwidth> {
    const OP: &str = "read_bandwidth";
    let runs = bytes / (RUN_WORDS * 8);
    if runs == 0 {
        return Err(Error::invalid(
            OP,
            format!("{bytes} bytes: the buffer must be at least 1 MiB"),
        ));
    }
    if passes == 0 {
        return Err(Error::invalid(OP, "at least one pass is needed"));
    }
    let words = runs * RUN_WORDS;
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(words)
        .map_err(|e| Error::invalid(OP, format!("cannot allocate {} MiB: {e}", (words * 8) >> 20)))?;
    crate::huge_pages::advise(&mut buf);
    buf.resize(words, 0);
    // Distinct values, written in parallel: pages of zeros could be shared
    // copy-on-write mappings of the zero page, which read from no DRAM.
    {
        let base = SendPtr(buf.as_mut_ptr());
        team::run_team(|| {
            team::for_each(runs, |r| {
                // SAFETY: run r owns words [r * RUN_WORDS, (r + 1) * RUN_WORDS)
                // of the buffer, disjoint from every other run's.
                let run = unsafe { std::slice::from_raw_parts_mut(base.get().add(r * RUN_WORDS), RUN_WORDS) };
                for (i, w) in run.iter_mut().enumerate() {
                    *w = (r * RUN_WORDS + i) as u64;
                }
            })
        });
    }
    let threads = rayon::current_num_threads();
    let mut best = f64::INFINITY;
    let mut checksum = 0u64;
    team::run_team(|| {
        for pass in 0..=passes {
            let total = std::sync::atomic::AtomicU64::new(0);
            let start = Instant::now();
            team::for_each(runs, |r| {
                let s = sum_words(&buf[r * RUN_WORDS..(r + 1) * RUN_WORDS]);
                total.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
            });
            let secs = start.elapsed().as_secs_f64();
            checksum = checksum.wrapping_add(total.into_inner());
            if pass > 0 {
                best = best.min(secs);
            }
        }
    });
    // The sums are used, so no pass can be optimized away.
    std::hint::black_box(checksum);
    Ok(ReadBandwidth {
        bytes: words * 8,
        passes,
        threads,
        bytes_per_s: (words * 8) as f64 / best,
    })
}

/// The wrapping sum of `words`, over eight independent accumulators so
/// that the adds keep up with the loads at any vector width.
fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        for (a, w) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*w);
        }
    }
    let tail = chunks.remainder().iter().fold(0u64, |a, w| a.wrapping_add(*w));
    acc.iter().fold(tail, |a, w| a.wrapping_add(*w))
}

/// A raw pointer that the fill's tasks share; each writes its own run.
#[derive(Clone, Copy)]
struct SendPtr(*mut u64);
// SAFETY: the tasks holding it write disjoint runs of one live buffer.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_word() {
        let words: Vec<u64> = (0..1003).collect();
        assert_eq!(sum_words(&words), 1002 * 1003 / 2);
        assert_eq!(sum_words(&[]), 0);
        assert_eq!(sum_words(&[u64::MAX, 2]), 1);
    }

    #[test]
    fn measures_a_positive_rate_and_rejects_bad_sizes() {
        let bw = measure_read_bandwidth(8 << 20, 2).unwrap();
        assert_eq!(bw.bytes, 8 << 20);
        assert_eq!(bw.passes, 2);
        assert!(bw.bytes_per_s.is_finite() && bw.bytes_per_s > 0.0, "{bw:?}");
        assert!(measure_read_bandwidth(1 << 19, 2).is_err());
        assert!(measure_read_bandwidth(8 << 20, 0).is_err());
        // More than any machine has: an error, not an abort.
        assert!(measure_read_bandwidth(usize::MAX / 2, 1).is_err());
    }
}
