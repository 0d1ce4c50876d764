//! The CSI conformance suite, `csi-sanity` (kubernetes-csi/csi-test), against the real
//! `hydrator csi` beside the real daemon. Built by tests/install-csi-sanity.sh; without it the
//! test prints a SKIP line, unless `HYDRATOR_REQUIRE_CSI_SANITY=1`. The cases skipped and why
//! are in docs/csi.md ("Conformance: csi-sanity"); the last line gives the counts:
//!   csi-sanity: Ran N of M Specs: P Passed | F Failed | 0 Pending | S Skipped

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::csi::{volume, Csi};
use crate::support::daemon::{catalog, dataset, Daemon, DatasetSpec};
use crate::support::{content, files, Server};

const BIN_ENV: &str = "HYDRATOR_CSI_SANITY_BIN";
const REQUIRE_ENV: &str = "HYDRATOR_REQUIRE_CSI_SANITY";

/// The cases left out, each a regular expression over the case's full name:
/// - every `[Controller Server]` case: the plugin has no Controller service (it serves inline
///   ephemeral volumes, which the kubelet publishes without one), and these cases call it
///   whatever the plugin announces;
/// - the two Node cases that first provision a volume with the Controller's CreateVolume: there
///   is none to call. tests/e2e/csi.rs covers what they check (the target removed by unpublish,
///   NOT_FOUND for stats at a path where the volume is not).
const SKIPPED: &[&str] = &[
    r"\[Controller Server\]",
    r"NodeUnpublishVolume should remove target path",
    r"NodeGetVolumeStats should fail when volume does not exist on the specified path",
];

fn find_binary() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os(BIN_ENV) {
        return Some(PathBuf::from(bin));
    }
    let home = std::env::var_os("HOME")?;
    let bin = PathBuf::from(home).join(".cache/hydrator-tests/csi-sanity/bin/csi-sanity");
    bin.is_file().then_some(bin)
}

/// The daemon in `dir` with one small dataset `name`, and the plugin beside it.
fn plugin_with_dataset(server: &Server, dir: &Path, name: &str) -> (Daemon, Csi) {
    server.seed(&format!("{name}/"), &files(&[("a.bin", content(41, 1000))]));
    let spec = DatasetSpec {
        refresh_seconds: 3600,
        ..dataset(name, name)
    };
    let text = catalog(dir, &server.target, "1GiB", "", &[spec])
        .replace("[listen]\n", "[listen]\nadmins = [\"uid:0\"]\n");
    let daemon = Daemon::start(dir, &server.target, &text);
    let csi = Csi::start(dir, &daemon);
    (daemon, csi)
}

#[test]
fn csi_sanity_passes_every_node_and_identity_case_that_applies() {
    let Some(bin) = find_binary() else {
        assert!(
            !std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1"),
            "{REQUIRE_ENV}=1 but csi-sanity is not installed (bash tests/install-csi-sanity.sh)"
        );
        eprintln!("SKIP csi-sanity: not installed (bash tests/install-csi-sanity.sh, 1 min)");
        return;
    };
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, csi) = plugin_with_dataset(&server, dir.path(), "sanity");

    // The volume attributes a pod gives (csi-sanity passes them to CreateVolume only).
    let parameters = dir.path().join("volume-parameters.yaml");
    std::fs::write(&parameters, "dataset: sanity\n").unwrap();
    // Targets under the plugin's pods directory, where the kubelet puts them; csi-sanity makes
    // the last directory of each path only.
    let volumes = dir.path().join("pods/sanity-pod/volumes/kubernetes.io~csi");
    std::fs::create_dir_all(&volumes).unwrap();
    let mount_dir = volumes.join("sanity");
    let mut command = Command::new(&bin);
    command
        .arg(format!("--csi.endpoint=unix://{}", csi.socket.display()))
        .arg(format!(
            "--csi.testvolumeparameters={}",
            parameters.display()
        ))
        .arg(format!("--csi.mountdir={}", mount_dir.display()))
        .arg(format!(
            "--csi.stagingdir={}",
            dir.path().join("staging").display()
        ))
        .arg("--ginkgo.no-color");
    for skipped in SKIPPED {
        command.arg(format!("--ginkgo.skip={skipped}"));
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let ran = stdout.lines().find(|l| l.starts_with("Ran ")).unwrap_or("");
    let counts = stdout
        .lines()
        .find(|l| l.contains(" Passed | "))
        .unwrap_or("");
    let counts = counts.rsplit("-- ").next().unwrap_or(counts);
    assert!(
        output.status.success(),
        "csi-sanity failed:\n{stdout}\n{}\nplugin log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        csi.log()
    );
    eprintln!("csi-sanity: {ran}: {counts}");
}

/// What csi-sanity found: NodeGetVolumeStats without a volume id or a path answered
/// `NOT_FOUND`; the spec asks for `INVALID_ARGUMENT`. Also what the two Node cases left out
/// check, on a volume published as the kubelet publishes it: stats at a path where the volume
/// is not answer `NOT_FOUND`, and unpublish removes the target. Run whether or not csi-sanity is
/// installed.
#[test]
fn volume_stats_need_an_id_and_a_path_and_find_a_volume_only_where_it_is_published() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, csi) = plugin_with_dataset(&server, dir.path(), "stats");
    let target = dir.path().join("pods/uid/volumes/t/mount");
    for (id, path) in [("", target.as_path()), ("v1", Path::new(""))] {
        let refused = csi.volume_stats(id, path).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    }
    csi.publish_when_ready(&volume("v1", "uid", "stats", &target));
    csi.volume_stats("v1", &target).unwrap();
    let elsewhere = csi.volume_stats("v1", Path::new("some/path")).unwrap_err();
    assert_eq!(elsewhere.code(), tonic::Code::NotFound, "{elsewhere:?}");
    csi.unpublish("v1", &target).unwrap();
    assert!(!target.exists(), "the target is removed");
    let gone = csi.volume_stats("v1", &target).unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
}
