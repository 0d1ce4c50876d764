//! Shared helpers of the end-to-end suite: S3 servers to run against (the in-process s3s server
//! behind a fault injector, Garage, moto and MinIO), seeding, running the real `hydrator`
//! binary, and checking a mirror byte for byte.

/// Defines a module `NAME` with two tests, `local` (the in-process server) and `garage`
/// (skipped where Garage is neither installed nor required), each running `CHECK(&server[,
/// PREFIX])`.
macro_rules! on_both_servers {
    (@tests $check:ident $(, $prefix:expr)?) => {
        #[test]
        fn local() {
            super::$check(&crate::support::Server::local() $(, $prefix)?);
        }

        on_both_servers!(@on garage, $check $(, $prefix)?);
    };
    // A test named after the external server it runs on, skipped where that server is neither
    // installed nor required.
    (@on $server:ident, $check:ident $(, $prefix:expr)?) => {
        #[test]
        fn $server() {
            if let Some(server) = crate::support::Server::$server() {
                super::$check(&server $(, $prefix)?);
            }
        }
    };
    ($name:ident, $check:ident $(, $prefix:expr)?) => {
        mod $name {
            on_both_servers!(@tests $check $(, $prefix)?);
        }
    };
}

/// The tests of `on_both_servers!` and a third one, `minio` (a versioned bucket on MinIO, the
/// customer's store), for what a customer's dataset goes through but needs no versions of
/// moto's.
macro_rules! on_both_servers_and_minio {
    ($name:ident, $check:ident $(, $prefix:expr)?) => {
        mod $name {
            on_both_servers!(@tests $check $(, $prefix)?);
            on_both_servers!(@on minio, $check $(, $prefix)?);
        }
    };
}

/// The conformance checks: the tests of `on_both_servers!`, `moto` (a versioned bucket on
/// moto's server) and `minio` (a versioned bucket on MinIO).
macro_rules! on_every_server {
    ($name:ident, $check:ident $(, $prefix:expr)?) => {
        mod $name {
            on_both_servers!(@tests $check $(, $prefix)?);
            on_both_servers!(@on moto, $check $(, $prefix)?);
            on_both_servers!(@on minio, $check $(, $prefix)?);
        }
    };
}

pub mod authority;
pub mod csi;
pub mod daemon;
pub mod dfdaemon;
pub mod disk;
pub mod dragonfly_api;
pub mod dragonfly_scheduler;
pub mod faults;
pub mod garage;
pub mod keeper;
pub mod minio;
pub mod moto;
pub mod mount;
pub mod nginx;
pub mod origin;
pub mod scheduler;
pub mod seccomp;
pub mod tamper;
pub mod tls;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use faults::{Faults, FaultyS3};

/// The bucket of moto and MinIO that keeps versions.
pub const VERSIONED_BUCKET: &str = "hydrator-versioned";

/// MinIO's bucket that keeps no versions (its version ids are all "null").
pub const PLAIN_BUCKET: &str = "hydrator-plain";

/// The in-process server's bucket that anyone may read without signing.
pub const PUBLIC_BUCKET: &str = "open-data";

/// Connection details of an S3 server under test.
#[derive(Clone, Debug)]
pub struct S3Target {
    pub endpoint: String,
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
    pub bucket: String,
}

/// A server, a runtime to drive it and a client to seed it.
pub struct Server {
    pub target: S3Target,
    pub faults: Arc<Faults>,
    pub runtime: tokio::runtime::Runtime,
    pub client: aws_sdk_s3::Client,
    _data: Option<tempfile::TempDir>,
}

impl Server {
    /// The in-process s3s-fs server with the fault injector, bucket created.
    pub fn local() -> Self {
        let runtime = runtime();
        let data = tempfile::tempdir().unwrap();
        let credentials = hydrator::source::client::StaticCredentials {
            access_key: "AKIATESTHYDRATOR0001".into(),
            secret_key: "test-secret-key-of-the-in-process-server".into(),
            session_token: None,
        };
        let inner =
            hydrator::demo::server::s3_service(data.path(), &credentials, Some(PUBLIC_BUCKET))
                .unwrap();
        let faults = Arc::new(Faults::default());
        let replace_client = Arc::new(Mutex::new(None));
        let service = FaultyS3 {
            inner,
            faults: faults.clone(),
            client: replace_client.clone(),
        };
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
            .unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        {
            let _guard = runtime.enter();
            hydrator::demo::server::spawn_server(listener, service);
        }
        let target = S3Target {
            endpoint,
            region: "us-east-1".into(),
            access_key: credentials.access_key,
            secret_key: credentials.secret_key,
            bucket: "hydrator-test".into(),
        };
        let client = client_for(&target);
        *replace_client.lock().unwrap() = Some(client.clone());
        runtime
            .block_on(client.create_bucket().bucket(&target.bucket).send())
            .unwrap();
        Self {
            target,
            faults,
            runtime,
            client,
            _data: Some(data),
        }
    }

