//! Token sampling as llama.cpp's `common_sampler` does it, and stop strings.
//!
//! [`Sampler::sample`] runs llama.cpp's default chain on a logits row: penalties, top-k,
//! top-p, min-p, temperature, then a seeded draw (`dist`). Each step is llama.cpp's own
//! definition (see [`Candidates`]), and the draw uses the same generator (`std::mt19937`,
//! libstdc++'s `uniform_real_distribution<double>`), so a seed picks the same tokens as
//! llama.cpp with that seed. llama.cpp's other samplers (DRY, typical-p, XTC, top-n-sigma,
//! mirostat) are off by default there and not implemented here.
//!
//! ```
//! use rustorch_llm::sampling::{Sampler, SamplerConfig};
//!
//! let mut s = Sampler::new(SamplerConfig { seed: Some(42), ..SamplerConfig::default() })?;
//! let logits = [0.5f32, 3.0, 2.5, -1.0];
//! let tok = s.sample(&logits, &[])?;
//! assert_ne!(tok, 3); // top-p 0.95 drops the least likely token
//!
//! let mut greedy = Sampler::new(SamplerConfig::greedy())?;
//! assert_eq!(greedy.sample(&logits, &[])?, 1);
//! # Ok::<(), rustorch_llm::LlmError>(())
//! ```

mod candidates;
mod mt19937;
mod stop;

pub use candidates::{Candidates, TokenData};
pub use mt19937::Mt19937;
pub use stop::{StopMatcher, StopOutput};

use crate::error::{LlmError, Result};

/// Sampling settings; [`Default`] is llama.cpp's `common_params_sampling` defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Logits are divided by this; `<= 0` samples greedily (argmax). Default 0.8.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; `<= 0` keeps all. Default 40.
    pub top_k: i32,
    /// Keep the most likely tokens whose probabilities sum to `top_p`; `>= 1` keeps all.
    /// Default 0.95.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `<= 0` keeps all.
    /// Default 0.05.
    pub min_p: f32,
    /// top-p and min-p keep at least this many tokens. Default 0.
    pub min_keep: usize,
    /// Divide the (positive) logits of recently seen tokens by this; 1 disables. Default 1.0.
    pub repeat_penalty: f32,
    /// How many of the last history tokens the penalties look at; 0 disables them, -1 means
    /// the whole history. Default 64.
    pub repeat_last_n: i32,
    /// Subtracted once from the logit of every token seen in the window. Default 0.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per occurrence in the window. Default 0.
    pub frequency_penalty: f32,
    /// Seed of the draw; `None` picks a random seed (llama.cpp's `LLAMA_DEFAULT_SEED`),
    /// reported by [`Sampler::seed`].
    pub seed: Option<u32>,
}

impl Default for SamplerConfig {
    fn default() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            min_keep: 0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding: always the most likely token (after penalties).
    pub fn greedy() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.0,
            seed: Some(0),
            ..SamplerConfig::default()
        }
    }

    /// Checks that every setting is a number the chain can use.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(LlmError::BadSamplerConfig { field, reason });
        for (field, v) in [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !v.is_finite() {
                return bad(field, format!("{v} is not a finite number"));
            }
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad(
                "repeat_penalty",
                format!("{} must be a positive number", self.repeat_penalty),
            );
        }
        if self.repeat_last_n < -1 {
            return bad(
                "repeat_last_n",
                format!("{} must be >= 0, or -1 for the whole history", self.repeat_last_n),
            );
        }
        Ok(())
    }
}

/// A random seed for `seed: None` (llama.cpp uses `std::random_device`): the standard
/// library's per-process random hash keys mixed with the clock.
fn random_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    let x = h.finish();
    (x ^ (x >> 32)) as u32
}

/// The largest logit and whether any is NaN, in one pass. Eight independent lanes (NaN
/// compares false, so it never becomes a lane's max) let the compiler use vector max/compare.
fn max_and_nan(logits: &[f32]) -> (f32, bool) {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut nan = [false; 8];
    let mut chunks = logits.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            m[j] = if c[j] > m[j] { c[j] } else { m[j] };
            nan[j] |= c[j].is_nan();
        }
    }
    let mut max = m.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    let mut any_nan = nan.iter().any(|&b| b);
    for &l in chunks.remainder() {
        max = if l > max { l } else { max };
        any_nan |= l.is_nan();
    }
    (max, any_nan)
}

