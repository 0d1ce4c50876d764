//! The lean path's HTTP/1.1 against a server that answers as each test scripts it, byte for
//! byte: connection reuse, a connection the server closed while idle, framing it refuses, a
//! body cut short, and an answer that is not for the GET it arrives after.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::test_support::{get, large, lean_for, partial, settings, source_for, OBJECT};
use super::LeanGets;
use crate::error::{PartError, ProtocolError};
use crate::source::client::{Responses, StaticCredentials};
use crate::source::fetch::{get_range, PinnedObject};

const BODY: &[u8] = b"0123456789abcdefghij";

/// How the server answers its `n`th request (counted from 0 over all connections).
struct Answer {
    bytes: Vec<u8>,
    /// Close the connection after it, without saying so.
    then_close: bool,
}

/// A server on a local port answering with `script`; returns its endpoint and counts of the
/// connections it accepted and the requests it answered.
async fn scripted(script: fn(usize) -> Answer) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (accepted, answered) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            accepted.fetch_add(1, Ordering::SeqCst);
            let requests = requests.clone();
            tokio::spawn(async move {
                let mut read = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&chunk[..n]),
                    }
                    let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    read.drain(..end + 4);
                    let answer = script(requests.fetch_add(1, Ordering::SeqCst));
                    socket.write_all(&answer.bytes).await.unwrap();
                    if answer.then_close {
                        return;
                    }
                }
            });
        }
    });
    (endpoint, connections, answered)
}

async fn lean(endpoint: &str) -> (LeanGets, Arc<Responses>) {
    let credentials = StaticCredentials {
        access_key: "a".to_string(),
        secret_key: "b".to_string(),
        session_token: None,
    };
    let (lean, responses) = lean_for(&settings(endpoint, credentials)).await;
    (lean.expect("an HTTP endpoint"), responses)
}

