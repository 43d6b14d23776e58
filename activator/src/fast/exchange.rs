//! One request and its response, moved as bytes between the client's connection and a pod's:
//! the request head rewritten ([`crate::http1::request_head::write_request`]), the body copied as it comes,
//! the response head rewritten and its body relayed as it is, up to where its framing says it
//! ends — so that both connections can carry the next message.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use std::pin::Pin;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use tokio::time::{Instant, Sleep};

use super::pod_conns::{PodConn, PodConns};
use crate::http1::body_end::BodyEnd;
use crate::http1::request_head::{self, RequestHead};
use crate::http1::response_head::{self, Additions, BodyFraming, ResponseHead};
use crate::wire::answer::Refusal;

/// A response head larger than this is refused (502): hyper's client allows about as much.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Read size for bodies; the buffers grow to it only for bodies that need it.
const READ_CHUNK: usize = 8 * 1024;

/// Buffers and timers one client connection reuses for every request it carries.
pub struct Scratch {
    /// Bounds the wait for a request head; moved later for each one. A timer made per request
    /// would be put in and taken out of the runtime's timer wheel each time; moving a
    /// registered one later is a field update (the wheel sees it when the old time comes).
    pub head_timer: Pin<Box<Sleep>>,
    /// Bounds the wait for a response head (the revision's timeoutSeconds), made on the
    /// first request and moved later for each.
    pub deadline_timer: Option<Pin<Box<Sleep>>>,
    /// The head (and the start of the body) going out, to the pod or the client.
    pub out: Vec<u8>,
    /// What the pod sent.
    pub resp: BytesMut,
    /// The protocol of the revision this connection's last request was for (read from the
    /// Revision's template: not on every request of a keep-alive connection).
    pub protocol: Option<(
        std::sync::Arc<crds::Revision>,
        crate::upstream::proxy::UpstreamProtocol,
    )>,
    /// The request counter this connection last counted on (nearly always the same one: a
    /// warm 200): the metric family's lookup is a lock and a hash per request otherwise.
    pub counted: Option<(
        crate::ops::metrics::Outcome,
        prometheus_client::metrics::counter::Counter,
    )>,
}

impl Default for Scratch {
    fn default() -> Self {
        Self {
            head_timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            deadline_timer: None,
            out: Vec::new(),
            resp: BytesMut::new(),
            protocol: None,
            counted: None,
        }
    }
}

/// What the exchange needs besides the two connections.
pub struct Request<'a> {
    pub head: &'a RequestHead,
    pub client: &'a request_head::Client,
    pub target: SocketAddr,
    /// The response head must arrive by then (the revision's timeoutSeconds).
    pub deadline: Instant,
    pub body_idle_timeout: Duration,
    /// What is added to the response head (except `connection: close`, decided here).
    pub served_by: &'a [u8],
    /// `Server-Timing` of a cold start: computed when the response head arrives.
    pub cold: Option<&'a (dyn Fn() -> String + Sync)>,
    /// The client connection ends after this response whatever happens (client asked, or
    /// the activator is draining).
    pub close: bool,
    /// Counts a request sent again on a fresh connection (`activator_retries_total`).
    pub retries: Option<&'a prometheus_client::metrics::counter::Counter>,
}

/// How an exchange ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The response went out whole. `close`: the client connection ends now; `reuse`: the
    /// pod's connection can carry another request.
    Done {
        status: u16,
        close: bool,
        reuse: bool,
    },
    /// Nothing went to the client yet: answer this, then close the connection.
    Refused(Refusal),
    /// The client connection is broken (it went away, or the app failed mid-response, which
    /// the client can only learn from the connection closing): close it.
    Broken { status: Option<u16> },
}

