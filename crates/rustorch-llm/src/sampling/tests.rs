//! Internal consistency of the fast paths; agreement with llama.cpp is in tests/sampling.rs.

use super::*;
use crate::sampling::candidates;
use rustorch::rng::Rng;

fn random_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| (r.normal_pair().0 * 3.0) as f32).collect()
}

fn random_logits_scaled(n: usize, scale: f64, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| (r.normal_pair().0 * scale) as f32).collect()
}

fn ids(c: &Candidates) -> Vec<u32> {
    c.as_slice().iter().map(|d| d.id).collect()
}

/// Reference: every candidate sorted by (logit desc, id asc), first k.
fn sorted_ref(logits: &[f32], k: usize) -> Vec<u32> {
    let mut v: Vec<(f32, u32)> = logits.iter().enumerate().map(|(i, &l)| (l, i as u32)).collect();
    v.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    v.into_iter().take(k).map(|x| x.1).collect()
}

#[test]
fn top_k_paths_agree_with_a_full_sort() {
    // The heap path (k * 16 < n), the select path and k >= n, with ties (rounded logits).
    for (n, k) in [(5000, 40), (5000, 1), (5000, 400), (5000, 5000), (100, 7), (3, 10)] {
        let logits: Vec<f32> = random_logits(n, n as u64 + k as u64)
            .iter()
            .map(|x| (x * 4.0).round() / 4.0)
            .collect();
        let mut c = Candidates::from_logits(&logits);
        c.top_k(k as i32);
        assert_eq!(ids(&c), sorted_ref(&logits, k), "n {n} k {k}");
        assert!(c.is_sorted());
    }
}

#[test]
fn top_p_large_unsorted_matches_sorted_input() {
    // n > 1024 unsorted takes llama.cpp's adaptive path (best 256 first, then the rest).
    for p in [0.1f32, 0.5, 0.95, 0.999_999] {
        let logits: Vec<f32> = random_logits(3000, 7).iter().map(|x| x * 0.3).collect();
        let mut a = Candidates::from_logits(&logits);
        a.top_p(p, 0);
        // The same candidates sorted beforehand (softmax sums in sorted order there, so the
        // probabilities may differ in the last bits; the kept set must agree).
        let mut b = Candidates::from_logits(&logits);
        b.top_k(3000);
        b.top_p(p, 0);
        assert_eq!(ids(&a), ids(&b), "p {p}");
        // Reference in f64: the smallest sorted prefix reaching p.
        let order = sorted_ref(&logits, 3000);
        let max = logits.iter().fold(f64::MIN, |m, &l| m.max(l as f64));
        let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        let mut cum = 0.0;
        let n_ref = order
            .iter()
            .position(|&id| {
                cum += (logits[id as usize] as f64 - max).exp() / z;
                cum >= p as f64
            })
            .map_or(3000, |i| i + 1);
        // f32 vs f64 sums can differ by ~1e-6 relative, moving the cut by one token at most.
        assert!(
            (a.len() as i64 - n_ref as i64).abs() <= 1,
            "p {p}: {} vs {n_ref}",
            a.len()
        );
    }
}

#[test]
fn min_keep_is_honoured() {
    let logits = random_logits(500, 3);
    let mut c = Candidates::from_logits(&logits);
    c.top_p(0.01, 25);
    assert_eq!(c.len(), 25);
    let mut c = Candidates::from_logits(&logits);
    c.min_p(0.999, 30);
    assert_eq!(ids(&c), sorted_ref(&logits, 30));
}

#[test]
fn penalty_paths_agree() {
    let logits = random_logits(1000, 11);
    let hist = [5u32, 7, 5, 999, 3, 5, 7, 2000];
    let mut a = Candidates::from_logits(&logits);
    a.penalties(&hist, 1.3, 0.2, 0.5);
    let mut b = Candidates::from_data(
        Candidates::from_logits(&logits)
            .as_slice()
            .iter()
            .rev()
            .copied()
            .collect(),
    );
    b.penalties(&hist, 1.3, 0.2, 0.5);
    let mut bs: Vec<TokenData> = b.as_slice().to_vec();
    bs.reverse();
    assert_eq!(a.as_slice(), &bs[..]);
    // Token 5: seen 3 times. llama.cpp: l / 1.3 (l > 0) or l * 1.3, then - (3 * 0.2 + 0.5).
    let l = logits[5];
    let want = if l <= 0.0 { l * 1.3 } else { l / 1.3 } - (3.0 * 0.2 + 0.5);
    assert_eq!(a.as_slice()[5].logit, want);
    assert_eq!(a.as_slice()[6].logit, logits[6]);
}