    /// The shared Garage of this test process, or `None` where Garage is not installed and
    /// not required.
    pub fn garage() -> Option<Self> {
        let garage = garage::shared()?;
        let target = S3Target {
            endpoint: garage.endpoint.clone(),
            region: garage.region.clone(),
            access_key: garage.access_key.clone(),
            secret_key: garage.secret_key.clone(),
            bucket: garage.bucket.clone(),
        };
        let runtime = runtime();
        let client = client_for(&target);
        Some(Self {
            target,
            faults: Arc::default(),
            runtime,
            client,
            _data: None,
        })
    }

    /// The shared moto server of this test process, with a bucket that keeps versions, or
    /// `None` where moto is not installed and not required.
    pub fn moto() -> Option<Self> {
        let moto = moto::shared()?;
        let target = S3Target {
            endpoint: moto.endpoint.clone(),
            region: "us-east-1".into(),
            access_key: "AKIATESTMOTO00000001".into(),
            secret_key: "test-secret-key-for-moto".into(),
            bucket: VERSIONED_BUCKET.into(),
        };
        Some(Self::shared_bucket(target, true))
    }

    /// The shared MinIO of this test process, with a bucket that keeps versions, or `None`
    /// where MinIO is not installed and not required.
    pub fn minio() -> Option<Self> {
        let target = Self::minio_target(minio::shared()?, VERSIONED_BUCKET);
        Some(Self::shared_bucket(target, true))
    }

    /// The same MinIO with a bucket that keeps no versions.
    pub fn minio_plain() -> Option<Self> {
        let target = Self::minio_target(minio::shared()?, PLAIN_BUCKET);
        Some(Self::shared_bucket(target, false))
    }

    /// A MinIO of the test's own (see [`minio::own`]) with a bucket that keeps no versions,
    /// and the MinIO, which stops when dropped.
    pub fn minio_own(env: &[(&str, &str)]) -> Option<(Self, minio::Own)> {
        let minio = minio::own(env)?;
        let target = Self::minio_target(&minio, PLAIN_BUCKET);
        Some((Self::shared_bucket(target, false), minio))
    }

    fn minio_target(minio: &minio::Minio, bucket: &str) -> S3Target {
        S3Target {
            endpoint: minio.endpoint.clone(),
            region: "us-east-1".into(),
            access_key: minio.access_key.clone(),
            secret_key: minio.secret_key.clone(),
            bucket: bucket.into(),
        }
    }

    /// `target` on a server tests may share: its bucket is created if it is not there yet, and
    /// keeps versions if `versioned`.
    fn shared_bucket(target: S3Target, versioned: bool) -> Self {
        let runtime = runtime();
        let client = client_for(&target);
        runtime.block_on(async {
            let _ = client.create_bucket().bucket(&target.bucket).send().await;
            if versioned {
                client
                    .put_bucket_versioning()
                    .bucket(&target.bucket)
                    .versioning_configuration(
                        aws_sdk_s3::types::VersioningConfiguration::builder()
                            .status(aws_sdk_s3::types::BucketVersioningStatus::Enabled)
                            .build(),
                    )
                    .send()
                    .await
                    .expect("versioning enabled on the bucket");
            }
        });
        Self {
            target,
            faults: Arc::default(),
            runtime,
            client,
            _data: None,
        }
    }

    /// Uploads `files` (path relative to `prefix` → content).
    pub fn seed(&self, prefix: &str, files: &BTreeMap<String, Vec<u8>>) {
        self.seed_bucket(&self.target.bucket, prefix, files);
    }

    /// Uploads `data` at `key` as a multipart upload of `part_size` parts with CRC32 checksums
    /// (as `aws s3 cp` does above its threshold); returns the version id, if the bucket keeps
    /// versions.
    pub fn seed_multipart(&self, key: &str, data: &[u8], part_size: usize) -> Option<String> {
        let crc32 = aws_sdk_s3::types::ChecksumAlgorithm::Crc32;
        self.seed_multipart_with(key, data, part_size, crc32, None)
    }

