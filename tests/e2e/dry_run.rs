//! `--dry-run` writes nothing at all (DEST, its `.hydrator/`, the lock: byte for byte, inode
//! for inode) and predicts exactly what the real run then does: downloads, resumed bytes,
//! files up to date, deletions.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::support::faults::{Fault, Rule};
use crate::support::{
    assert_mirror, content, corrupt_keeping_mtime, files, kill_once_parts_are_durable, temp_dest,
    Server, MIB,
};

/// Every entry under `dir`, directories and `.hydrator/` included, with what a write would
/// change: kind, size, mtime, inode and the bytes' hash.
fn tree_state(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let bytes = match meta.is_file() {
                true => blake3::hash(&std::fs::read(&path).unwrap())
                    .to_hex()
                    .to_string(),
                false => String::new(),
            };
            let state = format!(
                "{:?} {} {} {} {bytes}",
                meta.file_type(),
                meta.len(),
                meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
                meta.ino()
            );
            out.insert(rel, state);
            if meta.is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Runs `hydrator ARGS... --report REPORT` against `server`; the output and the report.
fn run_with_report(server: &Server, args: &[&OsStr], report: &Path) -> (Output, serde_json::Value) {
    let _ = std::fs::remove_file(report);
    let mut args = args.to_vec();
    args.extend([OsStr::new("--report"), report.as_os_str()]);
    args.extend([OsStr::new("--progress"), OsStr::new("none")]);
    let output = server.hydrator(&args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(0), "{text}");
    let report = std::fs::read(report).unwrap_or_else(|e| panic!("no report ({e}): {text}"));
    (output, serde_json::from_slice(&report).unwrap())
}

fn dry_sync(
    server: &Server,
    prefix: &str,
    dest: &Path,
    report: &Path,
    args: &[&str],
) -> (String, serde_json::Value) {
    let url = format!("s3://{}/{prefix}", server.target.bucket);
    let mut all = vec![
        OsStr::new("sync"),
        OsStr::new(&url),
        dest.as_os_str(),
        OsStr::new("--dry-run"),
    ];
    all.extend(args.iter().map(OsStr::new));
    let (output, report) = run_with_report(server, &all, report);
    assert_eq!(report["dry_run"], true);
    (String::from_utf8_lossy(&output.stdout).into_owned(), report)
}

/// `hydrator verify DEST --repair ARGS...` with a report.
fn verify_repair(
    server: &Server,
    dest: &Path,
    args: &[&str],
    report: &Path,
) -> (Output, serde_json::Value) {
    let mut all = vec![
        OsStr::new("verify"),
        dest.as_os_str(),
        OsStr::new("--repair"),
    ];
    all.extend(args.iter().map(OsStr::new));
    run_with_report(server, &all, report)
}

/// The dry run's counts are the real run's.
fn assert_predicted(dry: &serde_json::Value, real: &serde_json::Value) {
    assert_eq!(
        dry["objects"], real["objects"],
        "objects: dry run, then the run"
    );
    for field in ["total", "downloaded", "skipped", "resumed"] {
        assert_eq!(
            dry["bytes"][field], real["bytes"][field],
            "bytes.{field}: dry run {}, run {}",
            dry["bytes"], real["bytes"]
        );
    }
    assert_eq!(dry["result"], real["result"]);
}

#[test]
fn a_dry_run_writes_nothing_and_predicts_exactly_what_the_run_then_does() {
    let server = Server::local();
    let prefix = "dry/";
    let mut expected = files(&[
        ("big.bin", content(120, 24 * MIB)),
        ("a.txt", content(121, 1000)),
        ("dir/b.txt", content(122, 2000)),
        ("dir/c.txt", content(123, 3000)),
    ]);
    server.seed(prefix, &expected);
    let (tmp, dest) = temp_dest();
    let report = tmp.path().join("dry.json");

    // Nothing there yet: everything would be downloaded, and DEST is not even created.
    let (said, dry) = dry_sync(&server, prefix, &dest, &report, &[]);
    assert!(!dest.exists(), "a dry run creates no DEST");
    assert!(said.contains("would download s3://"), "{said}");
    let real = server.sync(prefix, &dest, &[]);
    real.assert_code(0);
    assert_predicted(&dry, real.report());
    assert_eq!(dry["objects"]["downloaded"], 4);

    // A new version of big.bin, interrupted with one part durable (the others stall).
    expected.insert("big.bin".into(), content(124, 24 * MIB));
    server.seed(prefix, &files(&[("big.bin", expected["big.bin"].clone())]));
    server
        .faults
        .add(Rule::get("big.bin", Fault::StallBody(MIB, Duration::from_secs(60))).skip(1));
    let mut killed = server
        .sync_command(prefix, &dest)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    kill_once_parts_are_durable(&mut killed, &dest);
    server.faults.clear();
    // Local changes: a file removed, one touched, a stray one.
    std::fs::remove_file(dest.join("a.txt")).unwrap();
    std::fs::File::options()
        .write(true)
        .open(dest.join("dir/b.txt"))
        .unwrap()
        .set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))
        .unwrap();
    std::fs::write(dest.join("stray.txt"), b"not in the source").unwrap();

    let before = tree_state(&dest);
    let (said, dry) = dry_sync(&server, prefix, &dest, &report, &["--delete"]);
    assert_eq!(tree_state(&dest), before, "the dry run changed DEST");
    assert!(said.contains("would resume s3://"), "{said}");
    assert!(
        said.contains("stray.txt") && said.contains("would delete"),
        "{said}"
    );
    assert!(
        dry["bytes"]["resumed"].as_u64().unwrap() >= 8 * MIB as u64,
        "{}",
        dry["bytes"]
    );
    assert_eq!(dry["objects"]["downloaded"], 3, "big.bin, a.txt, dir/b.txt");
    assert_eq!(dry["objects"]["skipped"], 1);
    assert_eq!(dry["objects"]["deleted"], 1);
    let real = server.sync(prefix, &dest, &["--delete"]);
    real.assert_code(0);
    assert_predicted(&dry, real.report());
    assert_mirror(&dest, &expected);

    // Now whole: nothing would be done.
    let (_, dry) = dry_sync(&server, prefix, &dest, &report, &["--delete"]);
    assert_eq!(dry["objects"]["skipped"], 4);
    let real = server.sync(prefix, &dest, &["--delete"]);
    assert_predicted(&dry, real.report());
}

