//! Image pull secrets, read the way the kubelet reads them: a `kubernetes.io/dockerconfigjson`
//! (`.dockerconfigjson`, `{"auths": {...}}`) or `kubernetes.io/dockercfg` (`.dockercfg`, the
//! map alone) Secret becomes a keyring, and an image's credentials are those of the most
//! specific registry key that matches it (the kubelet's `credentialprovider` keyring:
//! host labels with `*` globs, the same port, a path prefix; keys sorted in reverse so the
//! more specific come first; Docker Hub's `index.docker.io` key for an image with no
//! registry). Pure: no IO; the Secrets are read by the caller.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use node_agent::{Credentials, ImageRef};
use serde::Deserialize;

pub const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
pub const DOCKER_CFG: &str = "kubernetes.io/dockercfg";
/// The key Docker Hub's credentials are filed under (the kubelet's `defaultRegistryHost`).
const DEFAULT_REGISTRY_KEY: &str = "index.docker.io";

/// Why a Secret gave no credentials.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("type {0:?} is not {DOCKER_CONFIG_JSON} or {DOCKER_CFG}")]
    WrongType(String),
    #[error("no {0} key")]
    Missing(&'static str),
    #[error("not a docker config: {0}")]
    Malformed(String),
}

#[derive(Deserialize)]
struct DockerConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

#[derive(Deserialize, Default)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

/// Registry keys and their credentials, the more specific keys first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyring {
    entries: Vec<(String, Credentials)>,
}