/// Sends the request at the start of `buf` (its head, as classified, and whatever of its body
/// has arrived) on `pod`, then relays the response to `client`. On return `buf` holds only
/// what the client sent after the request (a pipelined next one).
pub async fn exchange<C>(
    client: &mut C,
    buf: &mut BytesMut,
    pod: PodConn,
    pods: &PodConns,
    req: &Request<'_>,
    scratch: &mut Scratch,
) -> Ended
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let Scratch {
        out,
        resp,
        deadline_timer,
        ..
    } = scratch;
    let deadline = arm(deadline_timer, req.deadline);
    let mut o = load_request(out, buf, pod, req);
    // Sent, the rest of the body copied as it comes, and the response head read: again on a
    // fresh connection while the request may go again (`Outgoing`).
    let resp_head = loop {
        let wrote = tokio::select! {
            biased;
            w = write_out(&mut o.stream, out) => w,
            () = deadline.as_mut() => return Ended::Refused(HeadError::Late.refusal(req.target)),
        };
        if let Err((sent, e)) = wrote {
            if o.resend_unsent && sent == 0 && o.fresh(pods, req).await {
                continue;
            }
            return Ended::Refused(pod_failed(req.target, &e));
        }
        if o.body_left > 0
            && let Err(ended) = copy_body(
                client,
                buf,
                &mut o.stream,
                &mut o.body_left,
                req,
                deadline.as_mut(),
            )
            .await
        {
            return ended;
        }
        resp.clear();
        match read_head(&mut o.stream, resp, req.head.is_head, deadline.as_mut()).await {
            Ok(rh) => break rh,
            Err(HeadError::ClosedEarly(_)) if o.resend_whole => {
                if o.fresh(pods, req).await {
                    continue;
                }
                return Ended::Refused(Refusal::bad_gateway(format!(
                    "pod at {} closed the connection without an answer",
                    req.target
                )));
            }
            Err(e) => return Ended::Refused(e.refusal(req.target)),
        }
    };
    let mut stream = o.stream;
    let ended = relay(
        client,
        &mut stream,
        resp,
        resp_head,
        req,
        out,
        deadline.as_mut(),
    )
    .await;
    if let Ended::Done { reuse: true, .. } = ended {
        pods.put(req.target, stream);
    }
    ended
}

/// The exchange's deadline timer, kept in the scratch space from one request to the next,
/// set to `at`.
fn arm(timer: &mut Option<Pin<Box<Sleep>>>, at: Instant) -> &mut Pin<Box<Sleep>> {
    match timer {
        Some(t) => {
            t.as_mut().reset(at);
            t
        }
        None => timer.insert(Box::pin(tokio::time::sleep_until(at))),
    }
}

/// The request on its way to the pod: the connection it goes on, how much of its body is
/// still to come from the client, and whether it may go again on a fresh connection.
struct Outgoing {
    stream: TcpStream,
    body_left: u64,
    /// The whole request was in `out`, its method is idempotent and it went on a pooled
    /// connection: it goes again if the pod closes that connection without an answer.
    resend_whole: bool,
    /// It went on a pooled connection: it goes again if none of its bytes went out.
    resend_unsent: bool,
}

impl Outgoing {
    /// The request goes again from its start on a fresh connection, and never a third
    /// time. False: no fresh connection could be made.
    async fn fresh(&mut self, pods: &PodConns, req: &Request<'_>) -> bool {
        let Ok(fresh) = pods.connect(req.target).await else {
            return false;
        };
        (self.stream, self.resend_unsent, self.resend_whole) = (fresh, false, false);
        resent(req);
        true
    }
}

/// The request into `out` for the pod: its head rewritten, and whatever of its body has
/// arrived; `buf` keeps only what follows it.
fn load_request(
    out: &mut Vec<u8>,
    buf: &mut BytesMut,
    pod: PodConn,
    req: &Request<'_>,
) -> Outgoing {
    let h = req.head;
    out.clear();
    request_head::write_request(out, &buf[..h.len], h, req.client, req.target);
    let body = request_head::body_in(buf.len(), h);
    out.extend_from_slice(&buf[body.clone()]);
    let body_left = h.body_len - (body.end - body.start) as u64;
    buf.advance(body.end);
    // A request goes again on a fresh connection only when a pooled one failed under it and
    // the pod cannot have acted on it (RFC 9110 §9.2.2): none of its bytes went out, or the
    // whole request was in `out`, its method is idempotent and the pod answered nothing.
    // A POST the pod may have read is never sent twice: its failure is the client's 502.
    Outgoing {
        resend_whole: pod.reused && body_left == 0 && h.idempotent,
        resend_unsent: pod.reused,
        stream: pod.stream,
        body_left,
    }
}

