//! No room, said at once: a selection that cannot fit is refused before its first GET, a
//! listing that outgrows the disk stops as soon as its known remainder cannot fit, and a write
//! that meets a full disk stops the run (exit 4) and gives back the room the run reserved and
//! never wrote. Each time the next run, once there is room, completes from what was kept.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::support::disk::TestMount;
use crate::support::faults::{Fault, Rule};
use crate::support::{
    assert_mirror, content, files, has_ready, records_durable_parts, wait_until, Run, Server, MIB,
};

/// Free bytes of the filesystem holding `path`.
fn free_bytes(path: &Path) -> u64 {
    let st = rustix::fs::statvfs(path).unwrap();
    st.f_bavail * st.f_frsize
}

/// Fills the filesystem holding `dir` with one file until a write fails, then gives `spare`
/// bytes back: its path.
fn fill_up(dir: &Path, spare: u64) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    while file.write_all(&chunk).is_ok() {}
    let small = [0u8; 4096];
    while file.write_all(&small).is_ok() {}
    let len = file.metadata().unwrap().len();
    file.set_len(len.saturating_sub(spare)).unwrap();
    let _ = file.sync_all();
    path
}

/// Bytes allocated on disk to the file at `path`.
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

fn finished(output: Output) -> Run {
    Run {
        output,
        report: None,
    }
}

#[test]
fn a_selection_that_cannot_fit_is_refused_before_its_first_get() {
    let Some(fs) = TestMount::tmpfs("size=6m") else {
        return;
    };
    let server = Server::local();
    let expected = files(&[
        ("a.bin", content(81, 3 * MIB)),
        ("b.bin", content(82, 3 * MIB)),
        ("c.bin", content(83, 3 * MIB)),
    ]);
    server.seed("full/", &expected);
    let dest = fs.path.join("dest");
    let run = server.sync("full/", &dest, &[]);
    run.assert_code(4);
    let stderr = run.stderr();
    let line = format!(
        "no room: needs 9.0 MiB, 6.0 MiB free on {}",
        fs.path.display()
    );
    assert!(stderr.contains(&line), "{line} in:\n{stderr}");
    assert_eq!(
        server.faults.object_gets.load(Relaxed),
        0,
        "nothing fetched"
    );
    assert!(!has_ready(&dest));

    fs.remount("size=32m");
    server.sync("full/", &dest, &[]).assert_code(0);
    assert_mirror(&dest, &expected);
}

#[test]
fn a_rerun_that_needs_nothing_more_is_not_refused_on_a_nearly_full_disk() {
    let Some(fs) = TestMount::tmpfs("size=8m") else {
        return;
    };
    let server = Server::local();
    let expected = files(&[
        ("a.bin", content(84, 3 * MIB)),
        ("b.bin", content(85, 2 * MIB)),
    ]);
    server.seed("again/", &expected);
    let dest = fs.path.join("dest");
    server.sync("again/", &dest, &[]).assert_code(0);
    let filler = fill_up(&fs.path, 256 << 10);
    let rerun = server.sync("again/", &dest, &[]);
    rerun.assert_code(0);
    assert_eq!(rerun.count("objects", "skipped"), 2);
    std::fs::remove_file(filler).unwrap();
}

#[test]
fn a_listing_that_outgrows_the_disk_stops_once_its_remainder_cannot_fit() {
    let Some(fs) = TestMount::tmpfs("size=6m") else {
        return;
    };
    let server = Server::local();
    // 2,500 × 4 KiB (9.8 MiB) in listing pages of 1,000: the first page fits, the listing as a
    // whole does not.
    let expected: BTreeMap<String, Vec<u8>> = (0..2500)
        .map(|i| (format!("f{i:05}"), content(1000 + i, 4096)))
        .collect();
    server.seed("pages/", &expected);
    let dest = fs.path.join("dest");
    let run = server.sync("pages/", &dest, &[]);
    run.assert_code(4);
    assert!(run.stderr().contains("no room: needs "), "{}", run.stderr());
    let fetched = server.faults.object_gets.load(Relaxed);
    assert!(fetched < 2000, "stopped early: {fetched} GETs");
    assert!(!has_ready(&dest));
    fs.remount("size=32m");
    server.sync("pages/", &dest, &[]).assert_code(0);
    assert_mirror(&dest, &expected);
}

