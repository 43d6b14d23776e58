//! The protocol between the activator (client) and the node agent: pure parsing and encoding,
//! no IO. Version 2 adds the image verbs; every v1 line is unchanged, byte for byte.
//!
//! ```text
//! request = ( "addr " uid / "ping" ) LF                ; v1: at most 64 bytes with the LF
//!         / "image " image-ref LF                      ; at most 262 bytes with the LF
//!         / "pull " image-ref [ " auth " credentials ] LF   ; at most 5727 bytes with the LF
//! answer  = ( "addr " ip / "none" / "pong" / "error " reason ) LF
//!         / "present " image-id " " size LF            ; answers `image`; `none` if absent
//!         / "pulled " image-id LF                      ; answers `pull`
//! uid     = 8hexl "-" 4hexl "-" 4hexl "-" 4hexl "-" 12hexl   ; hexl = 0-9 / a-f
//! ip      = an IPv4 or IPv6 address as Rust's `IpAddr` Display writes it
//! reason  = 1*200( %x20-7E )
//! size    = "0" / %x31-39 *19DIGIT                     ; a u64, no leading zero
//! ```
//!
//! `image-ref`, `credentials` and `image-id` are defined in [`crate::image`]. A pull's
//! failures are answered with one of the [`PullFailure`] reasons.
//!
//! Both sides parse strictly: one spelling per message, so what is accepted is exactly what
//! [`Request::encode`] / [`Answer::encode`] write, and a line that is not is refused whole
//! rather than repaired. The agent treats every byte from the activator as hostile; the
//! activator does not trust the agent's answers blindly either.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::error::ProtocolError;
use crate::image::{
    Credentials, ImageId, ImageInfo, ImageRef, MAX_CREDENTIALS_B64, MAX_IMAGE_ID, MAX_IMAGE_REF,
};

/// The longest v1 request line (`addr`, `ping`), "\n" included. `addr <36-byte uid>\n` is 42
/// bytes.
pub const MAX_REQUEST_LINE: usize = 64;

/// The longest `image` request line, "\n" included.
pub const MAX_IMAGE_LINE: usize = "image ".len() + MAX_IMAGE_REF + 1;

/// The longest `pull` request line, "\n" included: a reference and credentials, both at their
/// bounds.
pub const MAX_PULL_LINE: usize =
    "pull ".len() + MAX_IMAGE_REF + " auth ".len() + MAX_CREDENTIALS_B64 + 1;

/// The most the agent holds of one request line: the longest verb's bound. Each verb is then
/// held to its own bound, so an `addr` line of 65 bytes is still refused as too long.
pub const MAX_ANY_REQUEST_LINE: usize = MAX_PULL_LINE;

/// The longest reason in an `error` answer.
pub const MAX_REASON: usize = 200;

/// The longest `error` answer line, "\n" included.
pub const MAX_ERROR_LINE: usize = "error ".len() + MAX_REASON + 1;

/// The longest answer line, "\n" included: `present ` + an image id + a size (20 digits at
/// most). An `error` line (207 bytes) and an address answer (an IPv6 address is at most 45
/// characters) are shorter.
pub const MAX_ANSWER_LINE: usize = "present ".len() + MAX_IMAGE_ID + 1 + 20 + 1;

/// The length of a textual UUID.
pub const UID_LEN: usize = 36;

/// The reason the agent gives for any malformed request, before closing the connection.
pub const BAD_REQUEST: &str = "bad request";

/// A pod's UID: a lowercase RFC 4122 textual UUID (8-4-4-4-12 lowercase hex digits), which is
/// what the API server (and kubesim) assign. Valid by construction, so it can go into a CRI
/// label selector or onto the wire as it is.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(String);

impl PodUid {
    /// Checks the shape exactly; uppercase hex, braces, a missing dash or any other byte is
    /// refused (the API server never writes them, so their only source is a bug or an attack).
    pub fn new(uid: &str) -> Result<PodUid, ProtocolError> {
        if is_uid(uid.as_bytes()) {
            Ok(PodUid(uid.to_owned()))
        } else {
            Err(ProtocolError::BadUid)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn is_uid(b: &[u8]) -> bool {
    b.len() == UID_LEN
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
        })
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PodUid({})", self.0)
    }
}

