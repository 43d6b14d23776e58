//! The settings an operator may change without a restart, from an optional ConfigMap
//! (`--config-map NAME`, in the subsetter's namespace): the policy, maxNodeSelection and the
//! write rate. The flags give the defaults; the ConfigMap's keys override them while it
//! exists, and a deleted ConfigMap restores the flags. [`parse`] is pure: a ConfigMap with
//! any bad key is refused whole (with every reason) and the settings in force stay.

use std::collections::BTreeMap;

/// What can be tuned at run time.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `policy`: `random` or `least-loaded`.
    pub policy: String,
    /// `maxNodeSelection`: the most activators a revision gets without `spec.activators`.
    pub max_node_selection: usize,
    /// `writeQPS`: API writes a second (0: no limit).
    pub write_qps: f64,
    /// `writeBurst`: writes that may go at once after a quiet spell.
    pub write_burst: u32,
    /// `imageLocality`: least-loaded prefers nodes holding the revision's images.
    pub image_locality: bool,
}

/// The ConfigMap keys, as `kubectl edit` shows them.
pub const KEYS: [&str; 5] = [
    "policy",
    "maxNodeSelection",
    "writeQPS",
    "writeBurst",
    "imageLocality",
];

/// `base` (the flags) with `data`'s keys applied, or every reason `data` is refused.
pub fn parse(data: &BTreeMap<String, String>, base: &Settings) -> Result<Settings, Vec<String>> {
    let mut s = base.clone();
    let mut errors = Vec::new();
    for (k, v) in data {
        let v = v.trim();
        match k.as_str() {
            "policy" => match v {
                "random" | "least-loaded" => s.policy = v.to_owned(),
                _ => errors.push(format!("policy: {v:?} is not random or least-loaded")),
            },
            "maxNodeSelection" => match v.parse::<usize>() {
                Ok(n) if (1..=1000).contains(&n) => s.max_node_selection = n,
                _ => errors.push(format!("maxNodeSelection: {v:?} is not a number in 1-1000")),
            },
            "writeQPS" => match v.parse::<f64>() {
                Ok(q) if q.is_finite() && q >= 0.0 => s.write_qps = q,
                _ => errors.push(format!("writeQPS: {v:?} is not a number ≥ 0")),
            },
            "writeBurst" => match v.parse::<u32>() {
                Ok(b) if b >= 1 => s.write_burst = b,
                _ => errors.push(format!("writeBurst: {v:?} is not a whole number ≥ 1")),
            },
            "imageLocality" => match v {
                "true" => s.image_locality = true,
                "false" => s.image_locality = false,
                _ => errors.push(format!("imageLocality: {v:?} is not true or false")),
            },
            other => errors.push(format!(
                "unknown key {other:?} (known: {})",
                KEYS.join(", ")
            )),
        }
    }
    if errors.is_empty() {
        Ok(s)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Settings {
        Settings {
            policy: "random".into(),
            max_node_selection: 3,
            write_qps: 100.0,
            write_burst: 200,
            image_locality: true,
        }
    }

    fn data(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    #[test]
    fn keys_override_the_flags() {
        let s = parse(
            &data(&[
                ("policy", "least-loaded"),
                ("maxNodeSelection", " 5 "),
                ("writeQPS", "20.5"),
                ("writeBurst", "40"),
                ("imageLocality", "false"),
            ]),
            &base(),
        )
        .unwrap();
        assert_eq!(
            s,
            Settings {
                policy: "least-loaded".into(),
                max_node_selection: 5,
                write_qps: 20.5,
                write_burst: 40,
                image_locality: false,
            }
        );
        assert_eq!(parse(&data(&[]), &base()).unwrap(), base());
    }

    #[test]
    fn a_bad_config_map_is_refused_whole_with_every_reason() {
        let e = parse(
            &data(&[
                ("policy", "nearest"),
                ("maxNodeSelection", "0"),
                ("writeQPS", "-1"),
                ("writeBurst", "many"),
                ("imageLocality", "yes"),
                ("maxNodeSelections", "3"),
                ("zz", "1"),
            ]),
            &base(),
        )
        .unwrap_err();
        assert_eq!(e.len(), 7, "{e:?}");
        assert!(
            e.iter()
                .any(|m| m.contains("unknown key \"maxNodeSelections\""))
        );
        // One bad key among good ones: nothing is applied.
        assert!(
            parse(
                &data(&[("policy", "least-loaded"), ("writeQPS", "x")]),
                &base()
            )
            .is_err()
        );
    }
}
