//! How hydrator reaches a bucket: unsigned requests to a public bucket, and named profiles of
//! the shared config and credentials files.

use crate::support::tls::TlsProxy;
use crate::support::{
    assert_mirror, content, files, hydrator_command, hydrator_sync, temp_dest, Server,
    PUBLIC_BUCKET,
};

#[test]
fn a_public_bucket_is_read_unsigned_and_a_private_one_says_it_is_not_public() {
    let server = Server::local();
    let expected = files(&[
        ("a.csv", content(61, 5000)),
        ("b/c.bin", content(62, 300_000)),
    ]);
    server.seed_new_bucket(PUBLIC_BUCKET, "open/", &expected);
    let (_dir, dest) = temp_dest();
    let url = format!("s3://{PUBLIC_BUCKET}/open/");
    hydrator_sync(&server.target, &url, &dest, &["--no-sign-request"]).assert_code(0);
    assert_mirror(&dest, &expected);

    // The test bucket is private: unsigned requests are refused, and the message says why.
    server.seed("private/", &expected);
    let (_dir, dest) = temp_dest();
    let url = format!("s3://{}/private/", server.target.bucket);
    let run = hydrator_sync(&server.target, &url, &dest, &["--no-sign-request"]);
    run.assert_code(2);
    assert!(
        run.stderr().contains("the bucket is not public"),
        "{}",
        run.stderr()
    );
    let both = hydrator_sync(
        &server.target,
        &url,
        &dest,
        &["--no-sign-request", "--profile", "x"],
    );
    both.assert_code(2);
    assert!(
        both.stderr()
            .contains("--no-sign-request sends no credentials"),
        "{}",
        both.stderr()
    );
}

#[test]
fn a_named_profile_supplies_the_credentials() {
    let server = Server::local();
    let expected = files(&[("x.bin", content(63, 70_000))]);
    server.seed("profiled/", &expected);
    let home = tempfile::tempdir().unwrap();
    let credentials = home.path().join("credentials");
    std::fs::write(
        &credentials,
        format!(
            "[default]\naws_access_key_id = AKIAWRONG\naws_secret_access_key = wrong\n\n\
             [training]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            server.target.access_key, server.target.secret_key
        ),
    )
    .unwrap();
    let sync = |profile: &str| {
        let (dir, dest) = temp_dest();
        let output = hydrator_command(&server.target)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .arg("sync")
            .arg(format!("s3://{}/profiled/", server.target.bucket))
            .arg(&dest)
            .args([
                "--endpoint-url",
                &server.target.endpoint,
                "--progress",
                "none",
            ])
            .args(["--profile", profile])
            .output()
            .unwrap();
        (output, dir, dest)
    };
    let (output, _dir, dest) = sync("training");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_mirror(&dest, &expected);
    let (output, _dir, _) = sync("default");
    assert_eq!(
        output.status.code(),
        Some(2),
        "the default profile's keys are wrong"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("credentials were rejected"), "{stderr}");
}

#[test]
fn an_endpoint_signed_by_an_in_house_ca_needs_its_bundle_and_the_right_name_or_no_verify() {
    let server = Server::local();
    let expected = files(&[("tls/a.bin", content(64, 2 * 1024 * 1024 + 5))]);
    server.seed("secure/", &expected);
    let upstream = server
        .target
        .endpoint
        .trim_start_matches("http://")
        .to_string();
    let proxy = TlsProxy::start(&server.runtime, &upstream);
    let ca = proxy.ca_file.to_str().unwrap();
    let url = format!("s3://{}/secure/", server.target.bucket);
    let over = |host: &str, args: &[&str]| {
        let (dir, dest) = temp_dest();
        let target = crate::support::S3Target {
            endpoint: format!("https://{host}:{}", proxy.port),
            ..server.target.clone()
        };
        (hydrator_sync(&target, &url, &dest, args), dir, dest)
    };

    let (run, _dir, _) = over("localhost", &[]);
    run.assert_code(2);
    assert!(run.stderr().contains("not trusted"), "{}", run.stderr());
    assert!(run.stderr().contains("--ca-bundle"), "{}", run.stderr());

    let (run, _dir, dest) = over("localhost", &["--ca-bundle", ca]);
    run.assert_code(0);
    assert_mirror(&dest, &expected);

    // The certificate names localhost, not 127.0.0.1.
    let (run, _dir, _) = over("127.0.0.1", &["--ca-bundle", ca]);
    run.assert_code(2);
    assert!(
        run.stderr()
            .contains("certificate not valid for name \"127.0.0.1\""),
        "{}",
        run.stderr()
    );

    // --no-verify-ssl takes the untrusted certificate under the wrong name, and says so.
    let (run, _dir, dest) = over("127.0.0.1", &["--no-verify-ssl"]);
    run.assert_code(0);
    assert_mirror(&dest, &expected);
    assert!(
        run.stderr()
            .contains("--no-verify-ssl: the server's certificate is not checked"),
        "{}",
        run.stderr()
    );
    let (run, _dir, _) = over("localhost", &["--no-verify-ssl", "--ca-bundle", ca]);
    run.assert_code(2);
}
