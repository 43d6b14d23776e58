//! Which responses stream by design, and so are not bounded by the revision's
//! `timeoutSeconds` as a whole (only by the body idle timeout): both request paths ask here.
//!
//! Told apart by what the app declares, never by how it behaves: a response whose
//! `Content-Type` is `text/event-stream` (server-sent events) or `application/grpc*` (a gRPC
//! stream over HTTP/1.1 is rare, over h2c it goes through hyper's path but the rule is the
//! same). An upgraded connection (a websocket: `101 Switching Protocols`) is a tunnel, not a
//! response, and is never bounded by the timeout either. Everything else — a download, a
//! chunked answer, one that ends at close — must end within the revision's timeout.

/// Whether a `Content-Type` value names a stream.
pub fn is_streaming_type(value: &[u8]) -> bool {
    let essence = value
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    essence.eq_ignore_ascii_case(b"text/event-stream")
        || (essence.len() >= 16
            && essence[..16].eq_ignore_ascii_case(b"application/grpc")
            && matches!(essence.get(16), None | Some(b'+' | b'-')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_streams_and_grpc_stream_and_nothing_else_does() {
        for yes in [
            &b"text/event-stream"[..],
            b"Text/Event-Stream; charset=utf-8",
            b"application/grpc",
            b"application/grpc+proto",
            b" application/grpc-web ",
        ] {
            assert!(is_streaming_type(yes), "{yes:?}");
        }
        for no in [
            &b"text/plain"[..],
            b"application/json",
            b"",
            b"text/event-streamx",
            b"application/gr",
            b"application/grpcx",
        ] {
            assert!(!is_streaming_type(no), "{no:?}");
        }
    }
}
