//! The one error type of the CLI: a message printed as `error: ...`.

use std::fmt;

#[derive(Debug)]
pub struct CliError(String);

impl CliError {
    pub fn msg(s: impl Into<String>) -> CliError {
        CliError(s.into())
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

macro_rules! from_display {
    ($($t:ty),*) => {$(
        impl From<$t> for CliError {
            fn from(e: $t) -> CliError {
                CliError(e.to_string())
            }
        }
    )*};
}

from_display!(
    rustorch::gguf::GgufError,
    rustorch::quant::QuantError,
    rustorch_quantize::mix::MixError,
    rustorch_llm::LlmError,
    rustorch::Error
);
