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
//! the machine, never sped up by it. The matrix-vector kernels prefetch
//! their weights ahead of the loads, which on a server core reads faster
//! than the hardware prefetchers alone (the device host: 17 GB/s plain on
//! two cores against 23 GB/s from TinyLlama Q8_0's generation), so passes
//! also run with software prefetches into L2 at several distances, and
//! the best of all of them is the bound.

use crate::team;
use rayon::prelude::*;
use rustorch_core::error::{Error, Result};
use std::time::Instant;

/// One measurement: the best pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadBandwidth {
    /// Bytes read per pass.
    pub bytes: usize,
    /// Passes timed per prefetch distance (after one untimed pass each).
    pub passes: usize,
    /// The threads that read (the team's, i.e. rayon's pool).
    pub threads: usize,
    /// The best pass's bytes per second.
    pub bytes_per_s: f64,
    /// The software prefetch distance of the best pass, in bytes (0: the
    /// hardware prefetchers alone).
    pub prefetch_ahead: usize,
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
/// MiB) `passes` times per prefetch distance with the threads of rayon's
/// pool and returns the best pass. The buffer is allocated here and freed before returning;
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
    rustorch_core::huge_pages::advise(&mut buf);
    buf.resize(words, 0);
    // Distinct values, written in parallel: pages of zeros could be shared
    // copy-on-write mappings of the zero page, which read from no DRAM.
    buf.par_chunks_mut(RUN_WORDS).enumerate().for_each(|(r, run)| {
        for (i, w) in run.iter_mut().enumerate() {
            *w = (r * RUN_WORDS + i) as u64;
        }
    });
    let threads = rayon::current_num_threads();
    let mut best = f64::INFINITY;
    let mut best_ahead = 0;
    let mut checksum = 0u64;
    team::run_team(|| {
        for ahead in PREFETCH_AHEAD {
            for pass in 0..=passes {
                let total = std::sync::atomic::AtomicU64::new(0);
                let start = Instant::now();
                team::for_each(runs, |r| {
                    let s = sum_run(&buf[r * RUN_WORDS..(r + 1) * RUN_WORDS], ahead);
                    total.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
                });
                let secs = start.elapsed().as_secs_f64();
                checksum = checksum.wrapping_add(total.into_inner());
                if pass > 0 && secs < best {
                    best = secs;
                    best_ahead = ahead;
                }
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
        prefetch_ahead: best_ahead,
    })
}

/// Software prefetch distances tried, in bytes ahead of the loads (0: the
/// hardware prefetchers alone). The matvec kernels use 16 KiB and more.
const PREFETCH_AHEAD: [usize; 4] = [0, 4 << 10, 16 << 10, 64 << 10];

/// The wrapping sum of a run, each cache line prefetched into L2 `ahead`
/// bytes before it is read (none when 0 or where the CPU has no AVX2).
fn sum_run(words: &[u64], ahead: usize) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { x86::sum_prefetching(words, ahead) };
    }
    let _ = ahead;
    sum_words(words)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `sum_words` with 32-byte loads, two per cache line, and one
    /// prefetch into L2 per line `ahead` bytes on (none when 0).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum_prefetching(words: &[u64], ahead: usize) -> u64 {
        let lines = words.len() / 8;
        let p = words.as_ptr();
        let (mut a, mut b, mut c, mut d) = (
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
        );
        let mut i = 0;
        while i + 2 <= lines {
            // SAFETY: lines i and i + 1 lie inside `words`; a prefetch of
            // an address past the end is only a hint (it never faults).
            unsafe {
                let l = p.add(i * 8);
                if ahead > 0 {
                    _mm_prefetch::<_MM_HINT_T1>(l.cast::<i8>().wrapping_add(ahead));
                    _mm_prefetch::<_MM_HINT_T1>(l.cast::<i8>().wrapping_add(ahead + 64));
                }
                a = _mm256_add_epi64(a, _mm256_loadu_si256(l.cast()));
                b = _mm256_add_epi64(b, _mm256_loadu_si256(l.add(4).cast()));
                c = _mm256_add_epi64(c, _mm256_loadu_si256(l.add(8).cast()));
                d = _mm256_add_epi64(d, _mm256_loadu_si256(l.add(12).cast()));
            }
            i += 2;
        }
        let mut lanes = [0u64; 4];
        let sum = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
        // SAFETY: `lanes` holds four u64.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum) };
        let tail = super::sum_words(&words[i * 8..]);
        lanes.iter().fold(tail, |s, v| s.wrapping_add(*v))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_word() {
        let words: Vec<u64> = (0..1003).collect();
        assert_eq!(sum_words(&words), 1002 * 1003 / 2);
        assert_eq!(sum_words(&[]), 0);
        assert_eq!(sum_words(&[u64::MAX, 2]), 1);
        for n in [0, 7, 8, 16, 17, 1003] {
            for ahead in PREFETCH_AHEAD {
                assert_eq!(sum_run(&words[..n], ahead), sum_words(&words[..n]), "{n} {ahead}");
            }
        }
        assert_eq!(sum_run(&[u64::MAX; 40], 4096), 40u64.wrapping_mul(u64::MAX));
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
