//! The manifest on a real directory: journal and base folded together, in and out of order,
//! across reopenings and a crash between the fold's two renames.

use std::collections::BTreeMap;

use super::listed::ListedKeys;
use super::*;

fn source(prefix: &str) -> SourceInfo {
    SourceInfo {
        endpoint: None,
        bucket: "bucket".into(),
        prefix: prefix.into(),
        include: Vec::new(),
        exclude: Vec::new(),
        snapshot: None,
    }
}

fn state(path: &str, etag: &str) -> ObjectState {
    ObjectState {
        path: path.into(),
        size: path.len() as u64,
        etag: etag.into(),
        last_modified_ns: None,
        part_size: 8,
        attempt: 1,
        parts: BTreeMap::new(),
        complete: None,
    }
}

fn done(n: u8) -> Completed {
    Completed {
        blake3: [n; 32],
        inode: n.into(),
        mtime_ns: n.into(),
    }
}

fn publish(manifest: &Manifest, key: &str, n: u8) {
    manifest.start_object(key, &state(key, "e")).unwrap();
    manifest.complete(key, "e", done(n)).unwrap();
}

fn open(dir: &tempfile::TempDir) -> Manifest {
    Manifest::open(Dir::open(dir.path()).unwrap(), &source("")).unwrap()
}

/// The base's objects in order.
fn base(manifest: &Manifest) -> Vec<(String, ObjectState)> {
    let mut objects = BaseReader::open(&manifest.dir).unwrap().expect("a base").1;
    std::iter::from_fn(|| objects.next_object().unwrap()).collect()
}

fn listed(dir: &tempfile::TempDir, keys: &[&str]) -> ListedKeys {
    let mut listed = ListedKeys::create(&Dir::open(dir.path()).unwrap()).unwrap();
    for key in keys {
        listed.push(key).unwrap();
    }
    listed
}

#[test]
fn fold_sorts_the_journal_into_the_base_and_digests_the_listed() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = open(&dir);
    // Completion order, not key order, and more records than one sorted run holds.
    let keys = ["m", "c", "x", "a", "q", "b", "z", "d", "k", "e"];
    for (n, key) in keys.iter().enumerate() {
        publish(&manifest, key, n as u8);
    }
    manifest.forget("q").unwrap();
    let folded = manifest
        .fold(Some(listed(&dir, &["a", "b", "c", "k", "m", "x"])), None)
        .unwrap();
    let objects = base(&manifest);
    let mut sorted: Vec<&str> = keys.iter().copied().filter(|k| *k != "q").collect();
    sorted.sort();
    assert_eq!(
        objects.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        sorted
    );
    let n = |key: &str| keys.iter().position(|k| *k == key).unwrap() as u8;
    for (key, object) in &objects {
        assert_eq!(object.complete, Some(done(n(key))), "{key}");
    }
    let mut digest = ready::DatasetDigest::default();
    for key in ["a", "b", "c", "k", "m", "x"] {
        digest.add(key, 1, &[n(key); 32]);
    }
    assert_eq!(
        (folded.digest, folded.objects, folded.bytes),
        (digest.finish(), 6, 6)
    );
    // The journal is empty again; a reopening finds the same base.
    drop(manifest);
    assert_eq!(base(&open(&dir)), objects);
}

#[test]
fn unlisted_objects_in_scope_are_dropped_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = open(&dir);
    for (n, key) in ["a", "b.log", "c"].iter().enumerate() {
        publish(&manifest, key, n as u8);
    }
    manifest.fold(Some(listed(&dir, &["a"])), None).unwrap();
    assert_eq!(base(&manifest).len(), 3, "kept without --delete");
    let in_scope = |path: &str| !path.ends_with(".log");
    let folded = manifest
        .fold(Some(listed(&dir, &["a"])), Some(&in_scope))
        .unwrap();
    let kept: Vec<String> = base(&manifest).into_iter().map(|(k, _)| k).collect();
    assert_eq!(kept, ["a", "b.log"]);
    assert_eq!(folded.objects, 1);
}

#[test]
fn a_killed_runs_journal_is_folded_when_opened_and_a_second_fold_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = open(&dir);
    publish(&manifest, "old", 1);
    manifest.fold(None, None).unwrap();
    // A run that is killed: a new version started, parts durable, another file published.
    let mut resumed = state("old", "e2");
    resumed.attempt = 7;
    manifest.start_object("old", &resumed).unwrap();
    let part = DurablePart {
        cv: [9; 32],
        crc: Some(3),
    };
    manifest.parts_durable("old", 7, &[(0, part)]).unwrap();
    manifest.parts_durable("old", 6, &[(1, part)]).unwrap(); // another attempt's: void
    publish(&manifest, "new", 2);
    manifest.sync().unwrap();
    let journal = std::fs::read(dir.path().join(JOURNAL)).unwrap();
    drop(manifest);

    let reopened = open(&dir);
    let objects = base(&reopened);
    let old = &objects.iter().find(|(k, _)| k == "old").unwrap().1;
    assert_eq!((old.etag.as_str(), old.complete), ("e2", None));
    assert_eq!(old.parts, BTreeMap::from([(0, part)]));
    assert_eq!(objects.len(), 2);
    // A crash after the new base but before the journal was emptied: folded again, same base.
    drop(reopened);
    std::fs::write(dir.path().join(JOURNAL), journal).unwrap();
    assert_eq!(base(&open(&dir)), objects);
}