impl FromStr for PodUid {
    type Err = ProtocolError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PodUid::new(s)
    }
}

impl AsRef<str> for PodUid {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A request from the activator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `addr <uid>`: the IP of the pod with this UID on this node.
    Addr(PodUid),
    /// `ping`: is the agent there.
    Ping,
    /// `image <ref>` (v2): does the runtime hold this image, and how big is it.
    Image(ImageRef),
    /// `pull <ref> [auth <credentials>]` (v2): have the runtime pull this image.
    Pull {
        image: ImageRef,
        auth: Option<Credentials>,
    },
}

impl Request {
    /// Parses one whole line, its "\n" included.
    pub fn parse(line: &[u8]) -> Result<Request, ProtocolError> {
        let max = if line.starts_with(b"pull ") {
            MAX_PULL_LINE
        } else if line.starts_with(b"image ") {
            MAX_IMAGE_LINE
        } else {
            MAX_REQUEST_LINE
        };
        if line.len() > max {
            return Err(ProtocolError::TooLong);
        }
        let body = line_body(line)?;
        if body == b"ping" {
            return Ok(Request::Ping);
        }
        if let Some(image) = body.strip_prefix(b"image ") {
            return ImageRef::from_bytes(image).map(Request::Image);
        }
        if let Some(args) = body.strip_prefix(b"pull ") {
            let (image, auth) = match find(args, b" auth ") {
                Some(at) => (&args[..at], Some(&args[at + b" auth ".len()..])),
                None => (args, None),
            };
            let image = ImageRef::from_bytes(image)?;
            let auth = auth.map(Credentials::decode).transpose()?;
            return Ok(Request::Pull { image, auth });
        }
        match body.strip_prefix(b"addr ") {
            // `is_uid` accepts ASCII only, so the bytes are valid UTF-8.
            Some(uid) if is_uid(uid) => std::str::from_utf8(uid)
                .map_err(|_| ProtocolError::BadUid)
                .and_then(PodUid::new)
                .map(Request::Addr),
            Some(_) => Err(ProtocolError::BadUid),
            None => Err(ProtocolError::UnknownVerb),
        }
    }

    /// The line, "\n" included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Request::Addr(uid) => format!("addr {uid}\n").into_bytes(),
            Request::Ping => b"ping\n".to_vec(),
            Request::Image(image) => format!("image {image}\n").into_bytes(),
            Request::Pull { image, auth: None } => format!("pull {image}\n").into_bytes(),
            Request::Pull {
                image,
                auth: Some(auth),
            } => format!("pull {image} auth {}\n", auth.encode()).into_bytes(),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// An answer from the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// `addr <ip>`: the pod's sandbox has this address.
    Addr(IpAddr),
    /// `none`: no ready sandbox with an address for that UID (yet).
    None,
    /// `pong`: the answer to `ping`.
    Pong,
    /// `error <reason>`: the request could not be answered. Built through [`Answer::error`] so
    /// the reason is always in the allowed charset and length.
    Error(String),
    /// `present <id> <size>` (v2): the runtime holds the image asked about.
    Present(ImageInfo),
    /// `pulled <id>` (v2): the pull asked for is done; the runtime calls the image this.
    Pulled(ImageId),
}

impl Answer {
    /// An `error` answer with `reason` made safe for the wire: bytes outside printable ASCII
    /// become '?', it is cut to [`MAX_REASON`] bytes, and an empty one becomes "error" —
    /// whatever a backend says, the line stays one valid line.
    pub fn error(reason: &str) -> Answer {
        Answer::Error(sanitise_reason(reason))
    }