#[test]
fn verify_repair_dry_run_names_what_the_repair_then_fetches_and_writes_nothing() {
    let server = Server::local();
    let prefix = "dry-verify/";
    let expected = files(&[
        ("a.bin", content(130, 3 * MIB + 1)),
        ("b.txt", content(131, 100)),
        ("c", content(132, 10)),
    ]);
    server.seed(prefix, &expected);
    let (tmp, dest) = temp_dest();
    server.sync(prefix, &dest, &[]).assert_code(0);
    // A flipped byte under an unchanged size and mtime (only hashing finds it), a missing file.
    corrupt_keeping_mtime(&dest.join("a.bin"), MIB);
    std::fs::remove_file(dest.join("c")).unwrap();

    let before = tree_state(&dest);
    let verify = |extra: &[&str], report: &str| {
        verify_repair(&server, &dest, extra, &tmp.path().join(report))
    };
    let (output, dry) = verify(&["--dry-run"], "dry.json");
    let said = String::from_utf8_lossy(&output.stdout);
    assert_eq!(tree_state(&dest), before, "the dry run changed DEST");
    assert!(
        said.contains("would download") && said.contains("a.bin"),
        "{said}"
    );
    assert_eq!(dry["objects"]["downloaded"], 2, "{}", dry["objects"]);
    let (_, real) = verify(&[], "real.json");
    assert_predicted(&dry, &real);
    assert_mirror(&dest, &expected);
}

#[test]
fn a_dry_run_predicts_the_objects_a_directory_in_the_way_would_fail() {
    let server = Server::local();
    let prefix = "dry-in-the-way/";
    server.seed(
        prefix,
        &files(&[("a.txt", content(140, 10)), ("b.txt", content(141, 20))]),
    );
    let (tmp, dest) = temp_dest();
    std::fs::create_dir_all(dest.join("b.txt/inside")).unwrap();
    let (_, dry) = dry_sync(&server, prefix, &dest, &tmp.path().join("dry.json"), &[]);
    assert_eq!(dry["objects"]["failed"], 1, "{}", dry["objects"]);
    assert_eq!(dry["result"], "failed");
    let real = server.sync(prefix, &dest, &[]);
    real.assert_code(1);
    assert_predicted(&dry, real.report());
}

#[test]
fn verify_repair_dry_run_of_a_snapshot_dest_does_not_take_the_ready_shortcut() {
    let server = Server::local();
    let prefix = "dry-snapshot/";
    let expected = files(&[
        ("a.bin", content(150, 2 * MIB)),
        ("b.txt", content(151, 10)),
    ]);
    server.seed(prefix, &expected);
    let (tmp, dest) = temp_dest();
    let lock = tmp.path().join("dataset.lock");
    server.snapshot(prefix, &lock);
    let synced = server.hydrator(&[
        OsStr::new("sync"),
        OsStr::new("--snapshot"),
        lock.as_os_str(),
        dest.as_os_str(),
    ]);
    assert!(synced.status.success(), "{synced:?}");
    corrupt_keeping_mtime(&dest.join("a.bin"), 7);

    let lock = lock.to_str().unwrap();
    let verify = |extra: &[&str], report: &str| {
        let args = [&["--snapshot", lock], extra].concat();
        verify_repair(&server, &dest, &args, &tmp.path().join(report))
    };
    let (_, dry) = verify(&["--dry-run"], "dry.json");
    assert_eq!(dry["objects"]["downloaded"], 1, "{}", dry["objects"]);
    let (_, real) = verify(&[], "real.json");
    assert_predicted(&dry, &real);
    assert_mirror(&dest, &expected);
}
