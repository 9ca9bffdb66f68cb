//! `tokenize -m MODEL -p TEXT`: a text's tokens, printed as llama.cpp's
//! `llama-tokenize` prints them (tools/tokenize/tokenize.cpp): one
//! `%6d -> 'piece'` line per token, or with `--ids` only the list
//! `[id, id, ...]`. BOS (and EOS) are added when the model's metadata asks
//! for them unless `--no-bos`; special-token text is parsed unless
//! `--no-parse-special`. Pieces are written as raw bytes, as printf does, so
//! a byte token that is half of a UTF-8 character prints as that byte.

use crate::cli::TokenizeArgs;
use crate::error::CliError;
use crate::loader;
use rustorch::gguf::Gguf;
use rustorch_llm::Tokenizer;
use std::io::Write;

pub fn run(args: &TokenizeArgs) -> Result<(), CliError> {
    let path = loader::model_path(args.model.as_deref())?;
    let g = Gguf::open(&path).map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
    let tok = Tokenizer::from_gguf(&g).map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
    // llama-tokenize passes add_special = add_bos && !no_bos, which adds EOS too when the
    // vocabulary asks for it; `encode` adds each only where the metadata says so.
    let ids = tok.encode(&args.prompt, !args.no_bos, !args.no_parse_special);
    let out = render(&tok, &ids, args.ids);
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&out)
        .and_then(|_| stdout.flush())
        .map_err(|e| CliError::msg(format!("cannot write the tokens: {e}")))
}

/// The output bytes.
fn render(tok: &Tokenizer, ids: &[u32], ids_only: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if ids_only {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        out.extend_from_slice(format!("[{}]\n", list.join(", ")).as_bytes());
        return out;
    }
    for &id in ids {
        out.extend_from_slice(format!("{id:6} -> '").as_bytes());
        out.extend_from_slice(tok.token_to_piece(id));
        out.extend_from_slice(b"'\n");
    }
    out
}
