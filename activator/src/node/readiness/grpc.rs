//! `grpc` readiness probes: the standard health check (`grpc.health.v1.Health/Check`) over
//! h2c, as the kubelet calls it, passing when the answer says SERVING.

use std::net::{IpAddr, SocketAddr};

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::net::TcpStream;

/// `HealthCheckResponse.ServingStatus.SERVING`.
const SERVING: u64 = 1;

/// The template's gRPC readiness probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcCheck {
    pub port: u16,
    /// The `service` asked about ("" for the server as a whole).
    pub service: String,
}

impl GrpcCheck {
    /// A probe's `grpc` (its port is a number: the API has no named gRPC probe ports).
    pub(super) fn of_probe(grpc: &Value) -> Option<Self> {
        let port = u16::try_from(grpc["port"].as_u64()?)
            .ok()
            .filter(|p| *p != 0)?;
        Some(Self {
            port,
            service: grpc["service"].as_str().unwrap_or_default().to_string(),
        })
    }

    pub(super) async fn run(&self, ip: IpAddr) -> bool {
        match self.call(ip).await {
            Ok(serving) => serving,
            Err(e) => {
                tracing::debug!(%ip, error = %e, "readiness probe: gRPC health check failed");
                false
            }
        }
    }

    async fn call(&self, ip: IpAddr) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        let addr = SocketAddr::new(ip, self.port);
        let tcp = TcpStream::connect(addr).await?;
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await?;
        // The connection is driven here and dropped with the check.
        let conn = tokio::spawn(conn);
        let req = http::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", "local-activator-probe")
            .body(Full::new(request(&self.service)))?;
        let answered = async {
            let resp = send.send_request(req).await?;
            if resp.status() != http::StatusCode::OK {
                return Ok(false);
            }
            // A trailers-only answer carries grpc-status in its headers.
            let head_status = grpc_status(resp.headers());
            let body = resp.into_body().collect().await?;
            let status = body.trailers().and_then(grpc_status).or(head_status);
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                status == Some(0) && serving(&body.to_bytes()),
            )
        }
        .await;
        conn.abort();
        answered
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<u32> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// A length-prefixed `HealthCheckRequest { service }` (field 1, a string, left out when
/// empty as proto3 does).
fn request(service: &str) -> Bytes {
    let mut msg = BytesMut::new();
    if !service.is_empty() {
        msg.put_u8(0x0a);
        put_varint(&mut msg, service.len() as u64);
        msg.put_slice(service.as_bytes());
    }
    let mut framed = BytesMut::with_capacity(5 + msg.len());
    framed.put_u8(0); // not compressed
    framed.put_u32(msg.len() as u32);
    framed.put_slice(&msg);
    framed.freeze()
}

/// Whether a length-prefixed `HealthCheckResponse` says SERVING (its field 1, a varint; an
/// absent field is UNKNOWN). Unknown fields are skipped; anything malformed is not serving.
fn serving(body: &[u8]) -> bool {
    let Some((&[0], rest)) = body.split_first_chunk::<1>() else {
        return false;
    };
    let Some((len, msg)) = rest.split_first_chunk::<4>() else {
        return false;
    };
    let Some(mut msg) = msg.get(..u32::from_be_bytes(*len) as usize) else {
        return false;
    };
    let mut status = 0;
    while !msg.is_empty() {
        let Some(tag) = varint(&mut msg) else {
            return false;
        };
        match (tag >> 3, tag & 7) {
            (1, 0) => match varint(&mut msg) {
                Some(v) => status = v,
                None => return false,
            },
            (_, 0) => {
                if varint(&mut msg).is_none() {
                    return false;
                }
            }
            (_, 2) => {
                let Some(n) = varint(&mut msg) else {
                    return false;
                };
                let Some(rest) = usize::try_from(n).ok().and_then(|n| msg.get(n..)) else {
                    return false;
                };
                msg = rest;
            }
            (_, 1) if msg.len() >= 8 => msg = &msg[8..],
            (_, 5) if msg.len() >= 4 => msg = &msg[4..],
            _ => return false,
        }
    }
    status == SERVING
}