    /// The same with the checksum `algorithm` and, if given, the checksum type (`FULL_OBJECT`:
    /// one checksum of the whole object, `COMPOSITE`: a checksum of the part checksums).
    pub fn seed_multipart_with(
        &self,
        key: &str,
        data: &[u8],
        part_size: usize,
        algorithm: aws_sdk_s3::types::ChecksumAlgorithm,
        checksum_type: Option<aws_sdk_s3::types::ChecksumType>,
    ) -> Option<String> {
        use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
        let bucket = &self.target.bucket;
        self.runtime.block_on(async {
            let upload = self
                .client
                .create_multipart_upload()
                .bucket(bucket)
                .key(key)
                .checksum_algorithm(algorithm.clone())
                .set_checksum_type(checksum_type.clone())
                .send()
                .await
                .unwrap();
            let id = upload.upload_id().unwrap();
            let mut parts = Vec::new();
            for (index, chunk) in data.chunks(part_size).enumerate() {
                let number = index as i32 + 1;
                let part = self
                    .client
                    .upload_part()
                    .bucket(bucket)
                    .key(key)
                    .upload_id(id)
                    .part_number(number)
                    .checksum_algorithm(algorithm.clone())
                    .body(chunk.to_vec().into())
                    .send()
                    .await
                    .unwrap();
                parts.push(
                    CompletedPart::builder()
                        .part_number(number)
                        .e_tag(part.e_tag().unwrap())
                        .set_checksum_crc32(part.checksum_crc32().map(str::to_string))
                        .set_checksum_crc32_c(part.checksum_crc32_c().map(str::to_string))
                        .set_checksum_crc64_nvme(part.checksum_crc64_nvme().map(str::to_string))
                        .build(),
                );
            }
            // moto answers with a root element the SDK does not parse (the upload is complete
            // all the same), so the version is read with a HEAD.
            let _ = self
                .client
                .complete_multipart_upload()
                .bucket(bucket)
                .key(key)
                .upload_id(id)
                .set_checksum_type(checksum_type)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(parts))
                        .build(),
                )
                .send()
                .await;
            let head = self.client.head_object().bucket(bucket).key(key);
            let head = head.send().await.unwrap();
            assert_eq!(
                head.content_length(),
                Some(data.len() as i64),
                "{key} uploaded"
            );
            head.version_id().map(str::to_string)
        })
    }

    /// Creates `bucket` and uploads `files` into it, as [`Server::seed`] does into the test
    /// bucket.
    pub fn seed_new_bucket(&self, bucket: &str, prefix: &str, files: &BTreeMap<String, Vec<u8>>) {
        let created = self
            .runtime
            .block_on(self.client.create_bucket().bucket(bucket).send());
        created.unwrap_or_else(|e| panic!("creating {bucket}: {e:?}"));
        self.seed_bucket(bucket, prefix, files);
    }

    fn seed_bucket(&self, bucket: &str, prefix: &str, files: &BTreeMap<String, Vec<u8>>) {
        self.runtime.block_on(async {
            for (path, data) in files {
                self.client
                    .put_object()
                    .bucket(bucket)
                    .key(format!("{prefix}{path}"))
                    .body(data.clone().into())
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("seeding {path}: {e:?}"));
            }
        });
    }

    /// Uploads `count` objects of `size` bytes, 32 at a time, at `PREFIXdNNNN/fNNNNN` (2,000
    /// directories at most); object `i` holds `content(i, size)`.
    pub fn seed_many(&self, prefix: &str, count: usize, size: usize) {
        use futures::StreamExt;
        self.runtime.block_on(async {
            futures::stream::iter(0..count)
                .map(|i| {
                    self.client
                        .put_object()
                        .bucket(&self.target.bucket)
                        .key(many_key(prefix, i))
                        .body(content(i as u64, size).into())
                        .send()
                })
                .buffer_unordered(32)
                .for_each(|put| async move {
                    put.unwrap();
                })
                .await;
        });
    }

    /// Uploads `files` under `prefix` without a checksum, so the server sends them without one.
    pub fn seed_without_checksum(&self, prefix: &str, files: &BTreeMap<String, Vec<u8>>) {
        let config = self
            .client
            .config()
            .to_builder()
            .request_checksum_calculation(
                aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
            )
            .build();
        let client = aws_sdk_s3::Client::from_conf(config);
        self.runtime.block_on(async {
            for (path, data) in files {
                client
                    .put_object()
                    .bucket(&self.target.bucket)
                    .key(format!("{prefix}{path}"))
                    .body(data.clone().into())
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("seeding {path}: {e:?}"));
            }
        });
    }

    /// Runs `hydrator ARGS...` with this server's endpoint and credentials in the environment.
    pub fn hydrator(&self, args: &[&std::ffi::OsStr]) -> Output {
        let mut command = hydrator_command(&self.target);
        command
            .env("AWS_ENDPOINT_URL", &self.target.endpoint)
            .args(args);
        command.output().expect("run hydrator")
    }

    /// `hydrator sync s3://BUCKET/PREFIX DEST` against this server, without progress output.
    pub fn sync_command(&self, prefix: &str, dest: &Path) -> Command {
        let mut command = hydrator_command(&self.target);
        command
            .arg("sync")
            .arg(format!("s3://{}/{prefix}", self.target.bucket))
            .arg(dest)
            .args([
                "--endpoint-url",
                &self.target.endpoint,
                "--progress",
                "none",
            ]);
        command
    }

    /// Runs `hydrator snapshot s3://BUCKET/PREFIX -o FILE`, which must succeed; the snapshot.
    pub fn snapshot(&self, prefix: &str, file: &Path) -> serde_json::Value {
        let url = format!("s3://{}/{prefix}", self.target.bucket);
        let made = self.hydrator(&[
            std::ffi::OsStr::new("snapshot"),
            std::ffi::OsStr::new(&url),
            std::ffi::OsStr::new("-o"),
            file.as_os_str(),
        ]);
        assert!(made.status.success(), "{made:?}");
        serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap()
    }

    /// Runs `hydrator sync s3://BUCKET/PREFIX DEST ARGS...` against this server.
    pub fn sync(&self, prefix: &str, dest: &Path, args: &[&str]) -> Run {
        let url = format!("s3://{}/{}", self.target.bucket, prefix);
        hydrator_sync(&self.target, &url, dest, args)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn client_for(target: &S3Target) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&target.endpoint)
        .region(Region::new(target.region.clone()))
        .credentials_provider(Credentials::new(
            &target.access_key,
            &target.secret_key,
            None,
            None,
            "test",
        ))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// The outcome of one run of the binary.
