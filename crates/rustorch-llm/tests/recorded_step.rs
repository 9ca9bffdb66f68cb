//! The recorded decode step's arithmetic, on the CPU: the ops a CUDA graph
//! replays (the token's position read from a tensor by the RoPE row lookup,
//! the KV-cache write and `attention_at`) run one by one
//! (`Model::decode_step_by_ops`) next to `forward`'s decode steps on other
//! caches, with and without flash attention. `attention_at` sums in f32
//! where llama.cpp's attentions round to f16 (each its own way), so the
//! logits agree as closely as llama.cpp's two attentions agree with each
//! other, not to the bit. Gemma 3 brings the query scaling, the extra norms
//! and (per layer) the sliding window.

#[path = "common/llamacpp.rs"]
mod llamacpp;

use rustorch_llm::model::{argmax, Logits, Model};

/// Largest absolute difference between two logit vectors.
fn worst(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// Decode steps three ways from the same prompt: the device-position ops
/// (`decode_step_by_ops`), `forward` with flash attention and without.
/// llama.cpp's two attentions round differently (the flash one sums values
/// in f16): the ops' logits must lie as close to either as the two lie to
/// each other.
fn compare(id: &str, prompt: &str, steps: usize) {
    let model = Model::load(llamacpp::model_path(id)).unwrap();
    let tokens = model.tokenizer().encode(prompt, true, true);
    let mut flash = model.new_flash_cache(128).unwrap();
    let mut plain = model.new_cache(128).unwrap();
    let mut by_ops = model.new_flash_cache(128).unwrap();
    model.run_pass(|| {
        let mut want = model
            .forward(&mut flash, &tokens, Logits::Last)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        model.forward(&mut plain, &tokens, Logits::Last).unwrap();
        model.forward(&mut by_ops, &tokens, Logits::Last).unwrap();
        for step in 0..steps {
            let next = argmax(&want);
            let got = model.decode_step_by_ops(&mut by_ops, next).unwrap();
            want = model.forward_last(&mut flash, &[next]).unwrap();
            let other = model.forward_last(&mut plain, &[next]).unwrap();
            assert_eq!(by_ops.len(), flash.len());
            let spread = worst(&want, &other);
            let (to_flash, to_plain) = (worst(&got, &want), worst(&got, &other));
            eprintln!("{id} step {step}: flash-plain {spread:.4}, ops-flash {to_flash:.4}, ops-plain {to_plain:.4}");
            // Measured on SmolLM2 and Gemma 3: all three distances 0.6-1.5;
            // a position read wrong (RoPE row, cache slot, attention length)
            // moves logits by several units.
            assert!(
                to_flash.min(to_plain) <= 1.5 * spread.max(0.5),
                "{id} step {step}: the ops' logits are {to_flash} from flash attention's and {to_plain} from plain attention's, which are {spread} apart"
            );
            assert!(
                argmax(&got) == argmax(&want) || argmax(&got) == argmax(&other),
                "{id} step {step}: the ops' greedy token is neither attention's"
            );
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
