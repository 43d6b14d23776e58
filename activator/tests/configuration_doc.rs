//! docs/configuration.md documents the activator's command line as its clap parser has it:
//! every flag with its env var and default, and the env vars it reads outside the flags.
//! The checker's own tests (it refuses a missing, stale or wrong row) are here too.

#[path = "../../crds/tests/support/config_doc_check.rs"]
mod config_doc_check;

use clap::{Arg, ArgAction, Command, CommandFactory};
use config_doc_check::{check_command, check_names_in_section, check_settings, doc};

#[test]
fn every_activator_flag_and_env_var_is_documented() {
    let doc = doc();
    let mut problems = check_command(&activator::cli::Args::command(), "activator", &doc);
    problems.extend(check_names_in_section(
        &doc,
        "command: activator",
        activator::cli::OTHER_ENV,
    ));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn cmd() -> Command {
    Command::new("x")
        .arg(
            Arg::new("rate")
                .long("rate")
                .alias("qps")
                .env("X_RATE")
                .default_value("100"),
        )
        .arg(Arg::new("quiet").long("quiet").action(ArgAction::SetTrue))
        .subcommand(Command::new("run").arg(Arg::new("n").long("n").default_value("3")))
}

#[test]
fn the_checker_accepts_a_complete_doc() {
    let doc = "\
<!-- command: x -->
| flag | env | default | what |
|---|---|---|---|
| `--rate` (`--qps`) | `X_RATE` | `100` | r |
| `--quiet` | | | q |
<!-- command: x run -->
| `--n` | | `3` | n |
<!-- settings: subsetter -->
| `policy` | p |
";
    assert_eq!(check_command(&cmd(), "x", doc), Vec::<String>::new());
    assert_eq!(check_settings(doc, &["policy"]), Vec::<String>::new());
}

#[test]
fn the_checker_refuses_missing_wrong_and_stale_rows() {
    let doc = "\
<!-- command: x -->
| `--rate` | `RATE` | `10` | r |
| `--gone` | | | a flag the command does not have |
<!-- settings: subsetter -->
| `policy` | p |
| `maxNodeSelections` | a typo |
";
    let p = check_command(&cmd(), "x", doc);
    // --qps alias, X_RATE, default 100, --quiet missing, --gone stale, no `x run` section.
    assert_eq!(p.len(), 6, "{p:#?}");
    let p = check_settings(doc, &["policy", "maxNodeSelection"]);
    assert_eq!(p.len(), 2, "{p:#?}");
    assert_eq!(
        check_names_in_section(doc, "command: x", &["RUST_LOG"]).len(),
        1
    );
}
