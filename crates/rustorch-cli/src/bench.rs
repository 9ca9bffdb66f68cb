//! `bench`: not yet.
use crate::cli::BenchArgs;
use crate::error::CliError;
pub fn run(_: &BenchArgs) -> Result<(), CliError> {
    Err(CliError::msg("bench is not implemented yet"))
}
