//! What MinIO, the customer's store, does its own way, and hydrator on it:
//! - a full-object checksum (CRC32C or CRC64NVME, from one PUT or a multipart upload of type
//!   `FULL_OBJECT`) comes back only on a GET or HEAD without a `Range` and with
//!   `x-amz-checksum-mode: ENABLED`: hydrator HEADs an object fetched in ranged parts once for it
//!   and checks the combined part CRCs against it;
//! - the ETag of a multipart upload is `MD5(MD5(part 1)‖…‖MD5(part N))-N`: a version token for
//!   `If-Match`, not the MD5 of the bytes;
//! - `If-Match` is answered 412 once the object changed: an object replaced mid-run lands
//!   whole, as one version;
//! - listings come 1,000 keys a page, and a version listing's `key-marker` (or a ListObjects
//!   `marker`, or a continuation token that decodes to a key) outside the prefix is answered
//!   `NotImplemented` (a ListObjectsV2 `start-after` outside it is not checked: an empty page):
//!   hydrator pages with the server's own continuation tokens and version markers only.
//!
//! The proxy of [`crate::support::tamper`] flips bytes, replaces objects and holds GETs on the
//! way; MinIO itself answers every request.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use aws_sdk_s3::types::{ChecksumAlgorithm, ChecksumMode, ChecksumType};
use md5::{Digest, Md5};

use crate::support::mount::{cache_on_top, Mounted};
use crate::support::tamper::{Action, Rule, Tamper};
use crate::support::{
    assert_mirror, content, files, has_ready, hydrator_command, hydrator_sync,
    kill_once_parts_are_durable, many_key, temp_dest, wait_until, Run, S3Target, Server, MIB,
};

/// `hydrator sync s3://BUCKET/PREFIX DEST ARGS...` through `tamper`.
fn sync_through(tamper: &Tamper, prefix: &str, dest: &Path, args: &[&str]) -> Run {
    let url = format!("s3://{}/{prefix}", tamper.target.bucket);
    hydrator_sync(&tamper.target, &url, dest, args)
}

/// `hydrator sync --snapshot LOCK DEST ARGS...` against `target`, which must succeed.
fn sync_snapshot(target: &S3Target, lock: &Path, dest: &Path, args: &[&str]) {
    let mut command = hydrator_command(target);
    command.arg("sync").arg("--snapshot").arg(lock).arg(dest);
    command.args(["--endpoint-url", &target.endpoint, "--progress", "none"]);
    let output = command.args(args).output().unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{said}");
}

fn lower_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Uploads `data` at `key` in one PUT with an `algorithm` checksum.
fn put_with(server: &Server, key: &str, data: &[u8], algorithm: ChecksumAlgorithm) {
    let put = server.client.put_object().bucket(&server.target.bucket);
    let put = put.key(key).checksum_algorithm(algorithm);
    server
        .runtime
        .block_on(put.body(data.to_vec().into()).send())
        .unwrap_or_else(|e| panic!("seeding {key}: {e:?}"));
}

/// The checksums of `key` MinIO gives (type, CRC32C, CRC64NVME), to a plain HEAD or, with
/// `range`, to a ranged GET, both asking for them.
fn checksums(
    server: &Server,
    key: &str,
    range: Option<&str>,
) -> (Option<ChecksumType>, Option<String>, Option<String>) {
    let bucket = &server.target.bucket;
    server.runtime.block_on(async {
        let Some(range) = range else {
            let head = server.client.head_object().bucket(bucket).key(key);
            let head = head.checksum_mode(ChecksumMode::Enabled).send().await;
            let head = head.unwrap();
            return (
                head.checksum_type().cloned(),
                head.checksum_crc32_c().map(str::to_string),
                head.checksum_crc64_nvme().map(str::to_string),
            );
        };
        let get = server
            .client
            .get_object()
            .bucket(bucket)
            .key(key)
            .range(range);
        let get = get
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        (
            get.checksum_type().cloned(),
            get.checksum_crc32_c().map(str::to_string),
            get.checksum_crc64_nvme().map(str::to_string),
        )
    })
}

fn head(server: &Server, key: &str) -> aws_sdk_s3::operation::head_object::HeadObjectOutput {
    let head = server.client.head_object().bucket(&server.target.bucket);
    server.runtime.block_on(head.key(key).send()).unwrap()
}