impl Keyring {
    /// Adds the entries of one Secret (`type_` and its `data`, already base64-decoded as
    /// k8s-openapi gives it). Entries without a username (identity tokens) are skipped: the
    /// node agent's protocol carries a username and password only.
    pub fn add_secret(
        &mut self,
        type_: &str,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<usize, SecretError> {
        let entries: BTreeMap<String, Entry> = match type_ {
            DOCKER_CONFIG_JSON => {
                let raw = data
                    .get(".dockerconfigjson")
                    .ok_or(SecretError::Missing(".dockerconfigjson"))?;
                serde_json::from_slice::<DockerConfigJson>(raw)
                    .map_err(|e| SecretError::Malformed(e.to_string()))?
                    .auths
            }
            DOCKER_CFG => {
                let raw = data
                    .get(".dockercfg")
                    .ok_or(SecretError::Missing(".dockercfg"))?;
                serde_json::from_slice(raw).map_err(|e| SecretError::Malformed(e.to_string()))?
            }
            other => return Err(SecretError::WrongType(other.to_owned())),
        };
        let mut added = 0;
        for (location, entry) in entries {
            let Some(creds) = credentials(&entry) else {
                continue;
            };
            let Some(key) = registry_key(&location) else {
                continue;
            };
            self.entries.push((key, creds));
            added += 1;
        }
        // Reverse order: "r.io/team/app" before "r.io/team" before "r.io" (the kubelet's
        // sort); stable, so equal keys keep the order their Secrets were listed in.
        self.entries.sort_by(|a, b| b.0.cmp(&a.0));
        Ok(added)
    }

    /// The credentials for `image`: the first matching key's, or Docker Hub's for an image
    /// with no registry (or `docker.io`). `None`: pull anonymously.
    pub fn lookup(&self, image: &ImageRef) -> Option<&Credentials> {
        let (host, path) = match image.domain() {
            Some(d) => (d, image.path()),
            None => ("", image.path()),
        };
        if !host.is_empty()
            && let Some((_, c)) = self.entries.iter().find(|(k, _)| matches(k, host, path))
        {
            return Some(c);
        }
        let default_registry = host.is_empty() || host == "docker.io";
        if default_registry {
            return self
                .entries
                .iter()
                .find(|(k, _)| k == DEFAULT_REGISTRY_KEY)
                .map(|(_, c)| c);
        }
        None
    }
}

fn credentials(entry: &Entry) -> Option<Credentials> {
    if !entry.auth.is_empty() {
        // `auth` wins over the separate fields, as in the kubelet.
        let raw = STANDARD.decode(entry.auth.trim()).ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (user, pass) = text.split_once(':')?;
        return Credentials::new(user, pass).ok();
    }
    Credentials::new(&entry.username, &entry.password).ok()
}

/// A docker config location as the kubelet files it: scheme dropped, `host[:port]` plus a
/// path other than `/`, with a leading `/v1/` or `/v2/` meaning the host itself.
fn registry_key(location: &str) -> Option<String> {
    let rest = location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .unwrap_or(location);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if host.is_empty() {
        return None;
    }
    let host = host.to_ascii_lowercase();
    let path = ["/v1/", "/v2/"]
        .iter()
        .find_map(|p| path.strip_prefix(&p[..3]).filter(|_| path.starts_with(p)))
        .unwrap_or(path);
    Some(if path.is_empty() || path == "/" {
        host
    } else {
        format!("{host}{path}")
    })
}

/// Whether the key `host[:port][/path]` matches an image on `image_host` (`host[:port]`) at
/// `image_path`: the same port, as many host labels each matching its glob, and the key's
/// path a prefix of the image's.
fn matches(key: &str, image_host: &str, image_path: &str) -> bool {
    let (key_hostport, key_path) = match key.find('/') {
        Some(i) => (&key[..i], &key[i..]),
        None => (key, ""),
    };
    let (key_host, key_port) = split_port(key_hostport);
    let (host, port) = split_port(image_host);
    if key_port != port {
        return false;
    }
    let image_path = format!("/{image_path}");
    if !image_path.starts_with(key_path) {
        return false;
    }
    let key_labels: Vec<&str> = key_host.split('.').collect();
    let labels: Vec<&str> = host.split('.').collect();
    key_labels.len() == labels.len()
        && key_labels
            .iter()
            .zip(&labels)
            .all(|(glob, label)| glob_match(glob.as_bytes(), label.as_bytes()))
}

fn split_port(hostport: &str) -> (&str, &str) {
    match hostport.rsplit_once(':') {
        Some((h, p)) => (h, p),
        None => (hostport, ""),
    }
}

/// `*` (any run of bytes) and `?` (one byte) within one host label, as Go's `filepath.Match`
/// does for the kubelet's keys; other bytes match themselves.
fn glob_match(glob: &[u8], s: &[u8]) -> bool {
    match glob.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| glob_match(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && glob_match(rest, &s[1..]),
        Some((&c, rest)) => s.first() == Some(&c) && glob_match(rest, &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(s: &str) -> ImageRef {
        ImageRef::new(s).unwrap()
    }

    fn b64(s: &str) -> String {
        STANDARD.encode(s)
    }

    fn json_secret(auths: serde_json::Value) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([(
            ".dockerconfigjson".to_owned(),
            serde_json::to_vec(&serde_json::json!({ "auths": auths })).unwrap(),
        )])
    }

    fn user(k: &Keyring, image: &str) -> Option<String> {
        k.lookup(&img(image)).map(|c| c.username().to_owned())
    }

    #[test]
    fn the_most_specific_matching_key_wins() {
        let mut k = Keyring::default();
        let added = k
            .add_secret(
                DOCKER_CONFIG_JSON,
                &json_secret(serde_json::json!({
                    "r.io": {"auth": b64("host:pw")},
                    "https://r.io/team": {"username": "team", "password": "pw"},
                    "r.io/team/app": {"auth": b64("app:pw")},
                    "r.io:5000": {"auth": b64("port:pw")},
                    "*.cloud.example": {"auth": b64("glob:pw")},
                    "https://index.docker.io/v1/": {"auth": b64("hub:pw")},
                    "token.example": {"identitytoken": "abc"},
                })),
            )
            .unwrap();
        assert_eq!(added, 6, "the identity token entry is skipped");
        assert_eq!(user(&k, "r.io/team/app:v1"), Some("app".into()));
        assert_eq!(user(&k, "r.io/team/other:v1"), Some("team".into()));
        assert_eq!(user(&k, "r.io/solo"), Some("host".into()));
        assert_eq!(user(&k, "r.io:5000/team/app"), Some("port".into()));
        assert_eq!(user(&k, "r.io:5001/a"), None, "another port");
        assert_eq!(user(&k, "eu.cloud.example/a"), Some("glob".into()));
        assert_eq!(
            user(&k, "a.eu.cloud.example/a"),
            None,
            "label counts differ"
        );
        assert_eq!(user(&k, "nginx"), Some("hub".into()));
        assert_eq!(user(&k, "library/nginx:1"), Some("hub".into()));
        assert_eq!(user(&k, "docker.io/library/nginx"), Some("hub".into()));
        assert_eq!(user(&k, "other.io/a"), None);
    }

    #[test]
    fn legacy_dockercfg_and_bad_secrets() {
        let mut k = Keyring::default();
        let data = BTreeMap::from([(
            ".dockercfg".to_owned(),
            br#"{"ghcr.io": {"auth": "cm9ib3Q6cHc="}}"#.to_vec(),
        )]);
        assert_eq!(k.add_secret(DOCKER_CFG, &data), Ok(1));
        assert_eq!(user(&k, "ghcr.io/o/a"), Some("robot".into()));
        assert_eq!(k.lookup(&img("ghcr.io/o/a")).unwrap().password(), "pw");
        assert!(matches!(
            k.add_secret("Opaque", &data),
            Err(SecretError::WrongType(_))
        ));
        assert_eq!(
            k.add_secret(DOCKER_CONFIG_JSON, &data),
            Err(SecretError::Missing(".dockerconfigjson"))
        );
        let junk = BTreeMap::from([(".dockerconfigjson".to_owned(), b"{not json".to_vec())]);
        assert!(matches!(
            k.add_secret(DOCKER_CONFIG_JSON, &junk),
            Err(SecretError::Malformed(_))
        ));
        // Entries that give no usable login are skipped, not fatal.
        let odd = json_secret(serde_json::json!({
            "a.io": {"auth": "!!!"},
            "b.io": {"auth": b64("nocolon")},
            "c.io": {"username": "", "password": "x"},
        }));
        assert_eq!(k.add_secret(DOCKER_CONFIG_JSON, &odd), Ok(0));
    }

    #[test]
    fn keys_are_filed_as_the_kubelet_files_them() {
        assert_eq!(
            registry_key("https://index.docker.io/v1/"),
            Some("index.docker.io".into())
        );
        assert_eq!(
            registry_key("http://r.io/v2/team"),
            Some("r.io/team".into())
        );
        assert_eq!(registry_key("R.io:5000/"), Some("r.io:5000".into()));
        assert_eq!(registry_key("r.io/v1x"), Some("r.io/v1x".into()));
        assert_eq!(registry_key("https:///x"), None);
        assert!(glob_match(b"*", b"anything"));
        assert!(glob_match(b"eu-?", b"eu-1"));
        assert!(!glob_match(b"eu-?", b"eu-12"));
        assert!(glob_match(b"a*c", b"abbbc"));
        assert!(!glob_match(b"a*c", b"abbb"));
    }
}
