//! `chat`: not yet.
use crate::cli::ChatArgs;
use crate::error::CliError;
pub fn run(_: &ChatArgs) -> Result<(), CliError> {
    Err(CliError::msg("chat is not implemented yet"))
}