    /// Parses one whole line, its "\n" included.
    pub fn parse(line: &[u8]) -> Result<Answer, ProtocolError> {
        if line.len() > MAX_ANSWER_LINE {
            return Err(ProtocolError::TooLong);
        }
        let body = line_body(line)?;
        match body {
            b"none" => return Ok(Answer::None),
            b"pong" => return Ok(Answer::Pong),
            _ => {}
        }
        if let Some(ip) = body.strip_prefix(b"addr ") {
            let text = std::str::from_utf8(ip).map_err(|_| ProtocolError::BadAddress)?;
            let addr: IpAddr = text.parse().map_err(|_| ProtocolError::BadAddress)?;
            // One spelling only: "::ffff:1.2.3.4" vs "::ffff:102:304", leading zeros and the
            // like are refused, so a parsed answer re-encodes to the bytes received.
            if addr.to_string() != text {
                return Err(ProtocolError::BadAddress);
            }
            return Ok(Answer::Addr(addr));
        }
        if let Some(reason) = body.strip_prefix(b"error ") {
            if reason.is_empty()
                || reason.len() > MAX_REASON
                || !reason.iter().all(|&b| is_reason_char(u32::from(b)))
            {
                return Err(ProtocolError::BadReason);
            }
            // All printable ASCII, so valid UTF-8.
            let text = std::str::from_utf8(reason).map_err(|_| ProtocolError::BadReason)?;
            return Ok(Answer::Error(text.to_owned()));
        }
        if let Some(id) = body.strip_prefix(b"pulled ") {
            return image_id(id).map(Answer::Pulled);
        }
        if let Some(args) = body.strip_prefix(b"present ") {
            let (id, size) = args
                .iter()
                .position(|&b| b == b' ')
                .map(|sp| (&args[..sp], &args[sp + 1..]))
                .ok_or(ProtocolError::BadImageId)?;
            return Ok(Answer::Present(ImageInfo {
                id: image_id(id)?,
                size: size_of(size)?,
            }));
        }
        Err(ProtocolError::UnknownVerb)
    }

    /// The line, "\n" included. An `Error` built directly with a bad reason is sanitised here
    /// as [`Answer::error`] would, so the agent can never write an invalid line.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Answer::Addr(ip) => format!("addr {ip}\n").into_bytes(),
            Answer::None => b"none\n".to_vec(),
            Answer::Pong => b"pong\n".to_vec(),
            Answer::Error(reason) => format!("error {}\n", sanitise_reason(reason)).into_bytes(),
            Answer::Present(info) => format!("present {} {}\n", info.id, info.size).into_bytes(),
            Answer::Pulled(id) => format!("pulled {id}\n").into_bytes(),
        }
    }
}

fn image_id(b: &[u8]) -> Result<ImageId, ProtocolError> {
    // `line_body` has already refused anything outside printable ASCII.
    std::str::from_utf8(b)
        .map_err(|_| ProtocolError::BadImageId)
        .and_then(ImageId::new)
}

/// A size in canonical decimal: no sign, no leading zero, fits a u64.
fn size_of(b: &[u8]) -> Result<u64, ProtocolError> {
    let canonical =
        !b.is_empty() && b.iter().all(u8::is_ascii_digit) && (b.len() == 1 || b[0] != b'0');
    if !canonical {
        return Err(ProtocolError::BadImageId);
    }
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ProtocolError::BadImageId)
}

/// Why a pull failed, as the agent says it in `error <reason>`. The reasons are few and fixed
/// so the activator can act on them (retry or not, which Event to write) and count them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PullFailure {
    /// `bad name`: the runtime or registry refused the reference itself.
    BadName,
    /// `not found`: no such repository, tag or digest.
    NotFound,
    /// `unauthorized`: the registry wants (other) credentials.
    Unauthorized,
    /// `runtime timeout`: the pull took longer than the agent's pull timeout.
    RuntimeTimeout,
    /// `runtime unreachable`: the runtime's socket did not answer.
    RuntimeUnreachable,
    /// `busy`: the agent already has its most pulls in flight.
    Busy,
    /// `runtime error <code>`: anything else, with the gRPC code (a registry that is down or
    /// slow, a full disk).
    Runtime(String),
    /// A reason this version does not know (an older or newer agent, a backend's own).
    Other(String),
}

