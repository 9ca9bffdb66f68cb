//! The llama.cpp reference fixtures (tests/fixtures/llamacpp/) are usable:
//!
//! - every fixture loads and is internally consistent (lengths, the logits
//!   file against the recorded top logits and greedy first token, the
//!   perplexity record against its running values);
//! - our tokenizer gives llama.cpp's token ids for every prompt of every
//!   fixture;
//! - every requantized SmolLM2 file is reproduced byte for byte by
//!   `rustorch_quantize::file::quantize_gguf` (sha256 of llama-quantize's
//!   file, recorded in models.json).
//!
//! The tests that need the models take them from `RUSTORCH_SMOLLM2_GGUF` /
//! `RUSTORCH_GEMMA3_GGUF`, or fetch them with tools/fetch_models.py when
//! those are unset, and fail when neither works.

#[path = "common/llamacpp.rs"]
mod llamacpp;

use llamacpp::{final_logits, fixture, model_entry, models, requantize, source_path, MODEL_IDS};
use rustorch::gguf::Gguf;
use rustorch_llm::Tokenizer;

#[test]
fn fixtures_load_and_are_consistent() {
    let all = models();
    assert_eq!(all.len(), MODEL_IDS.len(), "models.json: {:?}", all.keys());
    for id in MODEL_IDS {
        let entry = &all[id];
        assert_eq!(entry.sha256.len(), 64, "{id}");
        // Which CPU llama.cpp ran on (its results depend on it); the kind follows from the flags.
        llamacpp::fixture_cpu::check_record(id, &entry.cpu);
        assert!(!entry.settings.flash_attn, "{id}: flash attention must be off");
        assert_eq!(entry.settings.type_k, "f16");
        assert_eq!(entry.requant.is_some(), id != "smollm2-q4_1" && id != "gemma3-q4_k_m");
        let fx = fixture(id);
        assert_eq!(fx.id, id);
        assert!(fx.prompts.len() >= 12, "{id}: {} prompts", fx.prompts.len());
        for (i, p) in fx.prompts.iter().enumerate() {
            assert!(!p.tokens.is_empty(), "{id} prompt {i}");
            assert_eq!(p.greedy.len(), fx.n_gen, "{id} prompt {i}");
            assert_eq!(p.gaps.len(), fx.n_gen, "{id} prompt {i}");
            assert!(p.gaps.iter().all(|g| *g >= 0.0), "{id} prompt {i}: negative gap");
            assert_eq!(p.top.len(), 10, "{id} prompt {i}");
            assert!(
                p.top.windows(2).all(|w| w[0].1 >= w[1].1),
                "{id} prompt {i}: top not sorted"
            );
            let n_vocab = fx.n_vocab as u32;
            assert!(
                p.tokens.iter().chain(&p.greedy).all(|&t| t < n_vocab),
                "{id} prompt {i}"
            );
            // The first greedy token is the argmax after the prompt, which is top[0],
            // and its gap is top[0] - top[1]. The gap was taken in f32 and the top
            // logits are exact f32 values, so the f32 difference must match exactly.
            assert_eq!(p.greedy[0], p.top[0].0, "{id} prompt {i}");
            assert_eq!(p.gaps[0], p.top[0].1 - p.top[1].1, "{id} prompt {i}");
        }
        // The logits file is an independent record of the same vectors: its top
        // 10 must be the recorded ones, value for value.
        let logits = final_logits(&fx);
        assert_eq!(logits.len(), fx.logits_prompts.len());
        for (l, &pi) in logits.iter().zip(&fx.logits_prompts) {
            let p = &fx.prompts[pi];
            let mut order: Vec<u32> = (0..fx.n_vocab as u32).collect();
            order.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
            let top: Vec<(u32, f32)> = order[..10].iter().map(|&t| (t, l[t as usize])).collect();
            assert_eq!(top, p.top, "{id} prompt {pi}: logits file vs top");
        }
        let ppl = &fx.perplexity;
        assert_eq!(ppl.running.len(), ppl.chunks, "{id}");
        assert_eq!(ppl.scored_per_chunk, ppl.ctx - 1 - ppl.ctx / 2);
        // The final estimate is printed with 4 decimals, as is the last running value.
        let last = *ppl.running.last().expect("chunks > 0");
        assert!((ppl.ppl - last).abs() < 1e-4, "{id}: {} vs {last}", ppl.ppl);
        assert!(ppl.ppl > 1.0 && ppl.ppl_err > 0.0, "{id}");
    }
}

#[test]
fn tokenizer_matches_llamacpp_for_every_prompt() {
    let mut checked = 0;
    for id in MODEL_IDS {
        let entry = model_entry(id);
        // Requantization copies the metadata (the tokenizer) verbatim, so the
        // shipped file's tokenizer is the requantized files' tokenizer.
        let src = source_path(&entry.source);
        let g = Gguf::open(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
        let fx = fixture(id);
        let mut failures = Vec::new();
        for p in &fx.prompts {
            // The fixture used add_special = true, which adds BOS when the metadata asks.
            let got = tok.encode(&p.text, true, true);
            if got != p.tokens {
                failures.push(format!(
                    "{:?}\n  llama.cpp: {:?}\n  rustorch:  {got:?}",
                    p.text, p.tokens
                ));
            }
            checked += 1;
        }
        assert!(failures.is_empty(), "{id}:\n{}", failures.join("\n"));
    }
    eprintln!("{checked} prompts tokenized like llama.cpp");
}

#[test]
fn requantized_models_are_byte_identical_to_llama_quantize() {
    let all = models();
    let src = source_path("smollm2");
    let shipped = &all["smollm2-q4_1"];
    assert_eq!(
        llamacpp::sha256_file(&src),
        shipped.sha256,
        "{} is not the file the fixtures were made from",
        src.display()
    );
    let mut failures = Vec::new();
    for (id, entry) in all.iter().filter(|(_, e)| e.requant.is_some()) {
        // Always quantize afresh (into a hashing sink) rather than trusting
        // model_path's cache, so a change in the quantizer is caught.
        let sha = requantize(&src, entry, std::io::sink());
        if sha != entry.sha256 {
            failures.push(format!("{id}: ours {sha}, llama-quantize {}", entry.sha256));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn model_path_gives_the_fixture_files() {
    for id in MODEL_IDS {
        let path = llamacpp::model_path(id);
        // model_path checked requantized files already; check every id the same way.
        assert_eq!(
            llamacpp::sha256_file(&path),
            model_entry(id).sha256,
            "{}",
            path.display()
        );
    }
}

/// The tests compare this CPU's kind with the fixtures' (`fixture_cpu`), detected in Rust; the
/// generators record theirs from /proc/cpuinfo (tools/cpu_record.py). Both must see the same flags
/// here, or a test would call a CPU of the fixtures' kind another one (or the reverse).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn this_cpu_has_the_flags_proc_cpuinfo_lists() {
    use llamacpp::fixture_cpu::{this_cpu_flags, FLAGS};
    let text = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo reads");
    let line = text
        .lines()
        .find(|l| l.starts_with("flags"))
        .expect("/proc/cpuinfo has a flags line");
    let listed: Vec<&str> = line.split(':').nth(1).unwrap_or_default().split_whitespace().collect();
    let want: Vec<&str> = FLAGS.iter().copied().filter(|f| listed.contains(f)).collect();
    assert_eq!(this_cpu_flags(), want);
}