fn put_varint(out: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

/// Reads a varint off the front of `buf`.
fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for (i, &b) in buf.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *buf = &buf[i + 1..];
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;
    use hyper::body::{Frame, Incoming};
    use hyper::service::service_fn;
    use serde_json::json;
    use std::convert::Infallible;
    use tokio::net::TcpListener;

    fn framed(msg: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        v.extend_from_slice(msg);
        v
    }

    #[test]
    fn requests_and_answers_are_encoded_as_grpc_does() {
        assert_eq!(&request("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(&request("ab")[..], &[0, 0, 0, 0, 4, 0x0a, 2, b'a', b'b']);
        let long = "s".repeat(200);
        assert_eq!(&request(&long)[5..8], &[0x0a, 0xc8, 0x01]);
        assert!(serving(&framed(&[0x08, 1])));
        assert!(!serving(&framed(&[0x08, 2])), "NOT_SERVING");
        assert!(!serving(&framed(&[])), "UNKNOWN when absent");
        // Unknown fields before it are skipped.
        assert!(serving(&framed(&[0x12, 2, b'x', b'y', 0x18, 7, 0x08, 1])));
        for bad in [
            vec![],
            vec![1, 0, 0, 0, 2, 0x08, 1], // compressed
            vec![0, 0, 0, 0, 9, 0x08, 1], // shorter than its prefix
            framed(&[0x08]),              // truncated varint
            framed(&[0x12, 5, b'x']),     // truncated string
            framed(&[0x0b]),              // group: not in this message
        ] {
            assert!(!serving(&bad), "{bad:?}");
        }
        assert_eq!(
            GrpcCheck::of_probe(&json!({"port": 9000})),
            Some(GrpcCheck {
                port: 9000,
                service: String::new()
            })
        );
        assert_eq!(GrpcCheck::of_probe(&json!({"port": 0})), None);
    }

    /// An h2c gRPC health server answering each call with the next status (None: a
    /// trailers-only answer with grpc-status 12, UNIMPLEMENTED).
    async fn server(statuses: Vec<Option<u8>>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            for status in statuses {
                let (s, _) = l.accept().await.unwrap();
                let svc = service_fn(move |req: Request| async move {
                    assert_eq!(req.uri().path(), "/grpc.health.v1.Health/Check");
                    let asked = req.into_body().collect().await.unwrap().to_bytes();
                    assert_eq!(&asked[..], &request("app")[..]);
                    let mut trailers = http::HeaderMap::new();
                    let frames: Vec<Result<Frame<Bytes>, Infallible>> = match status {
                        Some(s) => {
                            trailers.insert("grpc-status", "0".parse().unwrap());
                            vec![
                                Ok(Frame::data(Bytes::from(framed(&[0x08, s])))),
                                Ok(Frame::trailers(trailers)),
                            ]
                        }
                        None => Vec::new(),
                    };
                    let mut resp =
                        http::Response::new(StreamBody::new(futures::stream::iter(frames)));
                    resp.headers_mut()
                        .insert("content-type", "application/grpc".parse().unwrap());
                    if status.is_none() {
                        resp.headers_mut()
                            .insert("grpc-status", "12".parse().unwrap());
                    }
                    Ok::<_, Infallible>(resp)
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(s), svc),
                );
            }
        });
        addr
    }

    type Request = http::Request<Incoming>;

    #[tokio::test]
    async fn a_grpc_probe_passes_on_serving_only() {
        let addr = server(vec![Some(2), None, Some(1)]).await;
        let c = super::super::Check::Grpc(GrpcCheck {
            port: addr.port(),
            service: "app".into(),
        });
        assert!(!c.run(addr.ip()).await, "NOT_SERVING");
        assert!(!c.run(addr.ip()).await, "UNIMPLEMENTED");
        assert!(c.run(addr.ip()).await, "SERVING");
        // A port that speaks HTTP/1 only, or nothing: not ready.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        assert!(
            !super::super::Check::Grpc(GrpcCheck {
                port: a.port(),
                service: String::new()
            })
            .run(a.ip())
            .await
        );
    }
}
