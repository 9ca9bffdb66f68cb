//! `Model::forward` splits a long prompt into micro-batches of positions
//! (`UBATCH_ROWS`), and where needed each micro-batch's feed-forward blocks
//! into chunks of rows (`FFN_CHUNK_ROWS`; tests/ffn_chunks.rs), to bound
//! activation memory;
//! `Model::forward_inspect` sends the whole prompt as one batch. Both must
//! give the same bits (model/forward.rs): every product takes the batched
//! path it takes for the whole prompt, and attention over positions cached
//! by an earlier micro-batch sums the same terms in the same order.

#[path = "common/llamacpp.rs"]
mod llamacpp;

use rustorch_llm::model::{Logits, Model};

/// `n` token ids from a fixed xorshift sequence.
fn tokens(model: &Model, n: usize) -> Vec<u32> {
    let n_vocab = model.config().n_vocab as u64;
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n_vocab) as u32
        })
        .collect()
}

/// Logits of `tokens` through `forward` (split) and `forward_inspect` (one
/// batch), with the number that differ in their bits.
fn split_against_whole(model: &Model, tokens: &[u32], which: Logits) -> (usize, usize) {
    let run = |split: bool| -> Vec<f32> {
        let mut cache = model.new_cache(tokens.len()).unwrap();
        let t = if split {
            model.forward(&mut cache, tokens, which).unwrap()
        } else {
            model
                .forward_inspect(&mut cache, tokens, which, &mut |_, _, _| Ok(()))
                .unwrap()
        };
        assert_eq!(cache.len(), tokens.len());
        t.to_vec::<f32>().unwrap()
    };
    let (split, whole) = (run(true), run(false));
    assert_eq!(split.len(), whole.len());
    let differ = split
        .iter()
        .zip(&whole)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    (split.len(), differ)
}

/// 302 positions: micro-batches of 256 and 46 (46 = 44 rows for the
/// repacked Q4_K kernels' four-row path and 2 for their one-row tail, as
/// in one batch of 302).
#[test]
fn micro_batches_give_the_one_batch_bits() {
    for id in ["smollm2-q4_1", "smollm2-q4_k_m"] {
        let path = llamacpp::model_path(id);
        let model = Model::load(&path).expect("the model loads");
        let toks = tokens(&model, 302);
        let (n, differ) = split_against_whole(&model, &toks, Logits::All);
        assert_eq!(n, 302 * model.config().n_vocab);
        assert_eq!(
            differ, 0,
            "{id}: {differ} logits differ between micro-batches and one batch"
        );
    }
}

/// Gemma 3 past its 512-position sliding window: the second micro-batch's
/// windowed layers hide positions the first one cached.
#[test]
fn micro_batches_keep_the_sliding_window() {
    let path = llamacpp::model_path("gemma3-q4_k_m");
    let model = Model::load(&path).expect("the model loads");
    let window = model.config().sliding_window.as_ref().map(|w| w.window);
    assert_eq!(window, Some(512), "the test assumes Gemma 3 270M's window");
    let toks = tokens(&model, 600);
    let (n, differ) = split_against_whole(&model, &toks, Logits::Last);
    assert_eq!(n, model.config().n_vocab);
    assert_eq!(differ, 0, "{differ} logits differ between micro-batches and one batch");
}

/// A prompt whose second micro-batch holds a bad token, or that does not fit,
/// fails before any micro-batch runs and leaves the cache as it was.
#[test]
fn a_failed_prompt_leaves_the_cache_unchanged() {
    let path = llamacpp::model_path("smollm2-q4_1");
    let model = Model::load(&path).expect("the model loads");
    let mut cache = model.new_cache(400).unwrap();
    model.forward(&mut cache, &tokens(&model, 10), Logits::Last).unwrap();
    let mut bad = tokens(&model, 300);
    bad[280] = model.config().n_vocab as u32;
    let err = model.forward(&mut cache, &bad, Logits::Last).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert_eq!(cache.len(), 10);
    let err = model
        .forward(&mut cache, &tokens(&model, 391), Logits::Last)
        .unwrap_err();
    assert_eq!(cache.len(), 10, "{err}");
    model.forward(&mut cache, &tokens(&model, 390), Logits::Last).unwrap();
    assert_eq!(cache.len(), 400);
}
