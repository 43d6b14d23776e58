//! The v2 image verbs (`image`, `pull`) against raw sockets: what they answer, what hostile
//! lines get, and that a pull in flight delays nothing on another connection.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::ServerConfig;
use crate::image::{Credentials, MAX_IMAGE_REF};
use crate::protocol::MAX_PULL_LINE;
use crate::testutil::{
    IMG_MISSING, IMG_PRESENT, IMG_PRIVATE, IMG_PULLABLE, IMG_SLOW, Server, UID_A,
};

async fn read_line(s: &mut UnixStream) -> String {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while !out.ends_with(b"\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
            .await
            .expect("no answer")
            .unwrap();
        assert_ne!(n, 0, "closed after {:?}", String::from_utf8_lossy(&out));
        out.push(b[0]);
    }
    String::from_utf8(out).unwrap()
}

async fn ask(s: &mut UnixStream, line: &str) -> String {
    s.write_all(line.as_bytes()).await.unwrap();
    read_line(s).await
}

async fn read_to_close(s: &mut UnixStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the agent did not close the connection")
        {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn auth(user: &str, pass: &str) -> String {
    Credentials::new(user, pass).unwrap().encode()
}

#[tokio::test]
async fn answers_image_queries_and_pulls() {
    let server = Server::start(ServerConfig::default()).await;
    let mut s = server.connect().await;
    assert_eq!(
        ask(&mut s, &format!("image {IMG_PRESENT}\n")).await,
        "present sha256:aaaa 1234\n"
    );
    assert_eq!(
        ask(&mut s, &format!("image {IMG_PULLABLE}\n")).await,
        "none\n"
    );
    let pulled = ask(&mut s, &format!("pull {IMG_PULLABLE}\n")).await;
    assert!(pulled.starts_with("pulled sha256:"), "{pulled}");
    let present = ask(&mut s, &format!("image {IMG_PULLABLE}\n")).await;
    assert!(present.starts_with("present sha256:"), "{present}");
    assert_eq!(
        ask(&mut s, &format!("pull {IMG_MISSING}\n")).await,
        "error not found\n"
    );
    assert_eq!(
        ask(&mut s, &format!("pull {IMG_PRIVATE}\n")).await,
        "error unauthorized\n"
    );
    assert_eq!(
        ask(
            &mut s,
            &format!("pull {IMG_PRIVATE} auth {}\n", auth("robot", "nope"))
        )
        .await,
        "error unauthorized\n"
    );
    let ok = ask(
        &mut s,
        &format!("pull {IMG_PRIVATE} auth {}\n", auth("robot", "pw")),
    )
    .await;
    assert!(ok.starts_with("pulled "), "{ok}");
    // v1 on the same connection, unchanged.
    assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
    assert_eq!(
        ask(&mut s, &format!("addr {UID_A}\n")).await,
        "addr 10.244.0.7\n"
    );
    let pulls = server.backend.pulls.lock().unwrap().clone();
    assert_eq!(
        pulls,
        [
            (IMG_PULLABLE.to_owned(), None),
            (IMG_MISSING.to_owned(), None),
            (IMG_PRIVATE.to_owned(), None),
            (IMG_PRIVATE.to_owned(), Some("robot".to_owned())),
            (IMG_PRIVATE.to_owned(), Some("robot".to_owned())),
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn hostile_image_lines_get_bad_request_and_the_agent_serves_on() {
    let server = Server::start(ServerConfig::default()).await;
    let good = auth("u", "p");
    let digest_upper = format!("pull nginx@sha256:{}\n", "AB".repeat(32));
    let digest_short = format!("pull nginx@sha256:{}\n", "ab".repeat(31));
    let overlong_ref = format!("pull r.io/{}\n", "a".repeat(MAX_IMAGE_REF));
    let overlong_image = format!("image r.io/{}\n", "a".repeat(MAX_IMAGE_REF));
    let bad_b64 = "pull nginx auth dTpw=\n".to_owned();
    let no_colon = format!("pull nginx auth {}\n", "bm9jb2xvbg==");
    let trailing = format!("pull nginx auth {good} \n");
    let lines: Vec<&[u8]> = vec![
        overlong_ref.as_bytes(),
        overlong_image.as_bytes(),
        b"pull NGINX\n",
        b"image Nginx:latest\n",
        b"pull ghcr.io/Owner/app\n",
        digest_upper.as_bytes(),
        digest_short.as_bytes(),
        b"pull nginx@md5:abc\n",
        b"pull ngi\x00nx\n",
        b"pull nginx\x07\n",
        b"pull nginx\r\n",
        b"image \xff\xfe\n",
        b"pull nginx auth \n",
        bad_b64.as_bytes(),
        no_colon.as_bytes(),
        trailing.as_bytes(),
        b"pull nginx auth !!!!\n",
        b"pull  nginx\n",
        b"pull\n",
        b"image\n",
    ];
    for line in lines {
        let mut s = server.connect().await;
        s.write_all(line).await.unwrap();
        assert_eq!(
            read_to_close(&mut s).await,
            b"error bad request\n",
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
    assert!(server.backend.pulls.lock().unwrap().is_empty());
    let mut s = server.connect().await;
    assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
    server.stop().await;
}

#[tokio::test]
async fn a_pull_line_beyond_its_bound_is_refused_without_reading_it_all() {
    let server = Server::start(ServerConfig::default()).await;
    let mut s = server.connect().await;
    let mut line = format!("pull nginx auth {}", "A".repeat(MAX_PULL_LINE)).into_bytes();
    line.extend_from_slice(&vec![b'A'; 64 * 1024]);
    // The agent closes after MAX_ANY_REQUEST_LINE bytes; the rest may fail to write.
    let _ = s.write_all(&line).await;
    assert_eq!(read_to_close(&mut s).await, b"error bad request\n");
    server.stop().await;
}

#[tokio::test]
async fn pipelined_image_requests_are_answered_in_order() {
    let server = Server::start(ServerConfig::default()).await;
    let mut s = server.connect().await;
    let batch = format!(
        "image {IMG_PRESENT}\nping\npull {IMG_MISSING}\nimage {IMG_MISSING}\naddr {UID_A}\npull NOPE\nping\n"
    );
    s.write_all(batch.as_bytes()).await.unwrap();
    assert_eq!(
        String::from_utf8(read_to_close(&mut s).await).unwrap(),
        "present sha256:aaaa 1234\npong\nerror not found\nnone\naddr 10.244.0.7\nerror bad request\n"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_pull_in_flight_delays_no_addr_and_the_next_pull_is_busy() {
    let server = Server::start(ServerConfig {
        max_pulls: 1,
        ..ServerConfig::default()
    })
    .await;
    let mut puller = server.connect().await;
    puller
        .write_all(format!("pull {IMG_SLOW}\n").as_bytes())
        .await
        .unwrap();
    // Wait until the backend has the pull (it then waits on the gate, which only this test
    // opens), by asking on another connection until the second pull is refused busy.
    let mut other = server.connect().await;
    loop {
        let answer = ask(&mut other, &format!("pull {IMG_PULLABLE}\n")).await;
        if answer == "error busy\n" {
            break;
        }
        // The slow pull had not taken its slot yet: this pull went through instead.
        assert!(answer.starts_with("pulled "), "{answer}");
        tokio::task::yield_now().await;
    }
    // While the slow pull is still held by the gate, `addr` and `image` answer at once.
    for _ in 0..20 {
        assert_eq!(
            ask(&mut other, &format!("addr {UID_A}\n")).await,
            "addr 10.244.0.7\n"
        );
        assert_eq!(
            ask(&mut other, &format!("image {IMG_SLOW}\n")).await,
            "none\n"
        );
    }
    assert_eq!(server.backend.slow_gate.available_permits(), 0);
    server.backend.slow_gate.add_permits(1);
    let pulled = read_line(&mut puller).await;
    assert!(pulled.starts_with("pulled sha256:"), "{pulled}");
    // The slot is free again.
    let again = ask(&mut other, &format!("pull {IMG_PULLABLE}\n")).await;
    assert!(again.starts_with("pulled "), "{again}");
    server.stop().await;
}

#[tokio::test]
async fn a_pull_past_its_timeout_is_a_runtime_timeout_and_frees_its_slot() {
    let server = Server::start(ServerConfig {
        max_pulls: 1,
        pull_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    })
    .await;
    let mut s = server.connect().await;
    assert_eq!(
        ask(&mut s, &format!("pull {IMG_SLOW}\n")).await,
        "error runtime timeout\n"
    );
    let ok = ask(&mut s, &format!("pull {IMG_PULLABLE}\n")).await;
    assert!(ok.starts_with("pulled "), "{ok}");
    server.stop().await;
}