fn etag(server: &Server, key: &str) -> String {
    head(server, key)
        .e_tag()
        .unwrap()
        .trim_matches('"')
        .to_string()
}

/// Objects uploaded with CRC32C and CRC64NVME full-object checksums, in one PUT and in
/// multipart uploads: MinIO gives the checksum to a plain HEAD, never to a ranged GET; hydrator
/// fetches them in 1 MiB parts, and a byte flipped on the way in any of them is caught (BLAKE3
/// cannot: it hashes what arrives) and the object fetched again. Flipped at every GET, the
/// object fails, named.
#[test]
fn full_object_checksums_come_with_a_plain_head_and_catch_a_flipped_byte() {
    let Some(server) = Server::minio() else {
        return;
    };
    let prefix = "sums/";
    let expected = files(&[
        ("crc32c.bin", content(300, 3 * MIB + 5)),
        ("crc64nvme.bin", content(301, 3 * MIB + 7)),
        ("small.bin", content(302, 70_000)),
        ("multi-crc32c.bin", content(303, 11 * MIB + 3)),
        ("multi-crc64nvme.bin", content(304, 11 * MIB + 9)),
    ]);
    let key = |name: &str| format!("{prefix}{name}");
    for (name, algorithm) in [
        ("crc32c.bin", ChecksumAlgorithm::Crc32C),
        ("crc64nvme.bin", ChecksumAlgorithm::Crc64Nvme),
        ("small.bin", ChecksumAlgorithm::Crc32C),
    ] {
        put_with(&server, &key(name), &expected[name], algorithm);
    }
    for (name, algorithm) in [
        ("multi-crc32c.bin", ChecksumAlgorithm::Crc32C),
        ("multi-crc64nvme.bin", ChecksumAlgorithm::Crc64Nvme),
    ] {
        let full = Some(ChecksumType::FullObject);
        server.seed_multipart_with(&key(name), &expected[name], 5 * MIB, algorithm, full);
        assert!(etag(&server, &key(name)).ends_with("-3"), "{name}");
    }
    for name in expected.keys() {
        let (kind, crc32c, crc64) = checksums(&server, &key(name), None);
        assert_eq!(kind, Some(ChecksumType::FullObject), "{name}");
        assert!(crc32c.is_some() != crc64.is_some(), "{name}");
        let ranged = checksums(&server, &key(name), Some("bytes=0-9"));
        assert_eq!(ranged, (None, None, None), "{name}: no checksum on a range");
    }

    let tamper = Tamper::start(&server);
    for name in expected.keys() {
        tamper.add(Rule::get(&key(name), Action::Flip(12_345)));
    }
    let (_tmp, dest) = temp_dest();
    let run = sync_through(&tamper, prefix, &dest, &["--part-size", "1MiB"]);
    run.assert_code(0);
    assert_eq!(tamper.applied(), expected.len());
    assert_mirror(&dest, &expected);
    let report = run.report();
    // The four fetched in parts are fetched again whole; the small one's GET is retried.
    assert!(report["object_restarts"].as_u64().unwrap() >= 4, "{report}");
    assert!(report["part_retries"].as_u64().unwrap() >= 1, "{report}");

    tamper.add(Rule::get(&key("multi-crc64nvme.bin"), Action::Flip(5)).times(usize::MAX));
    let (_tmp, other) = temp_dest();
    let run = sync_through(&tamper, prefix, &other, &["--part-size", "1MiB"]);
    run.assert_code(1);
    let stderr = run.stderr();
    assert!(
        stderr.contains("sums/multi-crc64nvme.bin") && stderr.contains("do not match"),
        "{stderr}"
    );
    assert!(!other.join("multi-crc64nvme.bin").exists());
}

