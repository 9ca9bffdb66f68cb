//! Writes the test models of `tests/common/model.rs` into a folder, for
//! tools/gen_quantize_fixtures.py to quantize with llama.cpp.
//!
//!     cargo run -p rustorch-cli --example quant_input -- OUT_DIR

#[path = "../tests/common/model.rs"]
mod model;

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: quant_input OUT_DIR");
        return ExitCode::from(2);
    };
    for spec in &model::SPECS {
        let path = std::path::Path::new(&dir).join(format!("{}.gguf", spec.name));
        if let Err(e) = std::fs::write(&path, model::build(spec)) {
            eprintln!("quant_input: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("{}", path.display());
    }
    ExitCode::SUCCESS
}
