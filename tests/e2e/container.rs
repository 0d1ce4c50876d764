//! The container image, run the way Kubernetes runs an init container: read-only root
//! filesystem, user 65532, every capability dropped, no privilege escalation, a writable volume
//! for DEST, against Garage on loopback. Under Podman's default seccomp profile io_uring is
//! refused and the run must complete on pwrite and say so; unconfined, and under the profile
//! that `k8s/components/io-uring-seccomp` ships, it must write with io_uring.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use crate::support::{assert_mirror, content, files, Server, MIB};

const REQUIRE_ENV: &str = "HYDRATOR_REQUIRE_PODMAN";
const IMAGE: &str = "localhost/hydrator:e2e";
/// The image is the static binary and the CA bundle, nothing else: 28.0 MiB, of which the
/// Kubernetes client of `hydrator admission` (kube, k8s-openapi) is 7.8 (20.2 before it). A new
/// dependency that doubles it fails here.
const MAX_IMAGE_BYTES: u64 = 30 << 20;

fn podman() -> Command {
    let mut command = Command::new("podman");
    command.args(["--storage-driver", "vfs"]);
    command
}

/// The image, built once per test process by `container/build.sh`; `None` where Podman is
/// missing and not required.
/// `podman run --rm` with runc and limits this sandbox lets a container set.
fn podman_run() -> Command {
    let mut command = podman();
    command.args(["run", "--rm", "--runtime", "runc"]).args([
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
    ]);
    command
}

fn image() -> Option<&'static str> {
    static BUILT: OnceLock<bool> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        if Command::new("podman").arg("--version").output().is_err() {
            assert!(
                std::env::var(REQUIRE_ENV).is_err(),
                "{REQUIRE_ENV} is set but podman is not installed (tests/install-podman.sh)"
            );
            eprintln!("podman not installed: skipping the container test");
            return false;
        }
        let output = Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("container/build.sh"))
            .arg(IMAGE)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "container/build.sh failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let size: u64 = stdout
            .split(": ")
            .nth(2)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no size in {stdout:?}"));
        eprintln!("{}", stdout.trim());
        assert!(size < MAX_IMAGE_BYTES, "image of {size} bytes");
        true
    });
    built.then_some(IMAGE)
}

#[test]
fn image_mirrors_from_garage_as_an_init_container_runs_on_both_write_paths() {
    let Some(server) = Server::garage() else {
        return;
    };
    let Some(image) = image() else {
        return;
    };
    let expected = files(&[
        ("train/shard-0.bin", content(61, 20 * MIB + 5)),
        ("train/labels.txt", content(62, 1000)),
        ("readme.md", content(63, 10)),
    ]);
    server.seed("container/", &expected);
    // By name, as a cluster would: the image must resolve hosts without a libc on disk.
    let endpoint = server.target.endpoint.replace("127.0.0.1", "localhost");
    let profile = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("k8s/components/io-uring-seccomp/hydrator-io-uring.json");
    let cases = [
        (None, "pwrite"),
        (Some("unconfined".to_string()), "io_uring"),
        (Some(profile.display().to_string()), "io_uring"),
    ];
    for (seccomp, backend) in cases {
        let volume = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(volume.path(), Some(65532), Some(65532)).unwrap();
        let mut command = podman_run();
        command
            .args(["--network", "host"])
            .args(["--read-only", "--user", "65532:65532", "--cap-drop", "ALL"])
            .args(["--security-opt", "no-new-privileges"]);
        if let Some(seccomp) = &seccomp {
            command.args(["--security-opt", &format!("seccomp={seccomp}")]);
        }
        let output = command
            .arg("--volume")
            .arg(format!("{}:/data", volume.path().display()))
            .args([
                "--env",
                &format!("AWS_ACCESS_KEY_ID={}", server.target.access_key),
            ])
            .args([
                "--env",
                &format!("AWS_SECRET_ACCESS_KEY={}", server.target.secret_key),
            ])
            .args(["--env", &format!("AWS_REGION={}", server.target.region)])
            .args(["--env", "AWS_EC2_METADATA_DISABLED=true"])
            .arg(image)
            .arg("sync")
            .arg(format!("s3://{}/container/", server.target.bucket))
            .args(["/data/mirror", "--endpoint-url", &endpoint])
            .args(["--report", "/data/report.json", "--progress", "log"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "seccomp {seccomp:?}: {stderr}\n{}",
            String::from_utf8_lossy(&output.stdout)
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(volume.path().join("report.json")).unwrap())
                .unwrap();
        assert_eq!(
            report["io_backend"], backend,
            "seccomp {seccomp:?}: {stderr}"
        );
        let fallback = report["io_backend_fallback_reason"].as_str();
        assert_eq!(fallback.is_some(), backend == "pwrite", "{report}");
        assert!(
            stderr.contains(&format!("writing with {backend}")),
            "{stderr}"
        );
        let mirror = volume.path().join("mirror");
        assert_mirror(&mirror, &expected);
        let owner = std::os::unix::fs::MetadataExt::uid(
            &std::fs::metadata(mirror.join("readme.md")).unwrap(),
        );
        assert_eq!(owner, 65532, "written as the image's user");
    }
    // The same image runs the node cache: the daemon, the CSI plugin and the lease sidecar.
    for (command, flag) in [
        ("daemon", "--config"),
        ("csi", "--node-id"),
        ("lease", "--holder"),
    ] {
        let output = podman_run()
            .args(["--network", "none", "--read-only", "--user", "65532:65532"])
            .args([
                "--cap-drop",
                "ALL",
                "--security-opt",
                "no-new-privileges",
                image,
            ])
            .args([command, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && help.contains(flag),
            "{command}: {help}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