#[test]
fn config_validation_and_errors() {
    assert!(Sampler::new(SamplerConfig {
        temperature: f32::NAN,
        ..Default::default()
    })
    .is_err());
    assert!(Sampler::new(SamplerConfig {
        repeat_penalty: 0.0,
        ..Default::default()
    })
    .is_err());
    assert!(Sampler::new(SamplerConfig {
        repeat_last_n: -2,
        ..Default::default()
    })
    .is_err());
    let mut s = Sampler::new(SamplerConfig::default()).unwrap();
    assert!(s.sample(&[], &[]).is_err());
    assert!(s
        .sample(&[1.0, f32::NAN], &[])
        .unwrap_err()
        .to_string()
        .contains("token 1"));
    assert!(s.sample(&[f32::NEG_INFINITY; 3], &[]).is_err());
    // -inf logits alongside finite ones are fine (masked tokens).
    assert_eq!(s.sample(&[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY], &[]).unwrap(), 1);
}

#[test]
fn fill_top_k_equals_fill_penalties_top_k() {
    // With ties (rounded logits), penalties that lower and raise logits (negative presence),
    // window ids at chunk edges and beyond the vocabulary.
    for (n, k, seed) in [
        (5000usize, 40usize, 1u64),
        (5000, 1, 2),
        (3000, 100, 3),
        (130, 8, 4),
        (64, 64, 5),
    ] {
        let logits: Vec<f32> = random_logits_scaled(n, 3.0, seed)
            .iter()
            .map(|x| (x * 2.0).round() / 2.0)
            .collect();
        let hist: Vec<u32> = [0u32, 63, 64, 127, 128, 5, 5, 5, (n - 1) as u32, n as u32 + 10]
            .into_iter()
            .collect();
        for (rep, freq, present) in [(1.3f32, 0.1f32, 0.2f32), (0.7, 0.0, -2.0), (1.0, 0.0, 0.0)] {
            let mut a = Candidates::from_logits(&logits);
            a.penalties(&hist, rep, freq, present);
            a.top_k(k as i32);
            let overrides: Vec<(u32, f32)> = candidates::window_counts(&hist)
                .into_iter()
                .filter(|&(id, _)| (id as usize) < n)
                .map(|(id, c)| (id, candidates::penalized(logits[id as usize], c, rep, freq, present)))
                .collect();
            let mut b = Candidates::default();
            b.fill_top_k(&logits, k, &overrides);
            assert_eq!(
                a.as_slice(),
                b.as_slice(),
                "n {n} k {k} penalties {rep} {freq} {present}"
            );
        }
    }
}

#[test]
fn sampler_fast_path_equals_the_step_by_step_chain() {
    // Sampler::sample fuses penalties and top-k on large vocabularies; the tokens must be those
    // of the plain chain of Candidates steps with the same generator.
    let cfg = SamplerConfig {
        seed: Some(9),
        repeat_penalty: 1.2,
        frequency_penalty: 0.1,
        presence_penalty: 0.3,
        repeat_last_n: 16,
        ..Default::default()
    };
    let mut s = Sampler::new(cfg.clone()).unwrap();
    let mut rng = Mt19937::new(9);
    let mut hist: Vec<u32> = vec![];
    for step in 0..40 {
        let logits = random_logits_scaled(4000, 2.0, 100 + step);
        let got = s.sample(&logits, &hist).unwrap();
        let window = &hist[hist.len().saturating_sub(16)..];
        let mut c = Candidates::from_logits(&logits);
        c.penalties(window, cfg.repeat_penalty, cfg.frequency_penalty, cfg.presence_penalty);
        c.top_k(cfg.top_k);
        c.top_p(cfg.top_p, 0);
        c.min_p(cfg.min_p, 0);
        c.temperature(cfg.temperature);
        let i = c.dist(&mut rng).unwrap();
        assert_eq!(got, c.as_slice()[i].id, "step {step}");
        // Repeat a few tokens so penalties matter.
        hist.push(if step % 3 == 0 { 7 } else { got });
    }
}

#[test]
fn top_p_geometric_prefix_sort_keeps_order() {
    // A flat distribution over 20000 tokens: top-p 0.95 keeps most of them, so the sorted
    // prefix grows several times; the result must be the fully sorted prefix.
    let logits = random_logits_scaled(20_000, 0.3, 21);
    let mut c = Candidates::from_logits(&logits);
    c.top_p(0.95, 0);
    let want = sorted_ref(&logits, c.len());
    assert_eq!(ids(&c), want);
    assert!(c.len() > 10_000, "{}", c.len());
}