impl PullFailure {
    pub const BAD_NAME: &'static str = "bad name";
    pub const NOT_FOUND: &'static str = "not found";
    pub const UNAUTHORIZED: &'static str = "unauthorized";
    pub const RUNTIME_TIMEOUT: &'static str = "runtime timeout";
    pub const RUNTIME_UNREACHABLE: &'static str = "runtime unreachable";
    pub const BUSY: &'static str = "busy";
    const RUNTIME_ERROR: &'static str = "runtime error ";

    /// The failure an `error` reason names.
    pub fn from_reason(reason: &str) -> PullFailure {
        match reason {
            Self::BAD_NAME => PullFailure::BadName,
            Self::NOT_FOUND => PullFailure::NotFound,
            Self::UNAUTHORIZED => PullFailure::Unauthorized,
            Self::RUNTIME_TIMEOUT => PullFailure::RuntimeTimeout,
            Self::RUNTIME_UNREACHABLE => PullFailure::RuntimeUnreachable,
            Self::BUSY => PullFailure::Busy,
            other => match other.strip_prefix(Self::RUNTIME_ERROR) {
                Some(code) => PullFailure::Runtime(code.to_owned()),
                None => PullFailure::Other(other.to_owned()),
            },
        }
    }

    /// The reason as the agent writes it.
    pub fn reason(&self) -> String {
        match self {
            PullFailure::BadName => Self::BAD_NAME.into(),
            PullFailure::NotFound => Self::NOT_FOUND.into(),
            PullFailure::Unauthorized => Self::UNAUTHORIZED.into(),
            PullFailure::RuntimeTimeout => Self::RUNTIME_TIMEOUT.into(),
            PullFailure::RuntimeUnreachable => Self::RUNTIME_UNREACHABLE.into(),
            PullFailure::Busy => Self::BUSY.into(),
            PullFailure::Runtime(code) => format!("{}{code}", Self::RUNTIME_ERROR),
            PullFailure::Other(reason) => reason.clone(),
        }
    }

    /// Whether trying again later may succeed with nothing changed. The image's name and the
    /// registry's answer about it do not change by themselves: those wait for a new image or
    /// new credentials.
    pub fn is_transient(&self) -> bool {
        !matches!(
            self,
            PullFailure::BadName | PullFailure::NotFound | PullFailure::Unauthorized
        )
    }
}

fn sanitise_reason(reason: &str) -> String {
    let mut clean: String = reason
        .chars()
        .map(|c| if is_reason_char(c as u32) { c } else { '?' })
        .take(MAX_REASON)
        .collect();
    if clean.is_empty() {
        clean.push_str("error");
    }
    clean
}

fn is_reason_char(c: u32) -> bool {
    (0x20..=0x7e).contains(&c)
}

