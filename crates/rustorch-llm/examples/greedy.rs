//! Greedy generation from a GGUF model, with timings.
//!
//! usage: cargo run --release -p rustorch-llm --example greedy -- MODEL.gguf "prompt" [N]

use rustorch_llm::Model;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: greedy MODEL.gguf PROMPT [N]".into());
    }
    let n: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(32);
    let start = Instant::now();
    let model = Model::load(&args[1])?;
    eprintln!("loaded in {:.2?}: {:?}", start.elapsed(), model.config().arch);
    let prompt = model.tokenizer().encode(&args[2], true, true);
    let mut cache = model.new_cache(prompt.len() + n)?;
    if let Ok(path) = std::env::var("GREEDY_DUMP_LOGITS") {
        // The prompt's final-position logits as raw f32, for comparisons.
        let mut c = model.new_cache(prompt.len())?;
        let dump_dir = std::env::var("GREEDY_DUMP_DIR").ok();
        let logits = model
            .forward_inspect(&mut c, &prompt, rustorch_llm::Logits::Last, &mut |name, il, t| {
                if let Some(dir) = &dump_dir {
                    let v = t.to_vec::<f32>()?;
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    let layer = if il == usize::MAX {
                        String::new()
                    } else {
                        format!("-{il}")
                    };
                    std::fs::write(format!("{dir}/{name}{layer}.bin"), bytes)
                        .map_err(|e| rustorch_llm::LlmError::InvalidArgument(e.to_string()))?;
                }
                Ok(())
            })?
            .to_vec::<f32>()?;
        let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(path, bytes)?;
    }
    let start = Instant::now();
    let out = model.generate_greedy(&mut cache, &prompt, n)?;
    let dt = start.elapsed();
    println!("{:?}", out);
    println!("{}{}", args[2], model.tokenizer().decode(&out));
    eprintln!("{} prompt + {n} generated tokens in {dt:.2?}", prompt.len());
    Ok(())
}
