//! What one GET costs the client, by request path. The same small objects are fetched from the
//! near-free origin (`benches/origin.rs`) with the same number in flight, alternating:
//! - `sdk`: `GetObject` through the client hydrator builds (`source::client::build`: retries,
//!   stalled-stream protection, the response interceptor), sent as hydrator sends a whole small
//!   object (`If-Match`, checksum mode);
//! - `lean`: the same request signed with `aws-sigv4` (as the SDK signs for S3) and sent over a
//!   pooled `hyper` client, with no retry or timeout machinery.
//!
//! The body is received chunk by chunk and dropped; files and hashing are not in the figure.
//! The process's CPU (`getrusage`) over each pass, divided by its GETs, is what a lean GET path
//! would save per object at most.
//!
//!     cargo build --release --bench origin --bench requests
//!     target/release/deps/origin-HASH --set w3=20000x65536      # prints ENDPOINT
//!     target/release/deps/requests-HASH ENDPOINT w3/ [ROUNDS] [IN_FLIGHT] [sdk|lean]
//!
//! The last argument runs one path alone (to profile it); both run by default.
//!
//! Without arguments (as `cargo test --all-targets` starts it) it prints this usage only.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use bytes::Bytes;
use futures::{stream, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use hydrator::source::client::{self, ClientSettings, Responses};

const BUCKET: &str = "bench";

/// An object to fetch, as listed.
struct Listed {
    key: String,
    etag: String,
    size: u64,
}

/// What the lean path needs to sign and send.
struct Lean {
    client: Client<HttpConnector, Empty<Bytes>>,
    endpoint: String,
    identity: Identity,
    region: String,
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let [endpoint, prefix, rest @ ..] = args.as_slice() else {
        println!(
            "usage: requests ENDPOINT PREFIX [ROUNDS] [IN_FLIGHT] [sdk|lean] (see benches/requests.rs)"
        );
        return;
    };
    let number = |i: usize, default: usize| {
        rest.get(i).map_or(default, |n| {
            n.parse().unwrap_or_else(|_| panic!("not a number: {n}"))
        })
    };
    let (rounds, in_flight) = (number(0, 3), number(1, 32));
    let only = rest.get(2).map(String::as_str);
    if !matches!(only, None | Some("sdk" | "lean")) {
        panic!("the path is sdk or lean, not {only:?}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(endpoint, prefix, rounds, in_flight, only));
}

async fn run(endpoint: &str, prefix: &str, rounds: usize, in_flight: usize, only: Option<&str>) {
    let access_key = std::env::var("AWS_ACCESS_KEY_ID").expect("AWS_ACCESS_KEY_ID");
    let secret_key = std::env::var("AWS_SECRET_ACCESS_KEY").expect("AWS_SECRET_ACCESS_KEY");
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
    let settings = ClientSettings {
        endpoint: Some(endpoint.to_string()),
        region: Some(region.clone()),
        path_style: true,
        credentials: Some(client::StaticCredentials {
            access_key: access_key.clone(),
            secret_key: secret_key.clone(),
        }),
        profile: None,
        anonymous: false,
        ca_bundle: None,
        no_verify_ssl: false,
        max_requests: in_flight,
    };
    let sdk = client::build(&settings, Arc::new(Responses::default())).await;
    let objects = list(&sdk, prefix).await;
    let lean = Lean {
        client: Client::builder(TokioExecutor::new()).build_http(),
        endpoint: endpoint.trim_end_matches('/').to_string(),
        identity: Credentials::new(access_key, secret_key, None, None, "bench").into(),
        region,
    };
    println!(
        "{} objects under {prefix}, {in_flight} in flight, {rounds} rounds",
        objects.len()
    );
    println!("| path | round | wall s | user s | sys s | CPU µs per GET |");
    println!("|---|---:|---:|---:|---:|---:|");
    for round in 1..=rounds {
        let (sdk, lean) = (&sdk, &lean);
        if only != Some("lean") {
            let pass = measure(
                &objects,
                in_flight,
                |o| async move { sdk_get(sdk, o).await },
            )
            .await;
            pass.print("sdk", round, objects.len());
        }
        if only != Some("sdk") {
            let pass = measure(
                &objects,
                in_flight,
                |o| async move { lean_get(lean, o).await },
            )
            .await;
            pass.print("lean", round, objects.len());
        }
    }
}

async fn list(sdk: &aws_sdk_s3::Client, prefix: &str) -> Vec<Listed> {
    let mut pages = sdk
        .list_objects_v2()
        .bucket(BUCKET)
        .prefix(prefix)
        .into_paginator()
        .send();
    let mut objects = Vec::new();
    while let Some(page) = pages.next().await {
        for object in page.expect("listing").contents() {
            objects.push(Listed {
                key: object.key().expect("key").to_string(),
                etag: object.e_tag().expect("etag").to_string(),
                size: object.size().expect("size") as u64,
            });
        }
    }
    assert!(!objects.is_empty(), "nothing listed under {prefix}");
    objects
}

/// Wall and CPU time of one pass.
struct Pass {
    wall: Duration,
    user: Duration,
    sys: Duration,
}

impl Pass {
    fn print(&self, path: &str, round: usize, gets: usize) {
        let cpu = self.user + self.sys;
        println!(
            "| {path} | {round} | {:.2} | {:.2} | {:.2} | {:.1} |",
            self.wall.as_secs_f64(),
            self.user.as_secs_f64(),
            self.sys.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / gets as f64
        );
    }
}

/// Runs `get` on every object, `in_flight` at a time; every body must be as long as listed.
async fn measure<'a, F, Fut>(objects: &'a [Listed], in_flight: usize, get: F) -> Pass
where
    F: Fn(&'a Listed) -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let (start, before) = (Instant::now(), rusage());
    stream::iter(objects)
        .map(|object| {
            let received = get(object);
            async move { (object, received.await) }
        })
        .buffer_unordered(in_flight)
        .for_each(|(object, received)| async move {
            assert_eq!(received, object.size, "{}: body length", object.key);
        })
        .await;
    let (wall, after) = (start.elapsed(), rusage());
    Pass {
        wall,
        user: after.0 - before.0,
        sys: after.1 - before.1,
    }
}

async fn sdk_get(sdk: &aws_sdk_s3::Client, object: &Listed) -> u64 {
    let response = sdk
        .get_object()
        .bucket(BUCKET)
        .key(&object.key)
        .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
        .if_match(&object.etag)
        .send()
        .await
        .unwrap_or_else(|err| panic!("GET {}: {err:?}", object.key));
    let mut body = response.body;
    let mut received = 0;
    while let Some(chunk) = body.next().await {
        received += chunk.expect("body").len() as u64;
    }
    received
}

async fn lean_get(lean: &Lean, object: &Listed) -> u64 {
    let uri = format!("{}/{BUCKET}/{}", lean.endpoint, object.key);
    let headers = [
        ("if-match", object.etag.as_str()),
        ("x-amz-checksum-mode", "ENABLED"),
    ];
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    let params = v4::SigningParams::builder()
        .identity(&lean.identity)
        .region(&lean.region)
        .name("s3")
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .expect("signing params")
        .into();
    let signable = SignableRequest::new("GET", &uri, headers.into_iter(), SignableBody::Bytes(&[]))
        .expect("signable request");
    let (instructions, _) = sign(signable, &params).expect("signing").into_parts();
    let mut request = hyper::Request::get(&uri);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let mut request = request.body(Empty::new()).expect("request");
    instructions.apply_to_request_http1x(&mut request);
    let response = lean
        .client
        .request(request)
        .await
        .unwrap_or_else(|err| panic!("GET {}: {err:?}", object.key));
    assert!(
        response.status().is_success(),
        "GET {}: {}",
        object.key,
        response.status()
    );
    let mut body = response.into_body();
    let mut received = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("body").into_data() {
            received += data.len() as u64;
        }
    }
    received
}

/// The process's user and system CPU time so far.
fn rusage() -> (Duration, Duration) {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF cannot fail.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    (time(usage.ru_utime), time(usage.ru_stime))
}
