//! The operator's settings as the environment sees them.

use clap::CommandFactory;
use eni_operator::config::Settings;

/// Every environment variable a setting reads.
pub fn env_names() -> Vec<String> {
    Settings::command()
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}