/// A sampler: the chain of [`SamplerConfig`] with its random state.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplerConfig,
    seed: u32,
    rng: Mt19937,
    cand: Candidates,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Result<Sampler> {
        config.validate()?;
        let seed = config.seed.unwrap_or_else(random_seed);
        Ok(Sampler {
            config,
            seed,
            rng: Mt19937::new(seed),
            cand: Candidates::default(),
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// The seed in use (the random one when the config had none).
    pub fn seed(&self) -> u32 {
        self.seed
    }

    /// Restarts the random stream from the seed.
    pub fn reset(&mut self) {
        self.rng = Mt19937::new(self.seed);
    }

    /// The candidates after the last [`Sampler::sample`]: the survivors of the chain with their
    /// final probabilities (after a greedy sample: the chosen token only, no probability).
    pub fn candidates(&self) -> &Candidates {
        &self.cand
    }

    /// Picks the next token from a logits row (one logit per vocabulary id). `history` is the
    /// tokens so far (prompt and generated, as the caller wants them penalized); penalties look
    /// at its last `repeat_last_n`.
    ///
    /// Errors: empty logits, a NaN logit, or no logit above -inf.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(LlmError::Sampling("empty logits row".into()));
        }
        if u32::try_from(logits.len()).is_err() {
            return Err(LlmError::Sampling(format!(
                "{} logits do not fit u32 token ids",
                logits.len()
            )));
        }
        let (max, any_nan) = max_and_nan(logits);
        if any_nan {
            let i = logits.iter().position(|l| l.is_nan()).expect("a NaN was seen");
            return Err(LlmError::Sampling(format!("logit of token {i} is NaN")));
        }
        if max == f32::NEG_INFINITY {
            return Err(LlmError::Sampling("every logit is -inf".into()));
        }
        let c = &self.config;
        let window = match c.repeat_last_n {
            0 => &history[history.len()..],
            n if n < 0 => history,
            n => &history[history.len().saturating_sub(n as usize)..],
        };
        let penalties_on =
            !window.is_empty() && (c.repeat_penalty != 1.0 || c.frequency_penalty != 0.0 || c.presence_penalty != 0.0);
        // Penalized logits of the window's tokens, by id (at most repeat_last_n of them).
        let overrides: Vec<(u32, f32)> = if penalties_on {
            candidates::window_counts(window)
                .into_iter()
                .filter(|&(id, _)| (id as usize) < logits.len())
                .map(|(id, n)| {
                    let l = candidates::penalized(
                        logits[id as usize],
                        n,
                        c.repeat_penalty,
                        c.frequency_penalty,
                        c.presence_penalty,
                    );
                    (id, l)
                })
                .collect()
        } else {
            Vec::new()
        };
        if c.temperature <= 0.0 {
            // llama.cpp's chain with temp <= 0 still ends in `dist`, which draws one number:
            // draw it too, so the stream stays aligned with llama.cpp's. The best candidate by
            // (logit, lowest id) is llama_sampler_greedy's first maximum.
            self.rng.uniform();
            self.cand.fill_top_k(logits, 1, &overrides);
            return Ok(self.cand.as_slice()[0].id);
        }
        let n = logits.len();
        if c.top_k > 0 && (c.top_k as usize).saturating_mul(16) < n {
            // The common case on a large vocabulary: penalties and top-k in one pass.
            self.cand.fill_top_k(logits, c.top_k as usize, &overrides);
        } else {
            self.cand.fill(logits);
            self.cand
                .penalties(window, c.repeat_penalty, c.frequency_penalty, c.presence_penalty);
            self.cand.top_k(c.top_k);
        }
        self.cand.top_p(c.top_p, c.min_keep);
        self.cand.min_p(c.min_p, c.min_keep);
        self.cand.temperature(c.temperature);
        let i = self
            .cand
            .dist(&mut self.rng)
            .ok_or_else(|| LlmError::Sampling("no candidate survived the sampler chain".into()))?;
        Ok(self.cand.as_slice()[i].id)
    }
}

#[cfg(test)]
mod tests;
