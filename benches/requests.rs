//! What one GET costs the client, by request path. The same small objects are fetched from the
//! near-free origin (`benches/origin.rs`) with the same number in flight, alternating, each as a
//! sync fetches a single-part object (`If-Match`, checksum mode; the origin sends no checksum,
//! so no CRC is computed on either path), through hydrator's own code (`source::bench_support`):
//! - `sdk`: `GetObject` through the SDK client a sync builds (retries, stalled-stream
//!   protection, the response interceptor);
//! - `lean`: the lean path (`source/lean.rs`): signed with `aws-sigv4`, sent over a pooled
//!   `hyper` client, the body CRC'd and watched for stalls by hydrator.
//!
//! The body is received chunk by chunk and dropped; files and hashing are not in the figure.
//! The process's CPU (`getrusage`) over each pass, divided by its GETs, is the request path's
//! cost per object.
//!
//!     cargo build --release --bench origin --bench requests
//!     target/release/deps/origin-HASH --set w3=20000x65536      # prints ENDPOINT
//!     target/release/deps/requests-HASH ENDPOINT w3/ [ROUNDS] [IN_FLIGHT] [sdk|lean]
//!
//! The last argument runs one path alone (to profile it); both run by default. Over HTTPS:
//! start the origin with `--tls CA_FILE` and give the client `AWS_CA_BUNDLE=CA_FILE`.
//!
//! Without arguments (as `cargo test --all-targets` starts it) it prints this usage only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};

use hydrator::source::bench_support::{Path, WholeGets};
use hydrator::source::client::{self, ClientSettings, Responses};

const BUCKET: &str = "bench";

/// An object to fetch, as listed.
struct Listed {
    key: String,
    etag: String,
    size: u64,
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
        region: Some(region),
        path_style: true,
        credentials: Some(client::StaticCredentials {
            access_key,
            secret_key,
            session_token: None,
        }),
        profile: None,
        anonymous: false,
        ca_bundle: std::env::var_os("AWS_CA_BUNDLE").map(|file| std::fs::read(file).unwrap()),
        no_verify_ssl: false,
        max_requests: in_flight,
    };
    let lister = client::build(&settings, Arc::new(Responses::default())).await;
    let objects = list(&lister, prefix).await;
    let gets = WholeGets::new(&settings)
        .await
        .expect("a custom HTTP(S) endpoint has a lean path");
    println!(
        "{} objects under {prefix}, {in_flight} in flight, {rounds} rounds",
        objects.len()
    );
    println!("| path | round | wall s | user s | sys s | CPU µs per GET |");
    println!("|---|---:|---:|---:|---:|---:|");
    let paths = [("sdk", Path::Sdk), ("lean", Path::Lean)];
    for round in 1..=rounds {
        for (name, path) in paths {
            if only.is_some_and(|only| only != name) {
                continue;
            }
            let gets = &gets;
            let pass = measure(&objects, in_flight, |o| async move {
                (gets.get(path, BUCKET, &o.key, &o.etag, o.size).await)
                    .unwrap_or_else(|err| panic!("{name} GET {}: {err}", o.key))
            })
            .await;
            pass.print(name, round, objects.len());
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
