//! `Model::forward` sends a long prompt through each feed-forward block in
//! chunks of rows, to bound its memory; `Model::forward_inspect` sends the
//! whole batch at once. Both must give the same bits: every op of the block
//! works row by row, and each chunk takes the batched path the whole batch
//! takes (model/forward.rs, `FFN_CHUNK_ROWS`).

#[path = "common/llamacpp.rs"]
mod llamacpp;

use rustorch_llm::model::{Logits, Model};

#[test]
fn chunked_feed_forward_gives_the_whole_batch_bits() {
    let Some(path) = llamacpp::source_path("smollm2") else {
        return;
    };
    let model = Model::load(&path).expect("the model loads");
    // 300 rows: chunks of 256 and 44, so both halves and the join are checked.
    let n_vocab = model.config().n_vocab as u64;
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let tokens: Vec<u32> = (0..300)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n_vocab) as u32
        })
        .collect();
    let logits = |chunked: bool| -> Vec<f32> {
        let mut cache = model.new_cache(tokens.len()).unwrap();
        let t = if chunked {
            model.forward(&mut cache, &tokens, Logits::All).unwrap()
        } else {
            model
                .forward_inspect(&mut cache, &tokens, Logits::All, &mut |_, _, _| Ok(()))
                .unwrap()
        };
        t.to_vec::<f32>().unwrap()
    };
    let (chunked, whole) = (logits(true), logits(false));
    assert_eq!(chunked.len(), 300 * model.config().n_vocab);
    let differ = chunked
        .iter()
        .zip(&whole)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differ, 0,
        "{differ} logits differ between chunked and whole feed-forward blocks"
    );
}