/// The line without its "\n"; refuses a missing terminator, an empty line and any byte that
/// is not printable ASCII (which covers "\r", tabs, NUL, other control bytes and non-ASCII).
fn line_body(line: &[u8]) -> Result<&[u8], ProtocolError> {
    let body = line
        .strip_suffix(b"\n")
        .ok_or(ProtocolError::Unterminated)?;
    if body.is_empty() {
        return Err(ProtocolError::Empty);
    }
    if !body.iter().all(|&b| is_reason_char(u32::from(b))) {
        return Err(ProtocolError::BadByte);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    fn req(line: &str) -> Result<Request, ProtocolError> {
        Request::parse(line.as_bytes())
    }

    #[test]
    fn accepts_the_two_requests() {
        assert_eq!(req("ping\n"), Ok(Request::Ping));
        assert_eq!(
            req(&format!("addr {UID}\n")),
            Ok(Request::Addr(PodUid::new(UID).unwrap()))
        );
    }

    #[test]
    fn refuses_every_malformed_request_shape() {
        let long = format!("addr {UID}{}\n", "0".repeat(64));
        let cases: Vec<(String, ProtocolError)> = vec![
            (long, ProtocolError::TooLong),
            ("".into(), ProtocolError::Unterminated),
            ("\n".into(), ProtocolError::Empty),
            ("ping".into(), ProtocolError::Unterminated),
            (format!("addr {UID}"), ProtocolError::Unterminated),
            ("ping\r\n".into(), ProtocolError::BadByte),
            (format!("addr {UID}\r\n"), ProtocolError::BadByte),
            ("pi\0ng\n".into(), ProtocolError::BadByte),
            ("ping\t\n".into(), ProtocolError::BadByte),
            (format!("addr\t{UID}\n"), ProtocolError::BadByte),
            ("pïng\n".into(), ProtocolError::BadByte),
            ("PING\n".into(), ProtocolError::UnknownVerb),
            ("pong\n".into(), ProtocolError::UnknownVerb),
            ("ping \n".into(), ProtocolError::UnknownVerb),
            (" ping\n".into(), ProtocolError::UnknownVerb),
            ("ping\nping\n".into(), ProtocolError::BadByte),
            (format!("ADDR {UID}\n"), ProtocolError::UnknownVerb),
            (format!("addr  {UID}\n"), ProtocolError::BadUid),
            (format!("addr {UID} \n"), ProtocolError::BadUid),
            (
                format!("addr {}\n", UID.to_uppercase()),
                ProtocolError::BadUid,
            ),
            (format!("addr {}\n", &UID[..35]), ProtocolError::BadUid),
            (format!("addr {UID}0\n"), ProtocolError::BadUid),
            (format!("addr {{{UID}}}\n"), ProtocolError::BadUid),
            (
                format!("addr {}\n", UID.replace('-', "")),
                ProtocolError::BadUid,
            ),
            (
                "addr 0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fg\n".into(),
                ProtocolError::BadUid,
            ),
            (
                "addr 0f1e2d3c4-b5a-6978-8796-a5b4c3d2e1f0\n".into(),
                ProtocolError::BadUid,
            ),
            ("addr \n".into(), ProtocolError::BadUid),
            ("addr\n".into(), ProtocolError::UnknownVerb),
        ];
        for (line, want) in cases {
            assert_eq!(req(&line), Err(want), "{line:?}");
        }
        // Non-UTF-8 bytes.
        assert_eq!(
            Request::parse(b"addr \xff\xfe\n"),
            Err(ProtocolError::BadByte)
        );
    }

    #[test]
    fn the_limit_is_inclusive_of_the_newline() {
        let at_limit = vec![b'x'; MAX_REQUEST_LINE - 1]
            .into_iter()
            .chain([b'\n'])
            .collect::<Vec<_>>();
        // 64 bytes: judged on its content, not refused for length.
        assert_eq!(Request::parse(&at_limit), Err(ProtocolError::UnknownVerb));
        let over = [b"x".as_slice(), &at_limit].concat();
        assert_eq!(Request::parse(&over), Err(ProtocolError::TooLong));
    }

    #[test]
    fn pod_uid_validates_on_construction() {
        assert_eq!(PodUid::new(UID).unwrap().as_str(), UID);
        assert_eq!(UID.parse::<PodUid>().unwrap().to_string(), UID);
        for bad in [
            "",
            "not-a-uid",
            &UID.to_uppercase(),
            &UID[1..],
            &format!("{UID} "),
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f\u{e9}",
            "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0",
        ] {
            assert_eq!(PodUid::new(bad), Err(ProtocolError::BadUid), "{bad:?}");
        }
    }

    #[test]
    fn requests_round_trip() {
        for r in [Request::Ping, Request::Addr(PodUid::new(UID).unwrap())] {
            let line = r.encode();
            assert!(line.len() <= MAX_REQUEST_LINE);
            assert_eq!(Request::parse(&line), Ok(r));
        }
    }

    #[test]
    fn answers_round_trip() {
        let answers = [
            Answer::Addr(IpAddr::V4(Ipv4Addr::new(10, 244, 1, 7))),
            Answer::Addr(IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x17))),
            Answer::Addr(IpAddr::V6(Ipv6Addr::new(
                0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff,
            ))),
            Answer::Addr("::ffff:192.168.1.1".parse().unwrap()),
            Answer::None,
            Answer::Pong,
            Answer::error("runtime unreachable"),
            Answer::error(&"x".repeat(MAX_REASON)),
        ];
        for a in answers {
            let line = a.encode();
            assert!(line.len() <= MAX_ANSWER_LINE, "{line:?}");
            assert_eq!(Answer::parse(&line), Ok(a));
        }
    }

    #[test]
    fn answer_parse_refuses_bad_addresses() {
        for line in [
            "addr 999.1.1.1\n",
            "addr 10.0.0\n",
            "addr 10.0.0.01\n",
            "addr 010.0.0.1\n",
            "addr \n",
            "addr  10.0.0.1\n",
            "addr 10.0.0.1 \n",
            "addr 10.0.0.1:80\n",
            "addr [::1]\n",
            "addr fd00::\u{30}0:17\n",
            "addr FD00::17\n",
            "addr fd00:0:0:0:0:0:0:17\n",
            "addr ::ffff:102:304\n",
            "addr localhost\n",
        ] {
            assert!(Answer::parse(line.as_bytes()).is_err(), "{line:?}");
        }
    }

    #[test]
    fn answer_parse_refuses_bad_reasons_and_shapes() {
        let over = format!("error {}\n", "x".repeat(MAX_REASON + 1));
        assert_eq!(
            Answer::parse(over.as_bytes()),
            Err(ProtocolError::BadReason)
        );
        let over = format!("error {}\n", "x".repeat(MAX_ANSWER_LINE));
        assert_eq!(Answer::parse(over.as_bytes()), Err(ProtocolError::TooLong));
        for line in [
            "error \n",
            "error\n",
            "error bad\treason\n",
            "error bad\u{7f}reason\n",
            "error bad\0reason\n",
            "error caf\u{e9}\n",
            "error bad\r\n",
            "pong\r\n",
            "pong",
            "\n",
            "PONG\n",
            "none \n",
            "ok\n",
            "pong\npong\n",
        ] {
            assert!(Answer::parse(line.as_bytes()).is_err(), "{line:?}");
        }
    }

    #[test]
    fn error_reasons_are_sanitised_for_the_wire() {
        let a = Answer::error(&format!("line\nbreak\r\0é{}", "y".repeat(300)));
        let line = a.encode();
        assert_eq!(line.len(), MAX_ERROR_LINE);
        assert_eq!(Answer::parse(&line), Ok(a));
        assert!(line.starts_with(b"error line?break???"));
        // An Error built directly, bypassing the constructor, is still encoded validly.
        let raw = Answer::Error("a\nb".into()).encode();
        assert_eq!(raw, b"error a?b\n");
        assert_eq!(Answer::Error(String::new()).encode(), b"error error\n");
    }

    const IMG: &str = "registry.example.com:5000/team/app:v1";

    fn image(s: &str) -> ImageRef {
        ImageRef::new(s).unwrap()
    }

    #[test]
    fn accepts_the_v2_requests() {
        assert_eq!(
            req(&format!("image {IMG}\n")),
            Ok(Request::Image(image(IMG)))
        );
        assert_eq!(
            req(&format!("pull {IMG}\n")),
            Ok(Request::Pull {
                image: image(IMG),
                auth: None
            })
        );
        let auth = Credentials::new("robot", "s3cret").unwrap();
        assert_eq!(
            req(&format!("pull {IMG} auth {}\n", auth.encode())),
            Ok(Request::Pull {
                image: image(IMG),
                auth: Some(auth)
            })
        );
    }

    #[test]
    fn refuses_every_malformed_v2_request() {
        let auth = Credentials::new("u", "p").unwrap().encode();
        let long_ref = format!("r.io/{}", "a".repeat(MAX_IMAGE_REF));
        let cases: Vec<(String, ProtocolError)> = vec![
            (format!("image {long_ref}\n"), ProtocolError::TooLong),
            (format!("pull {long_ref}\n"), ProtocolError::BadImage),
            (
                format!("pull {IMG} auth {}\n", "A".repeat(MAX_PULL_LINE)),
                ProtocolError::TooLong,
            ),
            ("image Nginx\n".into(), ProtocolError::BadImage),
            ("pull NGINX\n".into(), ProtocolError::BadImage),
            ("image \n".into(), ProtocolError::BadImage),
            ("pull \n".into(), ProtocolError::BadImage),
            ("image\n".into(), ProtocolError::UnknownVerb),
            ("pull\n".into(), ProtocolError::UnknownVerb),
            ("PULL nginx\n".into(), ProtocolError::UnknownVerb),
            ("pull  nginx\n".into(), ProtocolError::BadImage),
            ("pull nginx \n".into(), ProtocolError::BadImage),
            ("pull nginx@sha256:abc\n".into(), ProtocolError::BadImage),
            (
                format!("pull nginx@sha256:{}\n", "A".repeat(64)),
                ProtocolError::BadImage,
            ),
            ("pull ngi\0nx\n".into(), ProtocolError::BadByte),
            ("pull nginx\r\n".into(), ProtocolError::BadByte),
            ("pull nginx\x1b[31m\n".into(), ProtocolError::BadByte),
            ("pull nginx\nping\n".into(), ProtocolError::BadByte),
            ("pull nginx auth \n".into(), ProtocolError::BadCredentials),
            ("pull nginx auth\n".into(), ProtocolError::BadImage),
            (
                format!("pull nginx auth {auth} \n"),
                ProtocolError::BadCredentials,
            ),
            (
                format!("pull nginx auth {auth} auth {auth}\n"),
                ProtocolError::BadCredentials,
            ),
            (
                "pull nginx auth !!!!\n".into(),
                ProtocolError::BadCredentials,
            ),
            (
                format!("pull nginx token {auth}\n"),
                ProtocolError::BadImage,
            ),
            (
                format!("image nginx auth {auth}\n"),
                ProtocolError::BadImage,
            ),
            (format!("pull auth {auth}\n"), ProtocolError::BadImage),
        ];
        for (line, want) in cases {
            assert_eq!(req(&line), Err(want), "{line:?}");
        }
    }

    #[test]
    fn each_verb_has_its_own_line_limit() {
        // A v1 verb is still held to 64 bytes, though the agent reads up to the pull bound.
        let addr = format!("addr {UID}{}\n", " ".repeat(MAX_REQUEST_LINE));
        assert_eq!(req(&addr), Err(ProtocolError::TooLong));
        let longest = Request::Pull {
            image: image(&format!("r.io/{}", "a".repeat(MAX_IMAGE_REF - 5))),
            auth: Some(
                Credentials::new("u", &"p".repeat(crate::image::MAX_CREDENTIALS - 2)).unwrap(),
            ),
        };
        let line = longest.encode();
        assert_eq!(line.len(), MAX_PULL_LINE);
        assert_eq!(Request::parse(&line), Ok(longest));
        let longest_image = Request::Image(image(&format!("r.io/{}", "a".repeat(250))));
        assert_eq!(longest_image.encode().len(), MAX_IMAGE_LINE);
    }

    #[test]
    fn v2_answers_round_trip_and_refuse_bad_shapes() {
        let id = ImageId::new("sha256:0123abcd").unwrap();
        for a in [
            Answer::Pulled(id.clone()),
            Answer::Present(ImageInfo {
                id: id.clone(),
                size: 0,
            }),
            Answer::Present(ImageInfo {
                id: ImageId::new(&"x".repeat(MAX_IMAGE_ID)).unwrap(),
                size: u64::MAX,
            }),
        ] {
            let line = a.encode();
            assert!(line.len() <= MAX_ANSWER_LINE, "{line:?}");
            assert_eq!(Answer::parse(&line), Ok(a));
        }
        for line in [
            "pulled \n",
            "pulled a b\n",
            "pulled\n",
            "present sha256:x\n",
            "present sha256:x \n",
            "present sha256:x 01\n",
            "present sha256:x -1\n",
            "present sha256:x +1\n",
            "present sha256:x 18446744073709551616\n",
            "present sha256:x 1 2\n",
            "present  1\n",
        ] {
            assert!(Answer::parse(line.as_bytes()).is_err(), "{line:?}");
        }
    }

    #[test]
    fn pull_failures_round_trip_through_their_reasons() {
        for f in [
            PullFailure::BadName,
            PullFailure::NotFound,
            PullFailure::Unauthorized,
            PullFailure::RuntimeTimeout,
            PullFailure::RuntimeUnreachable,
            PullFailure::Busy,
            PullFailure::Runtime("Internal".into()),
            PullFailure::Other("backend timeout".into()),
        ] {
            assert_eq!(PullFailure::from_reason(&f.reason()), f);
        }
        assert!(!PullFailure::NotFound.is_transient());
        assert!(!PullFailure::Unauthorized.is_transient());
        assert!(!PullFailure::BadName.is_transient());
        assert!(PullFailure::RuntimeTimeout.is_transient());
        assert!(PullFailure::Runtime("Unknown".into()).is_transient());
    }

    proptest! {
        #[test]
        fn request_parse_never_panics_and_accepted_lines_re_encode(
            bytes in proptest::collection::vec(any::<u8>(), 0..100)
        ) {
            if let Ok(r) = Request::parse(&bytes) {
                prop_assert_eq!(r.encode(), bytes);
            }
        }

        #[test]
        fn request_parse_on_near_misses(
            // Mutations of a valid line find the interesting cases far more often than
            // uniform bytes do.
            pos in 0usize..42, byte in any::<u8>()
        ) {
            let mut line = format!("addr {UID}\n").into_bytes();
            line[pos] = byte;
            if let Ok(r) = Request::parse(&line) {
                prop_assert_eq!(r.encode(), line);
            }
        }

        #[test]
        fn answer_parse_never_panics_and_accepted_lines_re_encode(
            bytes in proptest::collection::vec(any::<u8>(), 0..260)
        ) {
            if let Ok(a) = Answer::parse(&bytes) {
                prop_assert_eq!(a.encode(), bytes);
            }
        }

        #[test]
        fn every_address_round_trips(v6 in any::<[u8; 16]>(), v4 in any::<[u8; 4]>()) {
            for ip in [IpAddr::from(v6), IpAddr::from(v4)] {
                let a = Answer::Addr(ip);
                prop_assert_eq!(Answer::parse(&a.encode()), Ok(a));
            }
        }

        #[test]
        fn v2_requests_round_trip(
            host in "[a-z0-9]{1,10}(\\.[a-z0-9]{1,5}){0,2}",
            port in proptest::option::of(1u16..),
            path in proptest::collection::vec("[a-z0-9]{1,8}([._-][a-z0-9]{1,8})?", 1..4),
            tag in proptest::option::of("[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}"),
            digest in proptest::option::of("[0-9a-f]{64}"),
            auth in proptest::option::of(("[^:\\p{Cc}]{1,20}", "[^\\p{Cc}]{0,40}")),
        ) {
            let mut s = format!("{host}.io");
            if let Some(p) = port {
                s.push_str(&format!(":{p}"));
            }
            s = format!("{s}/{}", path.join("/"));
            if let Some(t) = tag {
                s.push_str(&format!(":{t}"));
            }
            if let Some(d) = digest {
                s.push_str(&format!("@sha256:{d}"));
            }
            let image = ImageRef::new(&s).unwrap();
            let auth = auth.map(|(u, p)| Credentials::new(&u, &p).unwrap());
            for r in [Request::Image(image.clone()), Request::Pull { image, auth }] {
                let line = r.encode();
                prop_assert_eq!(Request::parse(&line), Ok(r));
            }
        }

        #[test]
        fn v2_request_parse_on_near_misses(
            pos in 0usize..100, byte in any::<u8>(), cut in 0usize..100
        ) {
            let auth = Credentials::new("robot", "pw").unwrap().encode();
            let mut line = format!("pull ghcr.io/o/app:v1@sha256:{} auth {auth}\n", "ab".repeat(32))
                .into_bytes();
            let pos = pos % line.len();
            line[pos] = byte;
            if let Ok(r) = Request::parse(&line) {
                prop_assert_eq!(r.encode(), line.clone());
            }
            line.truncate(cut.min(line.len()));
            line.push(b'\n');
            if let Ok(r) = Request::parse(&line) {
                prop_assert_eq!(r.encode(), line);
            }
        }
    }
}
