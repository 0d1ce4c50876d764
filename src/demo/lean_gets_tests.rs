//! The lean GET path against the in-process s3s server, which checks SigV4 signatures: here
//! rather than in `source/lean.rs`, because `source` does not import `demo`.

use std::sync::Arc;

use tokio::io::AsyncReadExt;

use super::server::EmbeddedS3;
use crate::source::client::{Responses, StaticCredentials};
use crate::source::lean::test_support::{lean_for, settings};
use crate::source::lean::LeanGets;
use crate::source::object_source::ObjectRef;

const BUCKET: &str = "bucket";
/// Keys whose escaping the signature must get right.
const KEYS: [&str; 4] = [
    "plain/a.bin",
    "with space/ü+%20&=?.bin",
    "tilde~/x*y",
    "dir/semi;colon,comma'quote",
];

fn object(key: &str) -> ObjectRef<'_> {
    ObjectRef {
        bucket: BUCKET,
        key,
        version_id: None,
        etag: "",
    }
}

fn content(i: usize) -> Vec<u8> {
    format!("object {i}").repeat(1000).into_bytes()
}

async fn serve_keys() -> (tempfile::TempDir, EmbeddedS3) {
    let root = tempfile::tempdir().unwrap();
    for (i, key) in KEYS.iter().enumerate() {
        let path = root.path().join(BUCKET).join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content(i)).unwrap();
    }
    let server = EmbeddedS3::start(root.path()).await.unwrap();
    (root, server)
}

async fn lean_with(
    server: &EmbeddedS3,
    credentials: StaticCredentials,
) -> (LeanGets, Arc<Responses>) {
    let (lean, responses) = lean_for(&settings(&server.endpoint, credentials)).await;
    (
        lean.expect("a plain-HTTP endpoint takes the lean path"),
        responses,
    )
}

#[tokio::test]
async fn signed_gets_of_awkward_keys_are_answered_by_the_lean_path() {
    let (_root, server) = serve_keys().await;
    let (lean, responses) = lean_with(&server, server.credentials.clone()).await;
    for (i, key) in KEYS.iter().enumerate() {
        let mut response = lean
            .get(&object(key), None)
            .await
            .expect("answered with a 200");
        let mut body = Vec::new();
        response.body.read_to_end(&mut body).await.unwrap();
        assert_eq!(body, content(i), "{key}");
    }
    assert_eq!(
        responses.by_operation(),
        [(("GetObject".to_string(), 200), KEYS.len() as u64)].into()
    );
}

#[tokio::test]
async fn a_refused_answer_is_recorded_and_left_to_the_sdk() {
    let (_root, server) = serve_keys().await;
    let wrong = StaticCredentials {
        access_key: server.credentials.access_key.clone(),
        secret_key: "not the secret".to_string(),
        session_token: None,
    };
    let (lean, responses) = lean_with(&server, wrong).await;
    assert!(lean.get(&object(KEYS[0]), None).await.is_none());
    assert_eq!(
        responses.by_operation(),
        [(("GetObject".to_string(), 403), 1)].into()
    );
}

#[tokio::test]
async fn ranged_gets_are_answered_with_their_range() {
    let (_root, server) = serve_keys().await;
    let (lean, responses) = lean_with(&server, server.credentials.clone()).await;
    let key = KEYS[1];
    let mut response = lean
        .get(&object(key), Some(100..1100))
        .await
        .expect("answered with a 206");
    let total = content(1).len();
    assert_eq!(
        response.content_range.as_deref(),
        Some(format!("bytes 100-1099/{total}").as_str())
    );
    assert_eq!(response.content_length, Some(1000));
    let mut body = Vec::new();
    response.body.read_to_end(&mut body).await.unwrap();
    assert_eq!(body, content(1)[100..1100]);

    assert_eq!(
        responses.by_operation(),
        [(("GetObject".to_string(), 206), 1)].into()
    );
}
