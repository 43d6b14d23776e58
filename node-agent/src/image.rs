//! The values of protocol v2's image verbs (`image`, `pull`): an image reference, the
//! credentials a pull may carry, and the image id the runtime answers with. Pure: no IO.
//!
//! ```text
//! image-ref   = name [ ":" tag ] [ "@" digest ]                ; at most 255 bytes in all
//! name        = [ domain "/" ] path
//! domain      = host [ ":" port ]                              ; only when the first
//!               ; component has a "." or a ":" or is "localhost", and more components follow
//! host        = label *( "." label )
//! label       = lower-alnum [ *( lower-alnum / "-" ) lower-alnum ]
//! port        = 1-65535 in decimal, no leading zero
//! path        = component *( "/" component )
//! component   = 1*lower-alnum *( separator 1*lower-alnum )
//! separator   = "." / "_" / "__" / 1*"-"
//! tag         = ( ALPHA / DIGIT / "_" ) *127( ALPHA / DIGIT / "_" / "." / "-" )
//! digest      = "sha256:" 64( DIGIT / %x61-66 )
//! lower-alnum = %x61-7A / DIGIT
//! credentials = base64( username ":" password )   ; RFC 4648 standard alphabet, padded,
//!               ; canonical; decoded at most 4096 bytes of UTF-8 without control characters;
//!               ; username non-empty, without ":"
//! image-id    = 1*255( %x21-7E )
//! ```
//!
//! This is the distribution reference grammar with its leniencies removed: a lowercase host
//! (the grammar allows uppercase there; no registry needs it), no bracketed IPv6 host, and a
//! sha256 digest only (what every registry serves). Nothing is normalised: `nginx` stays
//! `nginx` (the runtime expands it to `docker.io/library/nginx:latest` as the kubelet's would),
//! so each accepted value has exactly one spelling and re-encodes to the bytes received.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::error::ProtocolError;

/// The longest image reference, name, tag and digest together.
pub const MAX_IMAGE_REF: usize = 255;
/// The longest tag (the distribution grammar's bound).
pub const MAX_TAG: usize = 128;
/// The longest `username:password`, decoded. Registry tokens used as passwords (a cloud
/// registry's short-lived token) run to 2-3 KiB.
pub const MAX_CREDENTIALS: usize = 4096;
/// The longest base64 of [`MAX_CREDENTIALS`] bytes, padded.
pub const MAX_CREDENTIALS_B64: usize = MAX_CREDENTIALS.div_ceil(3) * 4;
/// The longest image id the agent passes on from the runtime.
pub const MAX_IMAGE_ID: usize = 255;

/// An image reference in the strict grammar above. Valid by construction.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageRef(String);

impl ImageRef {
    pub fn new(s: &str) -> Result<ImageRef, ProtocolError> {
        if is_image_ref(s.as_bytes()) {
            Ok(ImageRef(s.to_owned()))
        } else {
            Err(ProtocolError::BadImage)
        }
    }

