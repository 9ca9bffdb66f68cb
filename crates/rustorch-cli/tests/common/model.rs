//! Small llama-architecture models with deterministic pseudo-random weights,
//! written with RusTorch's GGUF writer. The quantization fixtures were made
//! by running llama.cpp's `llama-quantize` on exactly these files
//! (tools/gen_quantize_fixtures.py writes them through the `quant_input`
//! example), so the tests can rebuild the inputs instead of committing them.

use rustorch::gguf::GgufWriter;
use rustorch::quant::{quantize, QType};

/// The shape and storage of one test model.
pub struct Spec {
    pub name: &'static str,
    pub n_layer: usize,
    pub dim: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// Whether `output.weight` is left out (the token embeddings double as
    /// the output matrix).
    pub tied: bool,
    /// Type of the 2-D weights.
    pub weight_type: QType,
    /// Type of `token_embd.weight`.
    pub embd_type: QType,
}

/// The models of the committed fixtures:
/// - `gqa8`: 8 layers, rows of 256 and 512 (whole K-quant blocks), 4 query
///   heads per kv head, F16 weights, separate output matrix; exercises the
///   layer- and GQA-dependent rules.
/// - `tiny_tied`: rows of 64 and 176 (not whole K-quant blocks; 176 is not
///   even whole 32-blocks), F32 weights with BF16 embeddings, tied
///   embeddings; exercises every fallback.
pub const SPECS: [Spec; 2] = [
    Spec {
        name: "gqa8",
        n_layer: 8,
        dim: 256,
        n_head: 8,
        n_head_kv: 2,
        ffn: 512,
        vocab: 320,
        tied: false,
        weight_type: QType::F16,
        embd_type: QType::F16,
    },
    Spec {
        name: "tiny_tied",
        n_layer: 2,
        dim: 64,
        n_head: 4,
        n_head_kv: 2,
        ffn: 176,
        vocab: 96,
        tied: true,
        weight_type: QType::F32,
        embd_type: QType::BF16,
    },
];

/// SplitMix64: tiny, fast, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), from the top 24 bits (exact in f32).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    /// Weights of scale `std` with occasional outliers (1 in 64 is 8x
    /// larger), which matter to the quantizers' scale searches.
    fn weights(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let big = self.next().is_multiple_of(64);
                self.unit() * std * if big { 8.0 } else { 1.0 }
            })
            .collect()
    }
}

fn add(w: &mut GgufWriter<'static>, name: &str, qtype: QType, shape: &[usize], data: &[f32]) {
    let bytes = quantize(qtype, data).expect("F32/F16/BF16 encode any length");
    w.add_tensor_bytes(name, qtype, shape, bytes)
        .expect("shapes are consistent");
}

/// The GGUF file of `spec`.
pub fn build(spec: &Spec) -> Vec<u8> {
    let mut rng = Rng(0x5eed_0000 + spec.n_layer as u64 * 1000 + spec.dim as u64);
    let mut w = GgufWriter::new();
    let arch = "llama";
    let meta = |w: &mut GgufWriter<'static>, k: &str, v: u32| {
        w.add_metadata(format!("{arch}.{k}"), v).expect("fresh key");
    };
    w.add_metadata("general.architecture", arch).expect("fresh key");
    w.add_metadata("general.name", format!("rustorch-test-{}", spec.name))
        .expect("fresh key");
    meta(&mut w, "context_length", 256);
    meta(&mut w, "embedding_length", spec.dim as u32);
    meta(&mut w, "block_count", spec.n_layer as u32);
    meta(&mut w, "feed_forward_length", spec.ffn as u32);
    meta(&mut w, "attention.head_count", spec.n_head as u32);
    meta(&mut w, "attention.head_count_kv", spec.n_head_kv as u32);
    meta(&mut w, "rope.dimension_count", (spec.dim / spec.n_head) as u32);
    w.add_metadata(format!("{arch}.rope.freq_base"), 10000.0f32)
        .expect("fresh key");
    w.add_metadata(format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-5f32)
        .expect("fresh key");
    let file_type = if spec.weight_type == QType::F32 { 0u32 } else { 1 };
    w.add_metadata("general.file_type", file_type).expect("fresh key");
    meta(&mut w, "vocab_size", spec.vocab as u32);
    let tokens: Vec<String> = (0..spec.vocab).map(|i| format!("tok{i}")).collect();
    w.add_metadata("tokenizer.ggml.model", "llama").expect("fresh key");
    w.add_metadata("tokenizer.ggml.tokens", tokens).expect("fresh key");
    let scores: Vec<f32> = (0..spec.vocab).map(|i| -(i as f32)).collect();
    w.add_metadata("tokenizer.ggml.scores", scores).expect("fresh key");

    let (d, hd) = (spec.dim, spec.dim / spec.n_head);
    let kvd = hd * spec.n_head_kv;
    let wt = spec.weight_type;
    let mut mat = |w: &mut GgufWriter<'static>, name: &str, qtype: QType, rows: usize, cols: usize| {
        let data = rng.weights(rows * cols, 0.05);
        add(w, name, qtype, &[rows, cols], &data);
    };
    mat(&mut w, "token_embd.weight", spec.embd_type, spec.vocab, d);
    for l in 0..spec.n_layer {
        let p = format!("blk.{l}.");
        let ones: Vec<f32> = (0..d).map(|i| 1.0 + (i % 7) as f32 / 64.0).collect();
        add(&mut w, &format!("{p}attn_norm.weight"), QType::F32, &[d], &ones);
        mat(&mut w, &format!("{p}attn_q.weight"), wt, d, d);
        mat(&mut w, &format!("{p}attn_k.weight"), wt, kvd, d);
        mat(&mut w, &format!("{p}attn_v.weight"), wt, kvd, d);
        mat(&mut w, &format!("{p}attn_output.weight"), wt, d, d);
        add(&mut w, &format!("{p}ffn_norm.weight"), QType::F32, &[d], &ones);
        mat(&mut w, &format!("{p}ffn_gate.weight"), wt, spec.ffn, d);
        mat(&mut w, &format!("{p}ffn_up.weight"), wt, spec.ffn, d);
        mat(&mut w, &format!("{p}ffn_down.weight"), wt, d, spec.ffn);
    }
    let ones: Vec<f32> = vec![1.0; d];
    add(&mut w, "output_norm.weight", QType::F32, &[d], &ones);
    if !spec.tied {
        mat(&mut w, "output.weight", wt, spec.vocab, d);
    }
    w.to_bytes()
}
