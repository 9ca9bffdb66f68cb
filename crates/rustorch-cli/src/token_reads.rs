//! Bytes a generated token reads from memory, for `bench`'s bandwidth
//! figures.
//!
//! A decode step multiplies its one row by every weight matrix, so it
//! reads the whole model once (the token embedding only for its one row,
//! unless the output product reuses it as its matrix), and it reads the
//! keys and values of every position it attends. That sum, times tokens
//! per second, is the memory traffic a generation needs at least; against
//! the machine's read bandwidth (`rustorch-cli membw`) it says how close
//! the speed is to its bound. Counted from the GGUF file's sizes, so the
//! figure is the same for any program running the same file (llama.cpp
//! included).

use rustorch::gguf::Gguf;
use rustorch_llm::model::ModelConfig;

/// Bytes per element of the key/value cache (f16, llama.cpp's default).
const CACHE_ELEMENT_BYTES: u64 = 2;

/// What one decode step reads.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenReads {
    /// Weight bytes read per step.
    pub weights: u64,
    /// Per layer: cache bytes per attended position, and the layer's
    /// sliding window (positions it attends at most), if it has one.
    layers: Vec<(u64, Option<usize>)>,
}

impl TokenReads {
    /// The reads of a model with `weights` bytes of weights read per step
    /// (`weight_bytes`) and configuration `cfg`.
    pub fn new(weights: u64, cfg: &ModelConfig) -> TokenReads {
        let per_position = (cfg.n_head_kv * (cfg.head_dim_k + cfg.head_dim_v)) as u64 * CACHE_ELEMENT_BYTES;
        let layers = (0..cfg.n_layer)
            .map(|il| (per_position, cfg.window_for_layer(il)))
            .collect();
        TokenReads { weights, layers }
    }

    /// Weight bytes a decode step of the model in `g` reads.
    pub fn weight_bytes(g: &Gguf) -> u64 {
        let mut weights = 0u64;
        let mut embedding = None;
        let mut tied = true;
        for t in g.tensors() {
            match t.name() {
                "token_embd.weight" => embedding = Some(t),
                "output.weight" => {
                    tied = false;
                    weights += t.n_bytes() as u64;
                }
                _ => weights += t.n_bytes() as u64,
            }
        }
        if let Some(e) = embedding {
            let rows = e.dims().iter().skip(1).product::<u64>().max(1);
            weights += if tied {
                e.n_bytes() as u64
            } else {
                e.n_bytes() as u64 / rows
            };
        }
        weights
    }

    /// Mean bytes read per token when generating `n` tokens after `depth`
    /// filled positions (the step at position p attends p + 1 positions,
    /// or its layer's window).
    pub fn mean_per_token(&self, n: usize, depth: usize) -> f64 {
        if n == 0 {
            return 0.0;
        }
        let cache: u64 = (depth..depth + n)
            .map(|p| {
                self.layers
                    .iter()
                    .map(|&(bytes, window)| bytes * window.map_or(p + 1, |w| (p + 1).min(w)) as u64)
                    .sum::<u64>()
            })
            .sum();
        self.weights as f64 + cache as f64 / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(weights: u64, layers: Vec<(u64, Option<usize>)>) -> TokenReads {
        TokenReads { weights, layers }
    }

    #[test]
    fn cache_reads_grow_with_position_and_stop_at_the_window() {
        let r = reads(1000, vec![(10, None), (10, Some(2))]);
        // Positions 0, 1, 2 attend 1, 2, 3 keys; the windowed layer at most 2.
        assert_eq!(r.mean_per_token(3, 0), 1000.0 + (10.0 * 6.0 + 10.0 * 5.0) / 3.0);
        // At depth 10, one step attends 11 positions (2 in the window).
        assert_eq!(r.mean_per_token(1, 10), 1000.0 + 110.0 + 20.0);
        assert_eq!(r.mean_per_token(0, 0), 0.0);
    }
}