    pub(crate) fn from_bytes(b: &[u8]) -> Result<ImageRef, ProtocolError> {
        // The grammar admits ASCII only, so accepted bytes are valid UTF-8.
        let s = std::str::from_utf8(b).map_err(|_| ProtocolError::BadImage)?;
        ImageRef::new(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The registry part (`host[:port]`), when the reference names one; `None` means the
    /// runtime's default registry (Docker Hub).
    pub fn domain(&self) -> Option<&str> {
        let name = self.name();
        let (first, _) = name.split_once('/')?;
        is_domain_like(first).then_some(first)
    }

    /// The repository path after the domain (or the whole name without one).
    pub fn path(&self) -> &str {
        let name = self.name();
        match self.domain() {
            Some(d) => &name[d.len() + 1..],
            None => name,
        }
    }

    /// The name without tag and digest.
    fn name(&self) -> &str {
        let no_digest = self.0.split_once('@').map_or(self.0.as_str(), |(n, _)| n);
        match no_digest.rfind(':') {
            Some(c) if c > no_digest.rfind('/').unwrap_or(0) => &no_digest[..c],
            _ => no_digest,
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImageRef({})", self.0)
    }
}

fn is_domain_like(first: &str) -> bool {
    first.contains('.') || first.contains(':') || first == "localhost"
}

fn is_image_ref(b: &[u8]) -> bool {
    if b.is_empty() || b.len() > MAX_IMAGE_REF || !b.is_ascii() {
        return false;
    }
    let (rest, digest) = match b.iter().position(|&c| c == b'@') {
        Some(at) => (&b[..at], Some(&b[at + 1..])),
        None => (b, None),
    };
    if let Some(d) = digest
        && !is_digest(d)
    {
        return false;
    }
    let last_slash = rest.iter().rposition(|&c| c == b'/');
    let (name, tag) = match rest.iter().rposition(|&c| c == b':') {
        Some(c) if last_slash.is_none_or(|s| c > s) => (&rest[..c], Some(&rest[c + 1..])),
        _ => (rest, None),
    };
    if let Some(t) = tag
        && !is_tag(t)
    {
        return false;
    }
    let mut parts = name.split(|&c| c == b'/').peekable();
    let Some(first) = parts.next() else {
        return false;
    };
    let first_is_domain = parts.peek().is_some()
        && (first.contains(&b'.') || first.contains(&b':') || first == b"localhost");
    if first_is_domain {
        if !is_domain(first) {
            return false;
        }
    } else if !is_component(first) {
        return false;
    }
    parts.all(is_component)
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_digest(d: &[u8]) -> bool {
    d.strip_prefix(b"sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .iter()
                .all(|&c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    })
}

fn is_tag(t: &[u8]) -> bool {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    !t.is_empty()
        && t.len() <= MAX_TAG
        && word(t[0])
        && t[1..].iter().all(|&c| word(c) || c == b'.' || c == b'-')
}

fn is_domain(d: &[u8]) -> bool {
    let (host, port) = match d.iter().position(|&c| c == b':') {
        Some(c) => (&d[..c], Some(&d[c + 1..])),
        None => (d, None),
    };
    if let Some(p) = port {
        let ok = !p.is_empty()
            && p.len() <= 5
            && p[0] != b'0'
            && p.iter().all(u8::is_ascii_digit)
            && std::str::from_utf8(p)
                .ok()
                .and_then(|s| s.parse::<u16>().ok())
                .is_some();
        if !ok {
            return false;
        }
    }
    !host.is_empty()
        && host.split(|&c| c == b'.').all(|label| {
            !label.is_empty()
                && is_lower_alnum(label[0])
                && is_lower_alnum(label[label.len() - 1])
                && label.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        })
}

/// `1*lower-alnum *( separator 1*lower-alnum )`, separator `.`, `_`, `__` or a run of `-`.
fn is_component(c: &[u8]) -> bool {
    if c.is_empty() || !is_lower_alnum(c[0]) || !is_lower_alnum(c[c.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < c.len() {
        if is_lower_alnum(c[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < c.len() && !is_lower_alnum(c[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = matches!(sep, b"." | b"_" | b"__") || sep.iter().all(|&s| s == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// A registry login for one pull: `username:password`, as a dockerconfigjson `auth` field
/// holds it. Its Debug never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    username: String,
    password: String,
}

impl Credentials {
    pub fn new(username: &str, password: &str) -> Result<Credentials, ProtocolError> {
        let ok = !username.is_empty()
            && !username.contains(':')
            && username.len() + 1 + password.len() <= MAX_CREDENTIALS
            && !username
                .chars()
                .chain(password.chars())
                .any(char::is_control);
        if ok {
            Ok(Credentials {
                username: username.to_owned(),
                password: password.to_owned(),
            })
        } else {
            Err(ProtocolError::BadCredentials)
        }
    }

    pub fn username(&self) -> &str {
        &self.username
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    /// The base64 of `username:password`, as it goes on the wire.
    pub fn encode(&self) -> String {
        STANDARD.encode(format!("{}:{}", self.username, self.password))
    }

    /// Parses the wire form strictly: canonical padded base64 of valid credentials.
    pub fn decode(b64: &[u8]) -> Result<Credentials, ProtocolError> {
        if b64.is_empty() || b64.len() > MAX_CREDENTIALS_B64 {
            return Err(ProtocolError::BadCredentials);
        }
        let raw = STANDARD
            .decode(b64)
            .map_err(|_| ProtocolError::BadCredentials)?;
        let text = String::from_utf8(raw).map_err(|_| ProtocolError::BadCredentials)?;
        let (user, pass) = text.split_once(':').ok_or(ProtocolError::BadCredentials)?;
        let c = Credentials::new(user, pass)?;
        // One spelling: the engine refuses non-canonical padding and trailing bits; checked
        // again here so the property "accepted re-encodes to the bytes received" holds.
        if c.encode().as_bytes() != b64 {
            return Err(ProtocolError::BadCredentials);
        }
        Ok(c)
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// What the runtime calls an image (`sha256:...` from containerd, an id or a reference from
/// others): 1 to 255 bytes of visible ASCII, no space.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ImageId(String);

impl ImageId {
    pub fn new(s: &str) -> Result<ImageId, ProtocolError> {
        let b = s.as_bytes();
        if !b.is_empty() && b.len() <= MAX_IMAGE_ID && b.iter().all(|c| (0x21..=0x7e).contains(c)) {
            Ok(ImageId(s.to_owned()))
        } else {
            Err(ProtocolError::BadImageId)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ImageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ImageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImageId({})", self.0)
    }
}

/// An image the runtime holds: its id and size in bytes (CRI `ImageStatus`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    pub id: ImageId,
    pub size: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn accepts_the_references_the_kubelet_sees() {
        for good in [
            "nginx",
            "nginx:1.27",
            "library/nginx:latest",
            "docker.io/library/nginx:1.27-alpine",
            "ghcr.io/owner/app",
            "registry.example.com:5000/team/app:v1.2.3",
            "localhost/app",
            "localhost:5000/app:dev",
            "10.0.0.1:5000/app",
            "my-registry.internal/a/b/c/d:TAG_x.y-z",
            "app__x/a-b--c/a.b_c",
            &format!("nginx@{DIGEST}"),
            &format!("ghcr.io/o/app:v1@{DIGEST}"),
            &format!("a:{}", "t".repeat(MAX_TAG)),
        ] {
            assert!(ImageRef::new(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn refuses_every_malformed_reference() {
        let long = format!("r.io/{}", "a".repeat(MAX_IMAGE_REF));
        for bad in [
            "",
            long.as_str(),
            "Nginx",
            "nginx:",
            ":tag",
            "nginx:-x",
            "nginx:.x",
            &format!("a:{}", "t".repeat(MAX_TAG + 1)),
            "ghcr.io/Owner/app",
            "GHCR.io/owner/app",
            "ghcr.io//app",
            "ghcr.io/app/",
            "/app",
            "ghcr.io:/app",
            "ghcr.io:0/app",
            "ghcr.io:05000/app",
            "ghcr.io:70000/app",
            "ghcr.io:50a/app",
            "-ghcr.io/app",
            "ghcr-.io/app",
            "gh..io/app",
            "[::1]:5000/app",
            "app-/x",
            "a...b",
            "a___b",
            "a._b",
            "nginx@sha256:abc",
            &format!("nginx@{}", DIGEST.to_uppercase()),
            &format!("nginx@{}", DIGEST.replace("sha256", "sha512")),
            &format!("nginx@{DIGEST}0"),
            &format!("nginx@{DIGEST}@{DIGEST}"),
            "nginx@",
            "nginx latest",
            "nginx\0",
            "ngïnx",
            "nginx\t",
            "a:b:c",
            "ghcr.io/app:v1/x",
        ] {
            assert_eq!(ImageRef::new(bad), Err(ProtocolError::BadImage), "{bad:?}");
        }
    }

    #[test]
    fn the_domain_is_only_a_first_component_that_looks_like_one() {
        let d = |s: &str| ImageRef::new(s).unwrap().domain().map(str::to_owned);
        assert_eq!(d("nginx"), None);
        assert_eq!(d("library/nginx"), None);
        assert_eq!(d("ghcr.io/o/a:v1"), Some("ghcr.io".into()));
        assert_eq!(d("localhost:5000/a"), Some("localhost:5000".into()));
        assert_eq!(d("localhost/a"), Some("localhost".into()));
        assert_eq!(
            d(&format!("r.io:443/a:t@{DIGEST}")),
            Some("r.io:443".into())
        );
        let p = |s: &str| ImageRef::new(s).unwrap().path().to_owned();
        assert_eq!(p("ghcr.io/o/a:v1"), "o/a");
        assert_eq!(p(&format!("nginx:1@{DIGEST}")), "nginx");
        assert_eq!(p("r.io:5000/a/b"), "a/b");
    }

    #[test]
    fn credentials_are_strict_and_never_shown() {
        let c = Credentials::new("robot$ci", "pa:ss word é").unwrap();
        assert_eq!(Credentials::decode(c.encode().as_bytes()), Ok(c.clone()));
        assert!(!format!("{c:?}").contains("pa:ss"));
        for (user, pass) in [("", "x"), ("a:b", "x"), ("a", "x\ny"), ("a\0", "x")] {
            assert!(Credentials::new(user, pass).is_err(), "{user:?}");
        }
        assert!(Credentials::new("u", &"p".repeat(MAX_CREDENTIALS - 2)).is_ok());
        assert!(Credentials::new("u", &"p".repeat(MAX_CREDENTIALS - 1)).is_err());
        let b64 = |s: &str| STANDARD.encode(s);
        for bad in [
            String::new(),
            b64("nocolon"),
            b64(":nouser"),
            b64("u:p\u{7f}"),
            // Not UTF-8.
            STANDARD.encode([b'u', b':', 0xff]),
            // Unpadded, URL-safe alphabet, whitespace, non-canonical trailing bits.
            b64("u:pw").trim_end_matches('=').to_owned(),
            STANDARD
                .encode("u:p>>>?")
                .replace('+', "-")
                .replace('/', "_"),
            format!("{} ", b64("u:p")),
            "dTp=".into(),
            "dTpw=".into(),
            "dTpxx===".into(),
            "A".repeat(MAX_CREDENTIALS_B64 + 4),
        ] {
            assert_eq!(
                Credentials::decode(bad.as_bytes()),
                Err(ProtocolError::BadCredentials),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn image_ids_are_visible_ascii() {
        assert!(ImageId::new(DIGEST).is_ok());
        for bad in ["", "a b", "a\n", "é", &"x".repeat(MAX_IMAGE_ID + 1)] {
            assert!(ImageId::new(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn accepted_references_are_bounded_and_canonical(s in "[a-zA-Z0-9._:/@-]{0,80}") {
            if let Ok(r) = ImageRef::new(&s) {
                prop_assert_eq!(r.as_str(), s.as_str());
                prop_assert!(s.len() <= MAX_IMAGE_REF);
                prop_assert!(!s.starts_with('/') && !s.ends_with('/'));
            }
        }

        #[test]
        fn credentials_round_trip(user in "[^:\\p{Cc}]{1,40}", pass in "[^\\p{Cc}]{0,60}") {
            let c = Credentials::new(&user, &pass).unwrap();
            prop_assert_eq!(Credentials::decode(c.encode().as_bytes()), Ok(c));
        }

        #[test]
        fn decode_never_panics_and_accepts_only_canonical(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(c) = Credentials::decode(&b) {
                prop_assert_eq!(c.encode().into_bytes(), b);
            }
        }
    }
}