fn resent(req: &Request<'_>) {
    tracing::debug!(target = %req.target, "pooled connection failed: request sent again");
    if let Some(c) = req.retries {
        c.inc();
    }
}

/// Writes all of `out`; on failure, how much of it went out.
async fn write_out(stream: &mut TcpStream, out: &[u8]) -> Result<(), (usize, io::Error)> {
    let mut at = 0;
    while at < out.len() {
        match stream.write(&out[at..]).await {
            Ok(0) => return Err((at, io::ErrorKind::WriteZero.into())),
            Ok(n) => at += n,
            Err(e) => return Err((at, e)),
        }
    }
    Ok(())
}

/// Copies the rest of the request body from the client to the pod: each read within the
/// body idle timeout, each write to the pod (which may stop reading) by the deadline.
async fn copy_body<C>(
    client: &mut C,
    buf: &mut BytesMut,
    stream: &mut TcpStream,
    left: &mut u64,
    req: &Request<'_>,
    mut deadline: Pin<&mut Sleep>,
) -> Result<(), Ended>
where
    C: AsyncRead + Unpin,
{
    while *left > 0 {
        buf.reserve(READ_CHUNK);
        let read = tokio::time::timeout(req.body_idle_timeout, client.read_buf(buf)).await;
        match read {
            Err(_) => {
                return Err(Ended::Refused(Refusal::request_timeout(format!(
                    "the request body sent nothing for {} ms",
                    req.body_idle_timeout.as_millis()
                ))));
            }
            Ok(Ok(0)) | Ok(Err(_)) => return Err(Ended::Broken { status: None }),
            Ok(Ok(_)) => {}
        }
        let take = (*left).min(buf.len() as u64) as usize;
        let wrote = tokio::select! {
            biased;
            w = stream.write_all(&buf[..take]) => w,
            () = deadline.as_mut() => {
                return Err(Ended::Refused(HeadError::Late.refusal(req.target)));
            }
        };
        if let Err(e) = wrote {
            return Err(Ended::Refused(pod_failed(req.target, &e)));
        }
        buf.advance(take);
        *left -= take as u64;
    }
    Ok(())
}