#[tokio::test]
async fn a_connection_carries_one_get_after_another() {
    // Bodies larger than what is read with the head, of lengths that differ by a byte.
    let (endpoint, connections, _) = scripted(|n| Answer {
        bytes: partial(&large(n), ""),
        then_close: false,
    })
    .await;
    let (lean, responses) = lean(&endpoint).await;
    for n in 0..3 {
        let body = get(&lean, large(n).len() as u64).await.expect("taken");
        assert!(body.unwrap() == large(n), "body {n}");
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    assert_eq!(
        responses.by_operation(),
        [(("GetObject".to_string(), 206), 3)].into()
    );
}

#[tokio::test]
async fn a_connection_the_server_closed_while_idle_is_replaced_unseen() {
    // The first connection is closed after its answer; the second carries the rest.
    let (endpoint, connections, _) = scripted(|n| Answer {
        bytes: partial(BODY, ""),
        then_close: n == 0,
    })
    .await;
    let (lean, _) = lean(&endpoint).await;
    for _ in 0..3 {
        let body = get(&lean, BODY.len() as u64).await.expect("taken");
        assert_eq!(body.unwrap(), BODY);
    }
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_get_dropped_unanswered_on_a_reused_connection_is_asked_again_on_a_new_one() {
    // The server reads the second request and closes without an answer, as one closing an
    // idle connection just as a request arrives does.
    let (endpoint, connections, requests) = scripted(|n| match n {
        1 => Answer {
            bytes: Vec::new(),
            then_close: true,
        },
        _ => Answer {
            bytes: partial(BODY, ""),
            then_close: false,
        },
    })
    .await;
    let (lean, responses) = lean(&endpoint).await;
    for _ in 0..3 {
        let body = get(&lean, BODY.len() as u64).await.expect("taken");
        assert_eq!(body.unwrap(), BODY);
    }
    assert_eq!(
        requests.load(Ordering::SeqCst),
        4,
        "the dropped one asked again"
    );
    assert_eq!(connections.load(Ordering::SeqCst), 2);
    assert_eq!(
        responses.by_operation(),
        [(("GetObject".to_string(), 206), 3)].into()
    );
}

#[tokio::test]
async fn a_connection_the_answer_closes_is_not_reused() {
    let (endpoint, connections, _) = scripted(|_| Answer {
        bytes: partial(BODY, "connection: close\r\n"),
        then_close: false,
    })
    .await;
    let (lean, _) = lean(&endpoint).await;
    for _ in 0..2 {
        assert_eq!(get(&lean, BODY.len() as u64).await.unwrap().unwrap(), BODY);
    }
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_server_whose_answers_lack_a_content_length_is_left_to_the_sdk() {
    let (endpoint, _, requests) = scripted(|_| Answer {
        bytes: b"HTTP/1.1 206 Partial Content\r\ntransfer-encoding: chunked\r\n\r\n\
                 14\r\n0123456789abcdefghij\r\n0\r\n\r\n"
            .to_vec(),
        then_close: false,
    })
    .await;
    let (lean, responses) = lean(&endpoint).await;
    assert!(get(&lean, BODY.len() as u64).await.is_none());
    assert_eq!(
        responses.by_operation(),
        [(("GetObject".to_string(), 206), 1)].into()
    );
    // Each GET would be sent twice: the lean path stands aside from then on.
    assert!(get(&lean, BODY.len() as u64).await.is_none());
    assert_eq!(requests.load(Ordering::SeqCst), 1, "asked once");
}

#[tokio::test]
async fn a_body_cut_short_fails_with_what_was_missing() {
    let (endpoint, _, _) = scripted(|_| {
        let mut bytes = partial(BODY, "");
        bytes.truncate(bytes.len() - 5);
        Answer {
            bytes,
            then_close: true,
        }
    })
    .await;
    let (lean, _) = lean(&endpoint).await;
    let err = get(&lean, BODY.len() as u64).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(err.to_string().contains("5 bytes before"), "{err}");
}

#[tokio::test]
async fn a_whole_object_whose_crc_is_not_the_servers_checksum_fails_at_its_end() {
    let (endpoint, _, _) = scripted(|_| Answer {
        bytes: [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\netag: \"e\"\r\n\
               x-amz-checksum-crc32c: AAAAAA==\r\nx-amz-checksum-type: FULL_OBJECT\r\n\r\n"[..],
            BODY,
        ]
        .concat(),
        then_close: false,
    })
    .await;
    let (lean, _) = lean(&endpoint).await;
    let mut response = lean.get(&OBJECT, None).await.expect("a 200");
    let mut body = Vec::new();
    let err = response.body.read_to_end(&mut body).await.unwrap_err();
    assert!(err.to_string().contains("CRC32C"), "{err}");
}

#[tokio::test]
async fn an_answer_without_an_etag_is_not_taken_for_the_object() {
    // A broken proxy's bytes, late after the first answer, arrive as the second GET's answer:
    // framed and plausible, of the right length, but not this object's (no ETag).
    let (endpoint, _, _) = scripted(|n| Answer {
        bytes: match n {
            1 => b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\nXXXXXXXXXXXXXXXXXXXX".to_vec(),
            _ => [
                &b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\netag: \"e\"\r\n\r\n"[..],
                BODY,
            ]
            .concat(),
        },
        then_close: false,
    })
    .await;
    let credentials = StaticCredentials {
        access_key: "a".to_string(),
        secret_key: "b".to_string(),
        session_token: None,
    };
    let source = source_for(&settings(&endpoint, credentials)).await;
    let object = PinnedObject {
        bucket: "b".to_string(),
        key: "k".to_string(),
        etag: "\"e\"".to_string(),
        size: BODY.len() as u64,
        version_id: None,
    };
    let whole = 0..BODY.len() as u64;
    let mut first = get_range(&source, &object, whole.clone()).await.unwrap();
    let mut body = Vec::new();
    first.read_to_end(&mut body).await.unwrap();
    assert_eq!(body, BODY);
    let second = get_range(&source, &object, whole).await;
    assert!(
        matches!(second, Err(PartError::Protocol(ProtocolError::NoEtag))),
        "taken: {:?}",
        second.map(|_| ())
    );
    assert!(PartError::Protocol(ProtocolError::NoEtag).is_retryable());
}
