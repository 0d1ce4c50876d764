//! A near-free S3 origin for measuring what a client costs: it answers ListObjectsV2, HEAD,
//! GetBucketVersioning and ranged GETs of generated objects from memory, checks no signature,
//! and so spends next to no CPU on a request. Against Garage on the same two cores the server
//! takes most of the CPU and wall times measure it; against this, the client's CPU per byte and
//! per object is what is left.
//!
//!     cargo build --release --bench origin
//!     target/release/deps/origin-HASH --set w1=1x2147483648 --set w3=20000x65536
//!
//! prints `http://127.0.0.1:PORT` once it listens; with `--tls CA_FILE` it serves HTTPS instead
//! (TLS 1.3 and 1.2, rustls), with a certificate for `localhost` signed by a CA made at start,
//! whose certificate it writes to CA_FILE for the client's `--ca-bundle`, and prints
//! `https://localhost:PORT`. What it serves, and how: `tests/e2e/support/origin.rs`, shared
//! with the suite, which runs it in-process.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

#[path = "../tests/e2e/support/authority.rs"]
mod authority;
#[path = "../tests/e2e/support/origin.rs"]
mod origin;

use origin::{decode, parse_range, serve, Origin, Set};

fn main() {
    let mut sets = Vec::new();
    let mut port = 0u16;
    let mut tls = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--set" => match args.next().map(|s| Set::parse(&s)) {
                Some(Ok(set)) => sets.push(set),
                Some(Err(why)) => fail(&why),
                None => fail("--set needs NAME=COUNTxSIZE"),
            },
            "--port" => {
                port = args
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or_else(|| fail("--port needs a number"))
            }
            "--tls" => tls = Some(args.next().unwrap_or_else(|| fail("--tls needs CA_FILE"))),
            // `cargo test` and `cargo bench` pass flags of their own.
            _ => {}
        }
    }
    if sets.is_empty() {
        self_check();
        return;
    }
    let origin = Arc::new(Origin::new(sets));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let tls = tls.map(|ca_file| {
        let authority = authority::Authority::new();
        std::fs::write(&ca_file, &authority.ca_pem).unwrap_or_else(|e| fail(&e.to_string()));
        tokio_rustls::TlsAcceptor::from(Arc::new(authority.server_config()))
    });
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        match tls {
            Some(_) => println!("https://localhost:{port}"),
            None => println!("http://127.0.0.1:{port}"),
        }
        std::io::stdout().flush().expect("stdout");
        serve(origin, listener, tls).await
    });
}

fn fail(why: &str) -> ! {
    eprintln!("origin: {why}");
    std::process::exit(2)
}

/// Run by `cargo test --all-targets` (which starts bench targets without arguments): the
/// listing pages through keys in order, lookups find exactly the listed keys, ranges parse.
fn self_check() {
    let origin = Origin::new(vec![
        Set::parse("a=2500x10").unwrap(),
        Set::parse("b=3x1").unwrap(),
    ]);
    let mut after = String::new();
    let mut all = Vec::new();
    loop {
        let (page, more) = origin.list("", &after, 1000);
        all.extend(page.iter().map(|(key, _, _)| key.clone()));
        after = all.last().unwrap().clone();
        if !more {
            break;
        }
    }
    assert_eq!(all.len(), 2503);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "keys in order");
    assert_eq!(all[1000], "a/d0001/f001000.bin");
    assert_eq!(all[2500], "b/f000000.bin");
    assert_eq!(origin.list("a/d0002/", "", 1000).0.len(), 500);
    assert_eq!(
        origin.list("a/d0002/", "a/d0002/f002099.bin", 1000).0.len(),
        400
    );
    assert_eq!(origin.list("b/", "", 2).0.len(), 2);
    assert!(origin.list("c/", "", 1000).0.is_empty());
    assert!(all.iter().all(|key| origin.object(key).is_some()));
    assert!(origin.object("a/d0001/f002499.bin").is_none());
    assert!(origin.object("a/f000001.bin").is_none());
    assert_eq!(parse_range("bytes=0-9", 100), Some((0, 9)));
    assert_eq!(parse_range("bytes=90-", 100), Some((90, 99)));
    assert_eq!(parse_range("bytes=-10", 100), Some((90, 99)));
    assert_eq!(parse_range("bytes=0-1000", 100), Some((0, 99)));
    assert_eq!(parse_range("bytes=100-", 100), None);
    assert_eq!(decode("a%2Fb%zz"), "a/b%zz");
    println!("origin: self-check passed (listing order and pages, lookups, ranges)");
}