enum HeadError {
    /// The connection ended before any byte of a response (a pooled connection the app
    /// closed meanwhile, or an app that died).
    ClosedEarly(Option<io::Error>),
    /// It ended, or broke, in the middle of one.
    Broken(io::Error),
    Bad(&'static str),
    Late,
}

impl HeadError {
    fn refusal(self, target: SocketAddr) -> Refusal {
        match self {
            Self::ClosedEarly(None) => Refusal::bad_gateway(format!(
                "pod at {target} closed the connection without an answer"
            )),
            Self::ClosedEarly(Some(e)) | Self::Broken(e) => pod_failed(target, &e),
            Self::Bad(why) => Refusal::bad_gateway(format!("pod at {target} sent {why}")),
            Self::Late => {
                Refusal::timeout(format!("pod at {target}: no answer within the timeout"))
            }
        }
    }
}

/// Reads until a final (or informational) response head is in `resp`.
async fn read_head(
    stream: &mut TcpStream,
    resp: &mut BytesMut,
    to_head: bool,
    mut deadline: Pin<&mut Sleep>,
) -> Result<ResponseHead, HeadError> {
    loop {
        if !resp.is_empty() {
            match response_head::parse_response(resp, to_head) {
                Ok(Some(rh)) => return Ok(rh),
                Ok(None) if resp.len() >= MAX_RESPONSE_HEAD => {
                    return Err(HeadError::Bad("a response head over 64 KiB"));
                }
                Ok(None) => {}
                Err(bad) => return Err(HeadError::Bad(bad.0)),
            }
        }
        if resp.capacity() - resp.len() < 1024 {
            resp.reserve(READ_CHUNK);
        }
        let read = tokio::select! {
            biased;
            r = stream.read_buf(resp) => Ok(r),
            () = deadline.as_mut() => Err(()),
        };
        match read {
            Err(()) => return Err(HeadError::Late),
            Ok(Ok(0)) if resp.is_empty() => return Err(HeadError::ClosedEarly(None)),
            Ok(Ok(0)) => {
                return Err(HeadError::Broken(io::ErrorKind::UnexpectedEof.into()));
            }
            Ok(Err(e)) if resp.is_empty() => return Err(HeadError::ClosedEarly(Some(e))),
            Ok(Err(e)) => return Err(HeadError::Broken(e)),
            Ok(Ok(_)) => {}
        }
    }
}

/// Sends the response head, and its body as it arrives, to the client. Informational heads
/// (1xx) go first and the final one is awaited after them.
async fn relay<C>(
    client: &mut C,
    stream: &mut TcpStream,
    resp: &mut BytesMut,
    rh: ResponseHead,
    req: &Request<'_>,
    out: &mut Vec<u8>,
    mut deadline: Pin<&mut Sleep>,
) -> Ended
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let rh = match informational(client, stream, resp, rh, req, out, deadline.as_mut()).await {
        Ok(rh) => rh,
        Err(ended) => return ended,
    };
    let status = rh.status;
    let close = req.close || rh.framing == BodyFraming::UntilClose;
    let broken = Ended::Broken {
        status: Some(status),
    };
    let Ok(mut body) = final_head(out, resp, &rh, req, close) else {
        return broken;
    };
    // From here the whole exchange is bounded: by the revision's timeout unless the
    // response streams by design, and by the body idle timeout either way — an app that
    // stalls mid-body, or a client that stops reading, closes the connection.
    let streaming = rh.streaming;
    if send(client, out, req, streaming, deadline.as_mut())
        .await
        .is_err()
    {
        return broken;
    }
    if relay_body(client, stream, resp, &mut body, req, streaming, deadline)
        .await
        .is_err()
    {
        return broken;
    }
    // Anything after the body's end is not part of any answer: the connection is not clean.
    let reuse = !rh.close && resp.is_empty();
    if reuse {
        resp.clear();
    }
    Ended::Done {
        status,
        close,
        reuse,
    }
}

/// Passes informational heads (1xx) on to the client, each as it comes, and returns the
/// final head once it has arrived; Err: how the exchange ended instead.
async fn informational<C>(
    client: &mut C,
    stream: &mut TcpStream,
    resp: &mut BytesMut,
    mut rh: ResponseHead,
    req: &Request<'_>,
    out: &mut Vec<u8>,
    mut deadline: Pin<&mut Sleep>,
) -> Result<ResponseHead, Ended>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    while rh.informational() {
        out.clear();
        response_head::write_response(
            out,
            &resp[..rh.len],
            rh.plain,
            &Additions {
                served_by: req.served_by,
                ..Default::default()
            },
        );
        resp.advance(rh.len);
        if send(client, out, req, false, deadline.as_mut())
            .await
            .is_err()
        {
            return Err(Ended::Broken { status: None });
        }
        // Only an informational head went out: the activator's own answer can still be
        // the final one (as hyper's path answers, which passes no 1xx on).
        rh = match read_head(stream, resp, req.head.is_head, deadline.as_mut()).await {
            Ok(rh) => rh,
            Err(e) => return Err(Ended::Refused(e.refusal(req.target))),
        };
    }
    Ok(rh)
}

/// The final head, rewritten, in `out` with the first of the body after it (taken from
/// `resp`), so that both go out in one write; Err: the body's start breaks its framing.
fn final_head(
    out: &mut Vec<u8>,
    resp: &mut BytesMut,
    rh: &ResponseHead,
    req: &Request<'_>,
    close: bool,
) -> Result<BodyEnd, ()> {
    let timing = req.cold.map(|f| f());
    out.clear();
    response_head::write_response(
        out,
        &resp[..rh.len],
        rh.plain,
        &Additions {
            served_by: req.served_by,
            cold: timing.as_deref(),
            close,
        },
    );
    resp.advance(rh.len);
    let mut body = BodyEnd::new(rh.framing);
    let n = body.take(resp)?;
    out.extend_from_slice(&resp[..n]);
    resp.advance(n);
    Ok(body)
}

