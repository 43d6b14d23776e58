//! Shared by the activator's and the subsetter's `tests/rendered_manifests.rs` (included by
//! path, with `render.rs` and `manifest_check.rs`): the command line a rendered container
//! runs, parsed by the binary's own clap parser, and the chart's `<bin>.flags` values checked
//! against that parser's flags.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::fmt::Debug;

use clap::{CommandFactory, Parser};
use serde_json::Value;

use crate::render;

/// The longs of the flags the container fills from the downward API (an env var of the flag
/// set with `valueFrom`): those have no chart value, the pod supplies them.
pub fn downward_flags<A: CommandFactory>(c: &Value) -> BTreeSet<String> {
    let from_pod: BTreeSet<&str> = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e.get("valueFrom").is_some())
        .filter_map(|e| e["name"].as_str())
        .collect();
    A::command()
        .get_arguments()
        .filter(|a| {
            a.get_env()
                .is_some_and(|e| from_pod.contains(e.to_string_lossy().as_ref()))
        })
        .filter_map(|a| a.get_long().map(String::from))
        .collect()
}

/// What the container's process parses to (`{:?}` of the binary's `Args`): its args, and each
/// env var a flag reads, as that flag (downward-API ones as a placeholder naming the field), so
/// that the same command line written as args or as env compares equal. Nothing is read from
/// this test process's own environment.
pub fn parsed<A: Parser + CommandFactory + Debug>(bin: &str, c: &Value) -> String {
    let mut argv = vec![bin.to_string()];
    argv.extend(
        c["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a.as_str().unwrap().to_string()),
    );
    let cmd = A::command();
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap();
        let Some(arg) = cmd.get_arguments().find(|a| {
            a.get_env()
                .is_some_and(|v| v.to_string_lossy().as_ref() == name)
        }) else {
            continue;
        };
        let long = arg.get_long().unwrap();
        let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
            (Value::String(v), _) => v.clone(),
            (_, Value::String(field)) => format!("<{field}>"),
            other => panic!("env {name}: {other:?}"),
        };
        // A fieldPath placeholder must still parse as the flag's type (POD_IP is an IpAddr).
        let value = if value == "<status.podIP>" {
            "192.0.2.1".to_string()
        } else {
            value
        };
        argv.push(format!("--{long}={value}"));
    }
    for a in cmd.get_arguments() {
        let Some(long) = a.get_long() else { continue };
        let given = argv
            .iter()
            .any(|x| x == &format!("--{long}") || x.starts_with(&format!("--{long}=")));
        if a.is_required_set() && !given {
            argv.push(format!("--{long}=x"));
        }
    }
    match A::try_parse_from(&argv) {
        Ok(a) => format!("{a:?}"),
        Err(e) => panic!("{argv:?} does not parse: {e}"),
    }
}

/// `--write-qps` → `writeQps`.
pub fn camel(long: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for ch in long.chars() {
        if ch == '-' {
            up = true;
        } else if up {
            out.extend(ch.to_uppercase());
            up = false;
        } else {
            out.push(ch);
        }
    }
    out
}

/// A different value of the same type (one that still parses).
fn changed(v: &Value) -> Value {
    match v {
        Value::Bool(b) => Value::Bool(!b),
        Value::Number(n) if n.is_u64() => Value::from(n.as_u64().unwrap() + 1),
        // Halved: a fraction (0.7) stays a fraction, a factor (1.2) a positive number.
        Value::Number(n) => Value::from(n.as_f64().unwrap() / 2.0),
        Value::String(s) if s.is_empty() => Value::from("changed"),
        // A duration (`30s`, `250ms`): one more of its unit.
        Value::String(s) if duration_parts(s).is_some() => {
            let (n, unit) = duration_parts(s).unwrap();
            Value::from(format!("{}{unit}", n + 1))
        }
        Value::String(s) => match s.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() => {
                Value::from(format!("{host}:{}", port.parse::<u16>().unwrap() + 1))
            }
            _ => Value::from(format!("{s}-changed")),
        },
        other => panic!("a flag value must be a scalar, not {other}"),
    }
}

/// `30s` → (30, "s"): digits, then a unit of letters only.
fn duration_parts(s: &str) -> Option<(u64, &str)> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    if unit.chars().all(|c| c.is_ascii_alphabetic()) {
        Some((n.parse().ok()?, unit))
    } else {
        None
    }
}

/// The chart has a value under `<bin>.flags` for exactly the flags of `A` the pod does not
/// fill, named in camelCase, and each one reaches the container's command line: changing it
/// alone changes what the binary parses.
pub fn values_cover_every_flag<A: Parser + CommandFactory + Debug>(
    bin: &str,
    kind: &str,
) -> Vec<String> {
    let container = |values: &Value| {
        let docs = render::helm_template(values, render::RELEASE_NAMESPACE);
        render::first_container(render::find(&docs, kind, bin)).clone()
    };
    let defaults = render::values(&[]);
    let c = container(&defaults);
    let downward = downward_flags::<A>(&c);
    let flags: BTreeSet<String> = A::command()
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| !downward.contains(*l))
        .map(camel)
        .collect();
    let values: BTreeSet<String> = defaults[bin]["flags"]
        .as_object()
        .unwrap_or_else(|| panic!("no {bin}.flags in values.yaml"))
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        flags, values,
        "{bin}: the chart's flags values (right) differ from the binary's flags (left, \
         without the downward-API ones {downward:?})"
    );
    let base = parsed::<A>(bin, &c);
    for key in &values {
        let mut v = defaults.clone();
        v[bin]["flags"][key] = changed(&defaults[bin]["flags"][key]);
        let now = parsed::<A>(bin, &container(&v));
        assert_ne!(
            now, base,
            "{bin}: changing {bin}.flags.{key} does not change the command line"
        );
    }
    values.into_iter().collect()
}