#[test]
fn a_write_into_a_full_disk_stops_the_run_and_gives_back_the_room_it_reserved() {
    let Some(fs) = TestMount::tmpfs("size=28m") else {
        return;
    };
    let server = Server::local();
    // a.bin is preallocated whole (16 MiB) when its download starts; two of its parts arrive,
    // the rest stall. The small files stall too, until the disk has been filled from outside.
    let mut expected = files(&[("a.bin", content(86, 16 * MIB))]);
    for i in 0..32 {
        expected.insert(format!("b/{i:02}"), content(900 + i, 128 << 10));
    }
    server.seed("fill/", &expected);
    server.faults.add(
        Rule::get("a.bin", Fault::StallBody(0, Duration::from_secs(60)))
            .skip(2)
            .times(usize::MAX),
    );
    server.faults.add(
        Rule {
            ranged_only: false,
            ..Rule::get("fill/b/", Fault::StallBody(0, Duration::from_secs(2)))
        }
        .times(usize::MAX),
    );
    let dest = fs.path.join("dest");
    let child = server
        .sync_command("fill/", &dest)
        .args(["--part-size", "1MiB"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let partial = dest.join(".a.bin.partial");
    let journal = dest.join(".hydrator/manifest.journal");
    // On a loaded machine the two parts may arrive after the preallocation: the disk fills
    // only once they are recorded durable, as the test means.
    wait_until(
        "a.bin is preallocated and two parts are durable",
        Duration::from_secs(30),
        || {
            partial.exists()
                && allocated(&partial) >= 16 * MIB as u64
                && records_durable_parts(&journal)
        },
    );
    let filler = fill_up(&fs.path, 0);
    let run = finished(child.wait_with_output().unwrap());
    run.assert_code(4);
    let stderr = run.stderr();
    assert!(
        stderr.contains(&format!("no room on {}", fs.path.display())),
        "{stderr}"
    );
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(!has_ready(&dest));
    // The two parts written are kept for the next run; the 14 MiB never written are given back.
    let kept = allocated(&partial);
    assert!(kept <= 3 * MIB as u64, "{kept} bytes still allocated");
    assert!(free_bytes(&fs.path) >= 12 * MIB as u64, "the room is back");

    std::fs::remove_file(filler).unwrap();
    server.faults.clear();
    let rerun = server.sync("fill/", &dest, &["--part-size", "1MiB"]);
    rerun.assert_code(0);
    assert!(
        rerun.count("bytes", "resumed") >= MIB as u64,
        "{}",
        rerun.report()
    );
    assert_mirror(&dest, &expected);
}

#[test]
fn a_disk_without_preallocation_that_fills_mid_write_stops_the_run() {
    // ext2 has no fallocate: space is only taken as the data is written, so the disk fills up
    // in the middle of a file rather than when it is created.
    let Some(fs) = TestMount::ext2_image("8M") else {
        return;
    };
    let server = Server::local();
    let expected = files(&[
        ("one.bin", content(12, 3 * MIB)),
        ("two.bin", content(13, 3 * MIB)),
    ]);
    server.seed("midwrite/", &expected);
    server
        .faults
        .add(Rule::get("midwrite/", Fault::StallBody(0, Duration::from_secs(2))).times(usize::MAX));
    let dest = fs.path.join("dest");
    let child = server
        .sync_command("midwrite/", &dest)
        .args(["--concurrency", "1", "--part-size", "1MiB"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let partial = dest.join(".one.bin.partial");
    wait_until("one.bin is started", Duration::from_secs(20), || {
        partial.exists()
    });
    let filler = fill_up(&fs.path, 0);
    let run = finished(child.wait_with_output().unwrap());
    run.assert_code(4);
    assert!(
        run.stderr()
            .contains("write failed: the destination's filesystem is full ("),
        "{}",
        run.stderr()
    );
    assert_whole_or_absent(&dest, &expected);
    std::fs::remove_file(&filler).unwrap();
    server.faults.clear();
    server.sync("midwrite/", &dest, &[]).assert_code(0);
    assert_mirror(&dest, &expected);
}

#[test]
fn small_files_that_meet_a_full_disk_stop_the_run_and_leave_no_partial_file() {
    // Files under a buffer are written in one call without preallocation, so a full disk shows
    // up in the write.
    let Some(fs) = TestMount::tmpfs("size=8m") else {
        return;
    };
    let server = Server::local();
    let expected: BTreeMap<String, Vec<u8>> = (0..5)
        .map(|i| (format!("s{i}.bin"), content(300 + i, 600 << 10)))
        .collect();
    server.seed("smallfull/", &expected);
    server.faults.add(
        Rule {
            ranged_only: false,
            ..Rule::get("smallfull/", Fault::StallBody(0, Duration::from_secs(2)))
        }
        .times(usize::MAX),
    );
    let dest = fs.path.join("dest");
    let child = server
        .sync_command("smallfull/", &dest)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the first GET", Duration::from_secs(20), || {
        server.faults.object_gets.load(Relaxed) > 0
    });
    let filler = fill_up(&fs.path, 0);
    let run = finished(child.wait_with_output().unwrap());
    run.assert_code(4);
    assert!(run.stderr().contains("no room on "), "{}", run.stderr());
    assert_whole_or_absent(&dest, &expected);
    let left: Vec<_> = std::fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        !left.iter().any(|name| name.ends_with(".partial")),
        "{left:?}"
    );
    std::fs::remove_file(&filler).unwrap();
    server.faults.clear();
    server.sync("smallfull/", &dest, &[]).assert_code(0);
    assert_mirror(&dest, &expected);
}

#[test]
fn running_out_of_inodes_stops_the_run_and_it_resumes_once_there_are_more() {
    let Some(fs) = TestMount::tmpfs("size=16m,nr_inodes=16") else {
        return;
    };
    let server = Server::local();
    let expected: BTreeMap<String, Vec<u8>> = (0..30)
        .map(|i| (format!("f{i:02}"), content(200 + i, 1000)))
        .collect();
    server.seed("inodes/", &expected);
    let dest = fs.path.join("dest");
    let run = server.sync("inodes/", &dest, &[]);
    run.assert_code(4);
    assert!(
        run.stderr().contains("No space left on device"),
        "{}",
        run.stderr()
    );
    assert!(!has_ready(&dest));
    fs.remount("nr_inodes=1000");
    server.sync("inodes/", &dest, &[]).assert_code(0);
    assert_mirror(&dest, &expected);
}

/// Each file under its final name is whole; the rest are absent.
fn assert_whole_or_absent(dest: &Path, expected: &BTreeMap<String, Vec<u8>>) {
    assert!(!has_ready(dest));
    for (name, data) in expected {
        if let Ok(on_disk) = std::fs::read(dest.join(name)) {
            assert!(on_disk == *data, "{name} is whole or absent");
        }
    }
}