/// Relays the rest of the body from the pod to the client as it arrives, until its framing
/// says it ended; Err: the connection is broken (the pod failed or broke the framing, the
/// client went away, or the deadline or the idle timeout passed).
async fn relay_body<C>(
    client: &mut C,
    stream: &mut TcpStream,
    resp: &mut BytesMut,
    body: &mut BodyEnd,
    req: &Request<'_>,
    streaming: bool,
    mut deadline: Pin<&mut Sleep>,
) -> Result<(), ()>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    while !body.done() {
        if resp.capacity() - resp.len() < 1024 {
            resp.reserve(READ_CHUNK);
        }
        let read = tokio::select! {
            biased;
            r = stream.read_buf(resp) => r,
            () = deadline.as_mut(), if !streaming => {
                tracing::debug!(target = %req.target, "response body past the timeout: closed");
                return Err(());
            }
            () = tokio::time::sleep(req.body_idle_timeout) => {
                tracing::debug!(target = %req.target, "response body idle: closed");
                return Err(());
            }
        };
        match read {
            Ok(0) if body.until_close() => break,
            Ok(0) | Err(_) => return Err(()),
            Ok(_) => {}
        }
        let Ok(n) = body.take(resp) else {
            return Err(());
        };
        if send(client, &resp[..n], req, streaming, deadline.as_mut())
            .await
            .is_err()
        {
            return Err(());
        }
        resp.advance(n);
    }
    Ok(())
}

/// Writes to the client within the body idle timeout (a client that stops reading holds
/// nothing for longer) and, unless the response streams, by the deadline.
async fn send<C>(
    client: &mut C,
    bytes: &[u8],
    req: &Request<'_>,
    streaming: bool,
    mut deadline: Pin<&mut Sleep>,
) -> Result<(), ()>
where
    C: AsyncWrite + Unpin,
{
    tokio::select! {
        biased;
        w = client.write_all(bytes) => w.map_err(|_| ()),
        () = deadline.as_mut(), if !streaming => Err(()),
        () = tokio::time::sleep(req.body_idle_timeout) => Err(()),
    }
}

