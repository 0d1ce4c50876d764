//! HTTPS as on-prem stores serve it, through nginx: object GETs take the lean path over
//! TLS 1.3 and 1.2 (the SDK sends only the listing), connections are reused, and a connection
//! the server closed reopens with a resumed session.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::nginx::{Logged, Nginx};
use crate::support::{assert_mirror, content, hydrator_sync, temp_dest, S3Target, Server};

const OBJECTS: u64 = 60;
/// Requests per connection before nginx closes it.
const KEEPALIVE: usize = 10;
const IN_FLIGHT: usize = 4;

/// The object GETs nginx logged: the requests without a query (listings have one).
fn object_gets(nginx: &Nginx) -> Vec<Logged> {
    let requests = nginx.requests();
    requests
        .into_iter()
        .filter(|r| r.method == "GET" && !r.uri.contains('?'))
        .collect()
}

#[test]
fn whole_object_gets_over_https_take_the_lean_path_reusing_connections_and_sessions() {
    let server = Server::local();
    let expected: BTreeMap<String, Vec<u8>> = (0..OBJECTS)
        .map(|n| (format!("f{n:03}.bin"), content(900 + n, 20_000)))
        .collect();
    server.seed("secure/", &expected);
    let upstream = server.target.endpoint.trim_start_matches("http://");
    let url = format!("s3://{}/secure/", server.target.bucket);
    let in_flight = IN_FLIGHT.to_string();

    for protocol in ["TLSv1.3", "TLSv1.2"] {
        let Some(nginx) = Nginx::start(upstream, protocol, KEEPALIVE) else {
            return;
        };
        let over = |host: &str, args: &[&str]| {
            let target = S3Target {
                endpoint: format!("https://{host}:{}", nginx.port),
                ..server.target.clone()
            };
            let (_dir, dest) = temp_dest();
            let mut args = args.to_vec();
            args.extend(["--concurrency", &in_flight]);
            hydrator_sync(&target, &url, &dest, &args).assert_code(0);
            assert_mirror(&dest, &expected);
        };
        over(
            "localhost",
            &["--ca-bundle", nginx.ca_file.to_str().unwrap()],
        );

        let gets = object_gets(&nginx);
        assert_eq!(gets.len() as u64, OBJECTS, "{gets:?}");
        assert!(gets.iter().all(|r| !r.sdk), "GETs by the SDK: {gets:?}");
        assert!(gets.iter().all(|r| r.protocol == protocol), "{gets:?}");
        let connections: BTreeSet<u64> = gets.iter().map(|r| r.connection).collect();
        let resumed: BTreeSet<u64> = gets
            .iter()
            .filter(|r| r.resumed)
            .map(|r| r.connection)
            .collect();
        eprintln!(
            "{protocol}: {OBJECTS} GETs over {} connections, {} of them resumed",
            connections.len(),
            resumed.len()
        );
        // Each connection carries up to KEEPALIVE requests. Those opened before any session
        // existed (about IN_FLIGHT, a few more when the pool races a connect against a
        // connection coming back) start new sessions; every later one resumes one.
        let fewest = OBJECTS as usize / KEEPALIVE;
        assert!(
            (fewest..=2 * fewest + IN_FLIGHT).contains(&connections.len()),
            "{} connections for {OBJECTS} GETs: {gets:?}",
            connections.len()
        );
        assert!(
            !resumed.is_empty() && resumed.len() + 2 * IN_FLIGHT >= connections.len(),
            "{} of {} connections resumed a session: {gets:?}",
            resumed.len(),
            connections.len()
        );

        // --no-verify-ssl, under a name the certificate does not have: still the lean path.
        over("127.0.0.1", &["--no-verify-ssl"]);
        let gets = object_gets(&nginx);
        assert_eq!(gets.len() as u64, 2 * OBJECTS);
        assert!(gets.iter().all(|r| !r.sdk), "GETs by the SDK: {gets:?}");
    }
}

/// Garage, a real S3 server, behind nginx: its answers (whole objects and the ranged parts of a
/// larger one) are all taken by the lean path, each GET sent once, and the mirror is exact.
#[test]
fn gets_from_garage_over_https_take_the_lean_path_once_each() {
    let Some(server) = Server::garage() else {
        return;
    };
    let mut expected: BTreeMap<String, Vec<u8>> = (0..8u64)
        .map(|n| (format!("small{n}.bin"), content(950 + n, 30_000)))
        .collect();
    expected.insert("large.bin".into(), content(960, 3 * (1 << 20) + 5));
    server.seed("secure-garage/", &expected);
    let upstream = server.target.endpoint.trim_start_matches("http://");
    let Some(nginx) = Nginx::start(upstream, "TLSv1.3", 1000) else {
        return;
    };
    let target = S3Target {
        endpoint: format!("https://localhost:{}", nginx.port),
        ..server.target.clone()
    };
    let url = format!("s3://{}/secure-garage/", server.target.bucket);
    let (_dir, dest) = temp_dest();
    let ca = nginx.ca_file.to_str().unwrap();
    let args = ["--ca-bundle", ca, "--part-size", "1MiB"];
    hydrator_sync(&target, &url, &dest, &args).assert_code(0);
    assert_mirror(&dest, &expected);

    let gets = object_gets(&nginx);
    assert!(gets.iter().all(|r| !r.sdk), "GETs by the SDK: {gets:?}");
    // Eight whole objects and the large one's four parts, none asked twice.
    assert_eq!(gets.len(), 8 + 4, "{gets:?}");
}