/// Every file in `dir` with its bytes.
fn files(dir: &tempfile::TempDir) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn the_view_reads_a_killed_runs_journal_as_the_fold_would_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = open(&dir);
    publish(&manifest, "a", 1);
    publish(&manifest, "c", 3);
    manifest.fold(None, None).unwrap();
    publish(&manifest, "b", 2);
    manifest.start_object("c", &state("c", "e2")).unwrap();
    manifest.forget("a").unwrap();
    manifest.sync().unwrap();
    drop(manifest);
    let before = files(&dir);

    let view = view::ManifestView::open(Dir::open(dir.path()).unwrap(), Some(&source("")), false)
        .unwrap()
        .expect("a manifest");
    let mut objects = view.objects().unwrap();
    let seen: Vec<_> =
        std::iter::from_fn(|| base::ObjectStream::next_object(&mut objects).unwrap()).collect();
    let mut cursor = view.cursor().unwrap();
    assert_eq!(cursor.take("a").unwrap(), None);
    assert_eq!(cursor.take("c").unwrap().unwrap().etag, "e2");
    assert_eq!(files(&dir), before, "the view wrote nothing");
    assert_eq!(seen, base(&open(&dir)), "the view is what the fold makes");
    assert_eq!(seen.len(), 2);

    let other =
        view::ManifestView::open(Dir::open(dir.path()).unwrap(), Some(&source("x/")), false);
    let mut other = other.unwrap().unwrap().objects().unwrap();
    assert!(base::ObjectStream::next_object(&mut other)
        .unwrap()
        .is_none());
}

#[test]
fn parts_recorded_after_publishing_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = open(&dir);
    publish(&manifest, "k", 1);
    let part = DurablePart {
        cv: [1; 32],
        crc: None,
    };
    manifest.parts_durable("k", 1, &[(0, part)]).unwrap();
    manifest.fold(None, None).unwrap();
    let objects = base(&manifest);
    assert!(objects[0].1.parts.is_empty());
    assert_eq!(objects[0].1.complete, Some(done(1)));
}

#[test]
fn the_cursor_moves_forward_only() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = open(&dir);
    for (n, key) in ["b", "d", "f"].iter().enumerate() {
        publish(&manifest, key, n as u8);
    }
    manifest.fold(None, None).unwrap();
    let mut cursor = manifest.cursor().unwrap();
    assert!(cursor.find("a").unwrap().is_none());
    assert!(cursor.find("b").unwrap().is_some());
    assert!(cursor.find("b").unwrap().is_some(), "the same key again");
    assert!(cursor.take("d").unwrap().is_some());
    assert!(cursor.find("e").unwrap().is_none());
    let err = cursor.find("c").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert_eq!(cursor.take("f").unwrap().unwrap().complete, Some(done(2)));
    assert!(cursor.find("g").unwrap().is_none());
}

#[test]
fn in_flight_objects_follow_their_records_and_others_stay_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = open(&dir);
    manifest.adopt("k", None);
    manifest.start_object("k", &state("k", "e")).unwrap();
    manifest
        .start_object("other", &state("other", "e"))
        .unwrap();
    assert_eq!(manifest.lookup("k").map(|o| o.etag), Some("e".into()));
    assert!(manifest.lookup("other").is_none());
    manifest.complete("k", "e", done(4)).unwrap();
    assert!(manifest.inspect("k", |o| o.unwrap().complete.is_some()));
    manifest.release("k");
    assert!(manifest.lookup("k").is_none());
}

#[test]
fn another_prefix_sets_the_manifest_aside_and_another_endpoint_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = open(&dir);
    publish(&manifest, "k", 1);
    manifest.fold(None, None).unwrap();
    drop(manifest);
    let moved = SourceInfo {
        endpoint: Some("http://gateway-2:3900".into()),
        ..source("")
    };
    let reopened = Manifest::open(Dir::open(dir.path()).unwrap(), &moved).unwrap();
    assert_eq!(
        base(&reopened).len(),
        1,
        "the same bucket and prefix elsewhere"
    );
    let (header, _) = base::BaseReader::open(&Dir::open(dir.path()).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(header, moved, "the header names the address in use");
    drop(reopened);
    let other = Manifest::open(Dir::open(dir.path()).unwrap(), &source("p/")).unwrap();
    assert!(base(&other).is_empty());
}

#[test]
fn a_fold_with_nothing_to_change_only_reads_the_base() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let manifest = open(&dir);
    publish(&manifest, "k", 1);
    let inode = || {
        std::fs::metadata(dir.path().join(base::BASE))
            .unwrap()
            .ino()
    };
    manifest.fold(None, None).unwrap();
    let written = inode();
    let folded = manifest.fold(Some(listed(&dir, &["k"])), None).unwrap();
    assert_eq!(
        (inode(), folded.objects),
        (written, 1),
        "warm: read, not rewritten"
    );
    manifest.forget("k").unwrap();
    manifest.fold(None, None).unwrap();
    assert_ne!(inode(), written, "a change rewrites it");
    assert!(base(&manifest).is_empty());
}