fn pod_failed(target: SocketAddr, e: &io::Error) -> Refusal {
    Refusal::bad_gateway(format!("pod at {target} failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    use crate::http1::request_head::{Classified, classify_request};

    const REV: &str = "x-revision-namespace: ns\r\nx-revision-name: r\r\n";

    /// A pod that answers each request it reads with the next canned bytes, then reads on.
    async fn pod(answers: Vec<&'static [u8]>) -> (SocketAddr, tokio::task::JoinHandle<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut seen = Vec::new();
            for a in answers {
                let mut b = [0u8; 4096];
                // Enough for these tests: each request arrives in one read.
                let n = s.read(&mut b).await.unwrap();
                seen.extend_from_slice(&b[..n]);
                s.write_all(a).await.unwrap();
            }
            // Done answering: an answer delimited by the end of the connection ends here.
            s.shutdown().await.unwrap();
            let _ = s.read_to_end(&mut seen).await;
            seen
        });
        (addr, task)
    }

    async fn run(req: &str, answers: Vec<&'static [u8]>) -> (Ended, Vec<u8>, String) {
        let (target, pod_task) = pod(answers).await;
        let pods = PodConns::new(Duration::from_secs(1), Duration::from_secs(60));
        let Classified::Fast(head) = classify_request(req.as_bytes()) else {
            panic!("not fast: {req}")
        };
        let (mut client, mut far) = tokio::io::duplex(1 << 16);
        let mut buf = BytesMut::from(req.as_bytes());
        let conn = pods.get(target).await.unwrap();
        let r = Request {
            head: &head,
            client: &request_head::Client::new("127.0.0.9".parse().unwrap()),
            target,
            deadline: Instant::now() + Duration::from_secs(5),
            body_idle_timeout: Duration::from_secs(5),
            served_by: b"n1",
            cold: None,
            close: false,
            retries: None,
        };
        let mut scratch = Scratch::default();
        let ended = exchange(&mut client, &mut buf, conn, &pods, &r, &mut scratch).await;
        drop(client);
        let mut got = Vec::new();
        far.read_to_end(&mut got).await.unwrap();
        drop(pods);
        // The pod got the request as rewritten: forwarding headers added.
        let seen = tokio::time::timeout(Duration::from_secs(5), pod_task)
            .await
            .expect("the pod's connection closes")
            .unwrap();
        let seen = String::from_utf8_lossy(&seen).into_owned();
        assert!(seen.contains("x-forwarded-for: 127.0.0.9\r\n"), "{seen}");
        (ended, got, String::from_utf8_lossy(&buf).into_owned())
    }

    #[tokio::test]
    async fn a_chunked_answer_passes_as_it_is_and_ends_where_its_chunks_do() {
        let (ended, got, rest) = run(
            &format!("GET / HTTP/1.1\r\n{REV}\r\nGET /next"),
            vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"],
        )
        .await;
        assert_eq!(
            ended,
            Ended::Done {
                status: 200,
                close: false,
                reuse: true
            }
        );
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-activator-node: n1\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        );
        assert_eq!(rest, "GET /next", "the pipelined request stays");
    }

    #[tokio::test]
    async fn informational_heads_go_first_and_head_answers_have_no_body() {
        let (ended, got, _) = run(
            &format!("HEAD / HTTP/1.1\r\n{REV}\r\n"),
            vec![b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"],
        )
        .await;
        assert!(
            matches!(
                ended,
                Ended::Done {
                    status: 200,
                    reuse: true,
                    ..
                }
            ),
            "{ended:?}"
        );
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\nx-activator-node: n1\r\n\r\n\
             HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-activator-node: n1\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn an_answer_until_close_closes_the_client_too() {
        let (ended, got, _) = run(
            &format!("POST / HTTP/1.1\r\ncontent-length: 3\r\n{REV}\r\nabc"),
            vec![b"HTTP/1.1 200 OK\r\n\r\nall of it"],
        )
        .await;
        assert!(
            matches!(
                ended,
                Ended::Done {
                    status: 200,
                    close: true,
                    reuse: false
                }
            ),
            "{ended:?}"
        );
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "HTTP/1.1 200 OK\r\nx-activator-node: n1\r\nconnection: close\r\n\r\nall of it"
        );
    }

    #[tokio::test]
    async fn a_pod_that_closes_without_answering_is_a_502() {
        let (ended, _, _) = run(&format!("GET / HTTP/1.1\r\n{REV}\r\n"), vec![b""]).await;
        let Ended::Refused(r) = ended else {
            panic!("{ended:?}")
        };
        assert_eq!(r.status, 502);
    }

    #[tokio::test]
    async fn no_answer_by_the_deadline_is_a_504_and_the_timer_serves_the_next_request() {
        // A pod that takes requests and never answers.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = l.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                conns.push(s);
            }
        });
        let pods = PodConns::new(Duration::from_secs(1), Duration::from_secs(60));
        let req = format!("GET / HTTP/1.1\r\n{REV}\r\n");
        let Classified::Fast(head) = classify_request(req.as_bytes()) else {
            panic!("not fast")
        };
        let client_addr = request_head::Client::new("127.0.0.9".parse().unwrap());
        let mut scratch = Scratch::default();
        // Twice on one connection's scratch: the deadline timer is moved, not made again.
        for _ in 0..2 {
            let (mut client, _far) = tokio::io::duplex(1 << 16);
            let mut buf = BytesMut::from(req.as_bytes());
            let r = Request {
                head: &head,
                client: &client_addr,
                target,
                deadline: Instant::now() + Duration::from_millis(100),
                body_idle_timeout: Duration::from_secs(5),
                served_by: b"n1",
                cold: None,
                close: false,
                retries: None,
            };
            let conn = pods.get(target).await.unwrap();
            let ended = exchange(&mut client, &mut buf, conn, &pods, &r, &mut scratch).await;
            let Ended::Refused(refusal) = ended else {
                panic!("{ended:?}")
            };
            assert_eq!(refusal.status, 504);
        }
        held.abort();
    }
}
