//! The feed-forward blocks in chunks of rows (`FFN_CHUNK_ROWS`, taken when
//! a micro-batch's gate and up products would be too large for the memory
//! budget) give the bits of one batch. The benchmark models now take their
//! micro-batches whole, so the chunks are forced here with
//! `RUSTORCH_FFN_CHUNK`, which `Model::forward` reads once per process:
//! this binary holds this one test, which sets it before any forward pass.

#[path = "common/llamacpp.rs"]
mod llamacpp;

use rustorch_llm::model::{Logits, Model};

/// `n` token ids from a fixed xorshift sequence.
fn tokens(model: &Model, n: usize) -> Vec<u32> {
    let n_vocab = model.config().n_vocab as u64;
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n_vocab) as u32
        })
        .collect()
}

/// 302 positions: micro-batches of 256 and 46, the first one's feed-forward
/// in chunks of 128 and 128 (every product on the batched path it takes
/// for the whole prompt), against `forward_inspect`'s one batch.
#[test]
fn feed_forward_chunks_give_the_one_batch_bits() {
    std::env::set_var("RUSTORCH_FFN_CHUNK", "128");
    for (id, which) in [("smollm2-q4_1", Logits::All), ("gemma3-q4_k_m", Logits::Last)] {
        let path = llamacpp::model_path(id);
        let model = Model::load(&path).expect("the model loads");
        let toks = tokens(&model, 302);
        let run = |split: bool| -> Vec<f32> {
            let mut cache = model.new_cache(toks.len()).unwrap();
            let t = if split {
                model.forward(&mut cache, &toks, which).unwrap()
            } else {
                model
                    .forward_inspect(&mut cache, &toks, which, &mut |_, _, _| Ok(()))
                    .unwrap()
            };
            t.to_vec::<f32>().unwrap()
        };
        let (split, whole) = (run(true), run(false));
        assert_eq!(split.len(), whole.len());
        let differ = split
            .iter()
            .zip(&whole)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ, 0,
            "{id}: {differ} logits differ between feed-forward chunks and one batch"
        );
    }
}