pub struct Run {
    pub output: Output,
    pub report: Option<serde_json::Value>,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    pub fn report(&self) -> &serde_json::Value {
        self.report.as_ref().expect("the run wrote a report")
    }

    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code(),
            code,
            "exit code; stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&self.output.stdout),
            self.stderr()
        );
        self
    }

    pub fn count(&self, section: &str, field: &str) -> u64 {
        self.report()[section][field].as_u64().unwrap()
    }

    /// Asserts the run fetched an object again from its start at least once, and DEST holds
    /// just `name` with `bytes`, as the report's BLAKE3 says.
    pub fn assert_restarted_into(&self, dest: &Path, name: &str, bytes: &[u8]) {
        let report = self.report();
        assert!(report["object_restarts"].as_u64().unwrap() >= 1, "{report}");
        assert_mirror(dest, &files(&[(name, bytes.to_vec())]));
        let hash = blake3::hash(bytes).to_hex();
        assert_eq!(report_hashes(report)[name], hash.as_str());
    }

    /// Asserts the run (after an interrupted one) completed DEST as `expected` and kept at
    /// least `kept` bytes of durable parts.
    pub fn assert_resumed(&self, dest: &Path, expected: &BTreeMap<String, Vec<u8>>, kept: u64) {
        self.assert_code(0);
        assert_mirror(dest, expected);
        let bytes = &self.report()["bytes"];
        let resumed = bytes["resumed"].as_u64().unwrap();
        assert!(resumed >= kept, "the durable parts are kept: {bytes}");
    }
}

/// Runs the real binary with credentials in the environment, as a pod would.
pub fn hydrator_sync(target: &S3Target, url: &str, dest: &Path, args: &[&str]) -> Run {
    let report = dest.with_extension("report.json");
    let _ = std::fs::remove_file(&report);
    let mut command = hydrator_command(target);
    command
        .arg("sync")
        .arg(url)
        .arg(dest)
        .arg("--endpoint-url")
        .arg(&target.endpoint)
        .arg("--report")
        .arg(&report)
        .args(["--progress", "none"])
        .args(args);
    let output = command.output().expect("run hydrator");
    let report = std::fs::read(&report)
        .ok()
        .map(|bytes| serde_json::from_slice(&bytes).expect("the report is JSON"));
    Run { output, report }
}

