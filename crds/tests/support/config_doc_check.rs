//! Shared by the activator's and the subsetter's `tests/configuration_doc.rs` (included by
//! path): docs/configuration.md documents a binary's command line as its clap `Command` has
//! it. Each command (and subcommand) has a section opened by `<!-- command: <path> -->`
//! (`activator`, `subsetter`, `subsetter bench`, ...), up to the next such marker; in it, each
//! long flag has a table row naming it as `` `--flag` ``, with its aliases, its environment
//! variable and its default value in backticks. A row naming a flag the command does not
//! have is a problem too, so the doc cannot keep a removed flag.

#![allow(dead_code)] // each test binary uses its own part

use std::collections::BTreeSet;

/// The section of `doc` for the command at `path`, or None.
pub fn section<'a>(doc: &'a str, marker: &str) -> Option<&'a str> {
    let open = format!("<!-- {marker} -->");
    let start = doc.find(&open)? + open.len();
    let rest = &doc[start..];
    let end = rest.find("<!-- command:").unwrap_or(rest.len());
    let end = end.min(rest.find("<!-- settings:").unwrap_or(rest.len()));
    Some(&rest[..end])
}

/// The table rows of a section.
fn rows(section: &str) -> Vec<&str> {
    section
        .lines()
        .filter(|l| l.trim_start().starts_with('|'))
        .collect()
}

/// The backticked words of a line.
fn ticked(line: &str) -> BTreeSet<String> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every problem of `doc` with `cmd` (at `path`) and its subcommands, recursively.
pub fn check_command(cmd: &clap::Command, path: &str, doc: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(sec) = section(doc, &format!("command: {path}")) else {
        return vec![format!("no section <!-- command: {path} -->")];
    };
    let rows = rows(sec);
    let mut flags = BTreeSet::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let Some(long) = arg.get_long() else {
            problems.push(format!(
                "{path}: argument {id} has no long flag to document"
            ));
            continue;
        };
        let flag = format!("--{long}");
        flags.insert(flag.clone());
        let aliases: Vec<String> = arg
            .get_all_aliases()
            .unwrap_or_default()
            .into_iter()
            .map(|a| format!("--{a}"))
            .collect();
        flags.extend(aliases.iter().cloned());
        let Some(row) = rows.iter().find(|r| ticked(r).contains(&flag)) else {
            problems.push(format!("{path}: {flag} has no row"));
            continue;
        };
        let words = ticked(row);
        for a in &aliases {
            if !words.contains(a) {
                problems.push(format!("{path}: {flag}'s row does not name its alias {a}"));
            }
        }
        if let Some(env) = arg.get_env() {
            let env = env.to_string_lossy().into_owned();
            if !words.contains(&env) {
                problems.push(format!(
                    "{path}: {flag}'s row does not name its env var {env}"
                ));
            }
        }
        if arg.get_action().takes_values() {
            let default: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            if !default.is_empty() {
                let default = default.join(",");
                if !words.contains(&default) {
                    problems.push(format!(
                        "{path}: {flag}'s row does not give its default `{default}`"
                    ));
                }
            }
        }
    }
    for row in &rows {
        for w in ticked(row) {
            if w.starts_with("--") && !flags.contains(&w) {
                problems.push(format!(
                    "{path}: the doc has {w}, the command has no such flag"
                ));
            }
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        problems.extend(check_command(
            sub,
            &format!("{path} {}", sub.get_name()),
            doc,
        ));
    }
    problems
}

/// Each of `names` (env vars read outside the flags) is named in backticks in the section of
/// the command at `path`.
pub fn check_names_in_section(doc: &str, marker: &str, names: &[&str]) -> Vec<String> {
    let Some(sec) = section(doc, marker) else {
        return vec![format!("no section <!-- {marker} -->")];
    };
    let words: BTreeSet<String> = sec.lines().flat_map(ticked).collect();
    names
        .iter()
        .filter(|n| !words.contains(**n))
        .map(|n| format!("{marker}: {n} is not documented"))
        .collect()
}

/// The settings ConfigMap's table (section `<!-- settings: subsetter -->`): a row per key
/// (first cell `` `key` ``), and no row for a key the code does not read.
pub fn check_settings(doc: &str, keys: &[&str]) -> Vec<String> {
    let Some(sec) = section(doc, "settings: subsetter") else {
        return vec!["no section <!-- settings: subsetter -->".into()];
    };
    let first_cells: BTreeSet<String> = rows(sec)
        .iter()
        .filter_map(|r| {
            let cell = r.trim().trim_start_matches('|').split('|').next()?.trim();
            Some(cell.strip_prefix('`')?.strip_suffix('`')?.to_owned())
        })
        .collect();
    let mut problems: Vec<String> = keys
        .iter()
        .filter(|k| !first_cells.contains(**k))
        .map(|k| format!("settings key {k} has no row"))
        .collect();
    for c in &first_cells {
        if !keys.contains(&c.as_str()) {
            problems.push(format!("settings row {c}: the subsetter reads no such key"));
        }
    }
    problems
}

/// docs/configuration.md.
pub fn doc() -> String {
    let path = format!("{}/../docs/configuration.md", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}