/// MinIO's ETag of one PUT is the MD5 of the bytes, and of a multipart upload the MD5 of the
/// parts' MD5s with `-N`: hydrator pins GETs to either with `If-Match`, and `--check-md5`
/// checks the first (a byte flipped in an object without a checksum is caught) and leaves the
/// second alone.
#[test]
fn a_single_put_etag_is_an_md5_and_a_multipart_etag_only_a_version_token() {
    let Some(server) = Server::minio() else {
        return;
    };
    let expected = files(&[
        ("single.bin", content(310, 3 * MIB + 1)),
        ("multi.bin", content(311, 11 * MIB + 5)),
    ]);
    let single = BTreeMap::from([("single.bin".to_string(), expected["single.bin"].clone())]);
    server.seed_without_checksum("md5/", &single);
    server.seed_multipart("md5/multi.bin", &expected["multi.bin"], 5 * MIB);
    let md5 = |bytes: &[u8]| Md5::digest(bytes).to_vec();
    assert_eq!(
        etag(&server, "md5/single.bin"),
        lower_hex(&md5(&expected["single.bin"]))
    );
    let part_md5s: Vec<u8> = expected["multi.bin"]
        .chunks(5 * MIB)
        .flat_map(md5)
        .collect();
    assert_eq!(
        etag(&server, "md5/multi.bin"),
        format!("{}-3", lower_hex(&md5(&part_md5s)))
    );
    let (kind, crc32c, crc64) = checksums(&server, "md5/single.bin", None);
    assert!(
        kind.is_none() && crc32c.is_none() && crc64.is_none(),
        "uploaded without a checksum, kept without one"
    );

    let tamper = Tamper::start(&server);
    tamper.add(Rule::get("md5/single.bin", Action::Flip(4321)));
    let (_tmp, dest) = temp_dest();
    let run = sync_through(
        &tamper,
        "md5/",
        &dest,
        &["--check-md5", "--part-size", "1MiB"],
    );
    run.assert_code(0);
    assert_eq!(tamper.applied(), 1);
    assert_mirror(&dest, &expected);
    let report = run.report();
    assert!(report["object_restarts"].as_u64().unwrap() >= 1, "{report}");

    // Each object in one GET: a plain one (the lean path) and one pinned to its version (the
    // SDK's), both checking what checksum the answer carries.
    let whole = ["--part-size", "16MiB"];
    let (_tmp, dest) = temp_dest();
    server.sync("md5/", &dest, &whole).assert_code(0);
    assert_mirror(&dest, &expected);
    let (dir, dest) = temp_dest();
    let lock = dir.path().join("md5.lock");
    server.snapshot("md5/", &lock);
    sync_snapshot(&server.target, &lock, &dest, &whole);
    assert_mirror(&dest, &expected);
}

/// An object overwritten (with as many bytes) between the ranged GETs of one run: MinIO answers
/// the next GET's `If-Match` with 412, and the file lands whole as the new version, never a mix.
/// Hydrating a snapshot, the GETs ask for the pinned version and the overwrite changes nothing.
#[test]
fn an_object_replaced_mid_run_lands_whole_as_one_version() {
    let Some(server) = Server::minio() else {
        return;
    };
    let old = content(320, 4 * MIB + 5);
    let new = content(321, 4 * MIB + 5);
    server.seed("swap/", &files(&[("model.bin", old.clone())]));
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("swap.lock");
    server.snapshot("swap/", &lock);

    let tamper = Tamper::start(&server);
    tamper.add(Rule::get("swap/model.bin", Action::Replace(new.clone())).skip(2));
    let args = ["--part-size", "1MiB", "--concurrency", "1"];
    let dest = dir.path().join("dest");
    let run = sync_through(&tamper, "swap/", &dest, &args);
    run.assert_code(0);
    assert_eq!(tamper.applied(), 1, "the object was replaced");
    run.assert_restarted_into(&dest, "model.bin", &new);

    tamper.add(Rule::get("swap/model.bin", Action::Replace(content(322, 10))).skip(2));
    let pinned = dir.path().join("pinned");
    sync_snapshot(&tamper.target, &lock, &pinned, &args);
    assert_eq!(tamper.applied(), 2, "the object was replaced again");
    assert_mirror(&pinned, &files(&[("model.bin", old)]));
}

