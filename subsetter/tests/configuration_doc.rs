//! docs/configuration.md documents the subsetter's command line as its clap parser has it
//! (every flag of the command and its subcommands, with env var and default), the env vars it
//! reads outside the flags, and every key of its settings ConfigMap. The checker's own tests
//! are in activator/tests/configuration_doc.rs.

#[path = "../../crds/tests/support/config_doc_check.rs"]
mod config_doc_check;

use clap::CommandFactory;
use config_doc_check::{check_command, check_names_in_section, check_settings, doc};

#[test]
fn every_subsetter_flag_env_var_and_settings_key_is_documented() {
    let doc = doc();
    let mut problems = check_command(&subsetter::cli::Args::command(), "subsetter", &doc);
    problems.extend(check_names_in_section(
        &doc,
        "command: subsetter",
        subsetter::cli::OTHER_ENV,
    ));
    problems.extend(check_settings(&doc, &subsetter::settings::KEYS));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
