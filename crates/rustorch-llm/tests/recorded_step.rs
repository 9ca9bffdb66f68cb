//! The recorded decode step's arithmetic, on the CPU: the ops a CUDA graph
//! replays (the token's position read from a tensor by the RoPE row lookup,
//! the KV-cache write and `attention_at`) run one by one
//! (`Model::decode_step_by_ops`) next to `forward`'s decode steps on a
//! second cache. Attention sums in another order than `forward`'s
//! llama.cpp-exact flash attention, so the logits agree closely, not to
//! the bit; the greedy tokens are the same. Gemma 3 brings the query
//! scaling, the extra norms and (per layer) the sliding window.

#[path = "common/llamacpp.rs"]
mod llamacpp;

use rustorch_llm::model::{argmax, Logits, Model};

fn compare(id: &str, prompt: &str, steps: usize) {
    let model = Model::load(llamacpp::model_path(id)).unwrap();
    let tokens = model.tokenizer().encode(prompt, true, true);
    let mut by_forward = model.new_flash_cache(128).unwrap();
    let mut by_ops = model.new_flash_cache(128).unwrap();
    model.run_pass(|| {
        let mut want = model
            .forward(&mut by_forward, &tokens, Logits::Last)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        model.forward(&mut by_ops, &tokens, Logits::Last).unwrap();
        for step in 0..steps {
            let next = argmax(&want);
            let got = model.decode_step_by_ops(&mut by_ops, next).unwrap();
            want = model.forward_last(&mut by_forward, &[next]).unwrap();
            assert_eq!(by_ops.len(), by_forward.len());
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= 2e-3 * scale.max(1.0),
                "{id} step {step}: largest logit difference {worst} (largest logit {scale})"
            );
            assert_eq!(argmax(&got), argmax(&want), "{id} step {step}: greedy tokens differ");
        }
    });
}

#[test]
fn smollm2_steps_by_device_positions_follow_forward() {
    compare("smollm2-q4_k_m", "The capital of France is", 8);
}

#[test]
fn gemma3_steps_by_device_positions_follow_forward() {
    compare("gemma3-q4_k_m", "Write a haiku about the sea.", 6);
}

#[test]
fn a_bad_token_fails_the_step_and_leaves_the_cache() {
    let model = Model::load(llamacpp::model_path("smollm2-q4_k_m")).unwrap();
    let mut cache = model.new_flash_cache(16).unwrap();
    let n_vocab = model.config().n_vocab as u32;
    assert!(model.decode_step_by_ops(&mut cache, n_vocab).is_err());
    assert_eq!(cache.len(), 0);
    assert!(model.decode_step_by_ops(&mut cache, 1).is_ok());
    assert_eq!(cache.len(), 1);
}