/// `kill -9` in the middle of an object (its second 8 MiB part held back on the way): a run
/// straight to MinIO keeps the parts made durable, fetches the rest and verifies.
#[test]
fn a_sync_killed_mid_object_resumes_from_its_durable_parts() {
    let Some(server) = Server::minio() else {
        return;
    };
    let expected = files(&[
        ("big.bin", content(330, 24 * MIB)),
        ("small.txt", content(331, 100)),
    ]);
    server.seed("resume/", &expected);
    let tamper = Tamper::start(&server);
    let hold = Action::Hold(Duration::from_secs(60));
    tamper.add(Rule::get("resume/big.bin", hold).skip(1));
    let (_tmp, dest) = temp_dest();
    let mut child = hydrator_command(&tamper.target)
        .arg("sync")
        .arg(format!("s3://{}/resume/", tamper.target.bucket))
        .arg(&dest)
        .args([
            "--endpoint-url",
            &tamper.target.endpoint,
            "--progress",
            "none",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    kill_once_parts_are_durable(&mut child, &dest);
    assert!(!has_ready(&dest), "killed before the end");

    let rerun = server.sync("resume/", &dest, &[]);
    rerun.assert_resumed(&dest, &expected, 8 * MIB as u64);
    let verify = server.hydrator(&["verify".as_ref(), dest.as_os_str()]);
    assert_eq!(verify.status.code(), Some(0), "{verify:?}");
}

/// 1,001 objects, one of them with four versions and one deleted (a delete marker) at the end of
/// the first page, between keys outside the prefix: MinIO answers a version listing's `key-marker` outside the prefix
/// `NotImplemented`, and hydrator's listing (continuation tokens) and version listing (the
/// server's key and version markers) page through all of it, so sync and snapshot see every
/// object at its latest version, and not the deleted one.
#[test]
fn listings_past_one_page_never_ask_for_a_marker_outside_the_prefix() {
    let Some(server) = Server::minio() else {
        return;
    };
    let prefix = "paged/";
    let count = 1001;
    server.seed_many(prefix, count, 10);
    let outside = files(&[
        ("paged-before", content(400, 10)),
        ("pagedz/after", content(401, 10)),
    ]);
    server.seed("", &outside);
    let mut expected: BTreeMap<String, Vec<u8>> = (0..count)
        .map(|i| (many_key("", i), content(i as u64, 10)))
        .collect();
    let versioned = many_key("", 998);
    for seed in 402..405 {
        let latest = files(&[(versioned.as_str(), content(seed, 10))]);
        server.seed(prefix, &latest);
        expected.extend(latest);
    }
    // Deleted: its latest version is a delete marker, beside the versions above.
    let deleted = many_key("", 997);
    let delete = server.client.delete_object().bucket(&server.target.bucket);
    let delete = delete.key(format!("{prefix}{deleted}")).send();
    server.runtime.block_on(delete).unwrap();
    expected.remove(&deleted);
    // A `start-after` outside the prefix gets an empty page; a version listing's `key-marker`
    // outside it, `NotImplemented`.
    let list = server
        .client
        .list_objects_v2()
        .bucket(&server.target.bucket);
    let after = list.prefix(prefix).start_after("pagedz/after").send();
    let after = server.runtime.block_on(after).unwrap();
    assert!(after.contents().is_empty() && after.is_truncated() == Some(false));
    let versions = server
        .client
        .list_object_versions()
        .bucket(&server.target.bucket);
    let refused = versions.prefix(prefix).key_marker("pagedz/after").send();
    let refused = server.runtime.block_on(refused);
    let refused = refused.expect_err("a key-marker outside the prefix");
    let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&refused);
    assert_eq!(code, Some("NotImplemented"), "{refused:?}");

    let (dir, dest) = temp_dest();
    let run = server.sync(prefix, &dest, &[]);
    run.assert_code(0);
    assert_mirror(&dest, &expected);

    let snapshot = server.snapshot(prefix, &dir.path().join("paged.lock"));
    let entries = snapshot["entries"].as_array().unwrap();
    assert_eq!(entries.len(), count - 1, "one entry per object not deleted");
    assert!(entries.iter().all(|e| e["version_id"].is_string()));
    let latest = head(&server, &format!("{prefix}{versioned}"));
    let latest = latest.version_id().unwrap();
    let pinned = entries
        .iter()
        .find(|e| e["key"] == format!("{prefix}{versioned}"))
        .unwrap();
    assert_eq!(pinned["version_id"], latest);
}

/// The lazy view (`hydrator mount`, what a CSI lazy volume serves) of a MinIO prefix: names and
/// sizes at once, every byte as MinIO holds it, from multipart and single-PUT objects alike,
/// then READY and the hydrated cache bound over the view.
#[test]
fn a_lazy_view_reads_every_byte_as_minio_holds_it() {
    let Some(server) = Server::minio() else {
        return;
    };
    let mut dataset = files(&[
        ("top.txt", content(410, 5)),
        ("d/a.bin", content(411, 3 * MIB + 1)),
        ("empty", Vec::new()),
    ]);
    server.seed("lazy/", &dataset);
    dataset.insert("d/multi.bin".into(), content(412, 11 * MIB + 3));
    server.seed_multipart("lazy/d/multi.bin", &dataset["d/multi.bin"], 5 * MIB);
    let mut mount = Mounted::start(&server, "lazy/", &[]);
    for (path, data) in &dataset {
        let meta = std::fs::metadata(mount.path(path)).unwrap();
        assert_eq!(meta.len(), data.len() as u64, "{path}");
    }
    for (path, data) in &dataset {
        assert!(std::fs::read(mount.path(path)).unwrap() == *data, "{path}");
    }
    wait_until("READY in the cache", Duration::from_secs(60), || {
        has_ready(&mount.cache)
    });
    wait_until("the cache over the view", Duration::from_secs(10), || {
        cache_on_top(&mount.mountpoint)
    });
    for (path, data) in &dataset {
        assert!(std::fs::read(mount.path(path)).unwrap() == *data, "{path}");
    }
    assert_eq!(mount.stop("TERM"), Some(0), "{}", mount.log());
}

/// An init container that ran `mc alias set` and `mc mirror` runs `hydrator sync
/// ALIAS/BUCKET/PREFIX/` with the keys mc keeps, no AWS variable set: in the config file the real
/// mc wrote, and in `MC_HOST_<ALIAS>`.
#[test]
fn the_alias_mc_itself_sets_reaches_minio() {
    let (Some(server), Some(mc)) = (Server::minio(), crate::support::minio::mc()) else {
        return;
    };
    let expected = files(&[
        ("a.bin", content(420, 2 * MIB + 1)),
        ("b/c.txt", content(421, 10)),
    ]);
    server.seed("mc-alias/", &expected);
    let target = &server.target;
    let config = tempfile::tempdir().unwrap();
    let set = std::process::Command::new(mc)
        .env("MC_CONFIG_DIR", config.path())
        .args(["alias", "set", "depot", &target.endpoint])
        .args([&target.access_key, &target.secret_key])
        .output()
        .unwrap();
    assert!(set.status.success(), "{set:?}");
    let host = target.endpoint.trim_start_matches("http://");
    let keys = format!("{}:{}", target.access_key, target.secret_key);
    let source = format!("depot/{}/mc-alias/", target.bucket);
    for (name, value) in [
        ("MC_CONFIG_DIR", config.path().display().to_string()),
        ("MC_HOST_depot", format!("http://{keys}@{host}")),
    ] {
        let (_tmp, dest) = temp_dest();
        let output = hydrator_command(target)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env(name, value)
            .args(["sync", &source])
            .arg(&dest)
            .args(["--progress", "none"])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{name}: {said}");
        assert_mirror(&dest, &expected);
    }
}

/// A busy MinIO (here `MINIO_API_REQUESTS_MAX=2`; by default MinIO sizes it from its memory)
/// answers every request beyond it at once with 429 `TooManyRequests`: 1,100 objects at
/// `--concurrency 64` (the listing's second page asked for while the GETs fill the server)
/// complete all the same, the throttling answers counted.
#[test]
fn a_minio_past_its_requests_max_is_ridden_out() {
    let Some((server, _minio)) = Server::minio_own(&[("MINIO_API_REQUESTS_MAX", "2")]) else {
        return;
    };
    // One PUT at a time: the seeding stays within the server's two.
    let expected: BTreeMap<String, Vec<u8>> = (0..1100)
        .map(|i| (many_key("", i), content(i as u64, 10)))
        .collect();
    server.seed("busy/", &expected);
    let (_tmp, dest) = temp_dest();
    let run = server.sync("busy/", &dest, &["--concurrency", "64"]);
    run.assert_code(0);
    assert_mirror(&dest, &expected);
    let bound = &run.report()["bound"];
    assert!(bound["throttled_answers"].as_u64().unwrap() > 0, "{bound}");
}