/// `hydrator` with a clean AWS environment pointing at `target`.
pub fn hydrator_command(target: &S3Target) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hydrator"));
    for (key, _) in std::env::vars() {
        if key.starts_with("AWS_") || key.starts_with("HYDRATOR_") {
            command.env_remove(key);
        }
    }
    command
        .env("AWS_ACCESS_KEY_ID", &target.access_key)
        .env("AWS_SECRET_ACCESS_KEY", &target.secret_key)
        .env("AWS_REGION", &target.region)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null");
    command
}

pub const MIB: usize = 1 << 20;

/// The key of object `i` of [`Server::seed_many`].
pub fn many_key(prefix: &str, i: usize) -> String {
    format!("{prefix}d{:04}/f{i:05}", i % 2000)
}

/// A dataset from `(path, content)` pairs.
pub fn files(entries: &[(&str, Vec<u8>)]) -> BTreeMap<String, Vec<u8>> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Deterministic pseudo-random content.
pub fn content(seed: u64, len: usize) -> Vec<u8> {
    hydrator::demo::dataset::content(seed, len as u64)
}

/// Every regular file under `dir` (relative path → bytes) but hydrator's own `.hydrator/`;
/// symlinks and other non-files are listed with a marker content.
pub fn read_tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if rel == ".hydrator" {
                continue;
            }
            if kind.is_dir() {
                walk(root, &path, out);
            } else if kind.is_file() {
                out.insert(rel, std::fs::read(&path).unwrap());
            } else {
                out.insert(rel, b"<not a regular file>".to_vec());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Asserts DEST holds exactly `expected`, byte for byte, and no in-flight leftovers.
pub fn assert_mirror(dest: &Path, expected: &BTreeMap<String, Vec<u8>>) {
    let actual = read_tree(dest);
    let names = |m: &BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&actual),
        names(expected),
        "files in {}",
        dest.display()
    );
    for (path, data) in expected {
        assert!(actual[path] == *data, "{path} differs from the source");
    }
}

/// The BLAKE3 recorded in the report for each path.
pub fn report_hashes(report: &serde_json::Value) -> BTreeMap<String, String> {
    report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["blake3"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Polls `done` every 20 ms; fails the test naming `what` if it is not true within `limit`.
pub fn wait_until(what: &str, limit: std::time::Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether DEST holds READY, the marker of a complete, verified dataset.
pub fn has_ready(dest: &Path) -> bool {
    dest.join(".hydrator/READY").exists()
}

pub fn temp_dest() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("dest");
    (dir, dest)
}

/// Flips one byte of the file at `path`, keeping its size, inode and mtime: only hashing finds it.
pub fn corrupt_keeping_mtime(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 1;
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    let mut file = std::fs::File::options().write(true).open(path).unwrap();
    std::io::Write::write_all(&mut file, &bytes).unwrap();
    file.set_modified(mtime).unwrap();
}

/// Whether the manifest journal at `journal` records durable parts.
pub fn records_durable_parts(journal: &Path) -> bool {
    let needle = b"\"type\":\"parts\"";
    std::fs::read(journal).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
}

/// Kills `child`, a sync into `dest`, with SIGKILL once its journal records durable parts.
pub fn kill_once_parts_are_durable(child: &mut std::process::Child, dest: &Path) {
    let journal = dest.join(".hydrator/manifest.journal");
    wait_until(
        "durable parts recorded",
        std::time::Duration::from_secs(30),
        || records_durable_parts(&journal),
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The mount lines of `path` in this mount namespace, bottom to top.
fn mount_lines(path: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let wanted = path.to_string_lossy();
    table
        .lines()
        .filter(|line| line.split(' ').nth(4) == Some(&*wanted))
        .map(str::to_string)
        .collect()
}

/// How many mounts of any kind sit on `path` (a hydrated view has the cache bound over it).
pub fn mounts_on(path: &Path) -> usize {
    mount_lines(path).len()
}

/// The filesystem type of the topmost mount on `path`, if any (`fuse` for a lazy view).
pub fn top_fs_type(path: &Path) -> Option<String> {
    let top = mount_lines(path).pop()?;
    let after = top.split(" - ").nth(1)?;
    after.split(' ').next().map(str::to_string)
}
