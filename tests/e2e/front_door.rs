//! What a new user meets first: an empty selection, a closed pipe, logs in a pod, `warm`'s
//! stdout, `verify` where trainers mount the data, and files in DEST that are not the source's.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::daemon::{catalog, dataset, Daemon, DatasetSpec};
use crate::support::faults::{Fault, Rule};
use crate::support::{
    assert_mirror, content, files, has_ready, hydrator_command, temp_dest, Server, MIB,
};

/// `hydrator ARGS...` as uid 65534, with an empty environment: a trainer's container, which may
/// read what root hydrated but write nothing of it. `dir` is opened to it first.
fn as_nobody(dir: &Path, args: &[&std::ffi::OsStr]) -> std::process::Output {
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    Command::new("setpriv")
        .env_clear()
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_hydrator"))
        .args(args)
        .output()
        .expect("setpriv (util-linux) runs")
}

fn stdout_of(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn an_empty_selection_is_a_usage_error_and_writes_no_ready() {
    let server = Server::local();
    server.seed("empty-sel/", &files(&[("a.txt", content(1, 100))]));
    let bucket = &server.target.bucket;

    // A typo in the prefix.
    let (_tmp, dest) = temp_dest();
    let typo = server.sync("empty-sel-typo/", &dest, &[]);
    typo.assert_code(2);
    let said = typo.stderr();
    assert!(said.contains("nothing to mirror"), "{said}");
    assert!(said.contains("lists no objects"), "{said}");
    assert!(said.contains("--allow-empty"), "{said}");
    assert!(!has_ready(&dest));
    assert_eq!(typo.report()["result"], "failed");

    // Filters that keep nothing.
    let filtered = server.sync("empty-sel/", &dest, &["--include", "*.tar"]);
    filtered.assert_code(2);
    let said = filtered.stderr();
    assert!(said.contains("lists 1 objects"), "{said}");
    assert!(said.contains("--include \"*.tar\""), "{said}");
    assert!(!has_ready(&dest));

    // An object's key given as the prefix.
    let object = server.sync("empty-sel/a.txt", &dest, &[]);
    object.assert_code(2);
    let said = object.stderr();
    assert!(
        said.contains(&format!(
            "s3://{bucket}/empty-sel/a.txt is an object, not a prefix; its prefix is s3://{bucket}/empty-sel/"
        )),
        "{said}"
    );
    assert!(!has_ready(&dest));

    // The dry run says the same.
    let dry = server.sync("empty-sel-typo/", &dest, &["--dry-run"]);
    dry.assert_code(2);

    // Meant: --allow-empty.
    let allowed = server.sync("empty-sel-typo/", &dest, &["--allow-empty"]);
    allowed.assert_code(0);
    assert!(has_ready(&dest));
}

#[test]
fn the_daemon_fails_an_empty_dataset_unless_the_catalog_allows_it() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let specs = [
        dataset("typo", "no-such-prefix/"),
        DatasetSpec {
            extra: "allow_empty = true",
            ..dataset("meant", "no-such-prefix/")
        },
    ];
    let text = catalog(dir.path(), &server.target, "1GiB", "", &specs);
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let typo = daemon.warm("typo", &[]);
    assert!(!typo.status.success());
    let status = daemon.status("typo");
    assert_eq!(status["state"], "failed", "{status}");
    let reason = status["reason"].as_str().unwrap();
    assert!(reason.contains("nothing to mirror"), "{reason}");
    let meant = daemon.warm("meant", &[]);
    assert!(meant.status.success(), "{}", daemon.log());
}

#[test]
fn a_closed_stdout_ends_printing_not_the_run() {
    let server = Server::local();
    let many: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("f{i:03}.bin"), content(i, 10)))
        .collect();
    server.seed(
        "pipe/",
        &many.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    );
    let (tmp, dest) = temp_dest();
    let report = tmp.path().join("report.json");
    let mut child = server
        .sync_command("pipe/", &dest)
        .args(["--dry-run", "--report"])
        .arg(&report)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -1`: one line read, then the reader is gone.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    let _ = stdout.read(&mut first).unwrap();
    drop(stdout);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("the report is written")).unwrap();
    assert_eq!(report["objects"]["downloaded"], 200);

    // Every command: the completion script, cut short the same way.
    let mut child = Command::new(env!("CARGO_BIN_EXE_hydrator"))
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn logs_carry_colour_only_on_a_terminal() {
    let server = Server::local();
    server.seed("colour/", &files(&[("a.txt", content(2, 100))]));
    let (_tmp, dest) = temp_dest();
    // A pod: stderr is a pipe, and nobody set NO_COLOR.
    let run = server
        .sync_command("colour/", &dest)
        .env_remove("NO_COLOR")
        .env("TERM", "xterm-256color")
        .output()
        .unwrap();
    assert!(run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("INFO"), "{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "escape codes in a pipe: {stderr:?}"
    );

    // A terminal (a pty from script(1)): colour, unless NO_COLOR or TERM=dumb says no.
    let on_a_terminal = |env: &[(&str, &str)]| -> String {
        let (_tmp, dest) = temp_dest();
        let line = format!(
            "{} sync s3://{}/colour/ {} --endpoint-url {} --progress none",
            env!("CARGO_BIN_EXE_hydrator"),
            server.target.bucket,
            dest.display(),
            server.target.endpoint
        );
        let target = &server.target;
        let output = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env_remove("NO_COLOR")
            .env("TERM", "xterm-256color")
            .env("AWS_ACCESS_KEY_ID", &target.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &target.secret_key)
            .env("AWS_REGION", &target.region)
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .envs(env.iter().copied())
            .output()
            .expect("script (util-linux) runs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let coloured = on_a_terminal(&[]);
    assert!(coloured.contains("INFO"), "{coloured}");
    assert!(
        coloured.contains('\x1b'),
        "no colour on a terminal: {coloured:?}"
    );
    for env in [("NO_COLOR", "1"), ("TERM", "dumb")] {
        let plain = on_a_terminal(&[env]);
        assert!(plain.contains("INFO"), "{plain}");
        assert!(!plain.contains('\x1b'), "colour with {env:?}: {plain:?}");
    }
}

/// Every line of `text` is one JSON object; returns them.
fn json_lines(text: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(text)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
        })
        .collect()
}

#[test]
fn json_logs_are_json_on_every_line_summary_failures_and_errors_included() {
    let server = Server::local();
    server.seed(
        "json/",
        &files(&[
            ("good.bin", content(3, 1000)),
            ("denied.bin", content(4, 1000)),
        ]),
    );
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("json/denied.bin", Fault::Status(403, "AccessDenied")).times(usize::MAX)
    });
    let (_tmp, dest) = temp_dest();
    let run = server.sync("json/", &dest, &["--log-format", "json"]);
    run.assert_code(1);
    let lines = json_lines(&run.output.stderr);
    let summary = lines
        .iter()
        .find(|l| l["fields"]["objects"].is_object())
        .expect("a summary line");
    assert_eq!(summary["fields"]["objects"]["failed"], 1);
    assert_eq!(summary["fields"]["result"], "failed");
    assert!(lines
        .iter()
        .any(|l| l["level"] == "ERROR" && l["fields"]["key"] == "json/denied.bin"));
    // stdout keeps the closing line scripts capture.
    assert!(stdout_of(&run.output).contains("INCOMPLETE"));

    // A fatal error.
    let (_other, elsewhere) = temp_dest();
    let fatal = server.sync("json-missing/", &elsewhere, &["--log-format", "json"]);
    fatal.assert_code(2);
    let lines = json_lines(&fatal.output.stderr);
    assert!(lines.iter().any(|l| l["level"] == "ERROR"
        && l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("nothing to mirror"))));

    // A command line clap refuses.
    let refused = hydrator_command(&server.target)
        .args(["sync", "--log-format", "json", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let lines = json_lines(&refused.stderr);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0]["fields"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("--no-such-flag")));

    // verify's findings.
    server.faults.clear();
    server.sync("json/", &dest, &[]).assert_code(0);
    std::fs::remove_file(dest.join("good.bin")).unwrap();
    let verify = server.hydrator(&[
        "verify".as_ref(),
        dest.as_os_str(),
        "--log-format".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(verify.status.code(), Some(1));
    let lines = json_lines(&verify.stderr);
    assert!(lines
        .iter()
        .any(|l| l["fields"]["finding"] == "missing" && l["fields"]["path"] == "good.bin"));
    assert!(lines.iter().any(|l| l["fields"]["missing"] == 1));
}

#[test]
fn warm_serves_the_snapshot_held_while_a_refresh_runs() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let first = files(&[("a.bin", content(5, 1000))]);
    server.seed("refresh/", &first);
    let specs = [DatasetSpec {
        refresh_seconds: 1,
        ..dataset("refreshing", "refresh/")
    }];
    let text = catalog(dir.path(), &server.target, "1GiB", "", &specs);
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let warmed = daemon.warm("refreshing", &[]);
    assert!(warmed.status.success(), "{}", daemon.log());
    let held = stdout_of(&warmed);

    // A new version whose download stalls: the refresh runs for seconds.
    server.seed("refresh/", &files(&[("b.bin", content(6, MIB))]));
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("refresh/b.bin", Fault::StallBody(0, Duration::from_secs(4)))
    });
    std::thread::sleep(Duration::from_millis(1100));
    let mut command = hydrator_command(&server.target);
    command
        .args(["warm", "refreshing", "--daemon"])
        .arg(format!("unix://{}", daemon.socket.display()));
    let during = command.output().unwrap();
    assert_eq!(
        during.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&during.stderr)
    );
    assert_eq!(daemon.status("refreshing")["state"], "hydrating");
    assert_eq!(stdout_of(&during), held, "the snapshot held");
    assert_mirror(Path::new(held.trim()), &first);
}

#[test]
fn warm_without_a_daemon_installed_falls_back_at_once_and_prints_only_the_directory() {
    let server = Server::local();
    let data = files(&[("a.bin", content(7, 1000))]);
    server.seed("fallback/", &data);
    let (_tmp, dest) = temp_dest();
    let started = Instant::now();
    let output = hydrator_command(&server.target)
        .args([
            "warm",
            "fallback",
            "--daemon",
            "unix:///no-hydrator-here/hydrator.sock",
        ])
        .args([
            "--endpoint-url",
            &server.target.endpoint,
            "--progress",
            "none",
        ])
        .arg("--fallback")
        .arg(format!("s3://{}/fallback/", server.target.bucket))
        .arg(&dest)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "waited {:?} for a daemon that is not installed",
        started.elapsed()
    );
    assert!(stderr.contains("no daemon is installed"), "{stderr}");
    assert_eq!(stdout_of(&output), format!("{}\n", dest.display()));
    assert_mirror(&dest, &data);
}

#[test]
fn a_plain_verify_only_reads_so_another_uid_can_run_it() {
    let server = Server::local();
    let data = files(&[("a.bin", content(8, 1000)), ("d/b.bin", content(9, 1000))]);
    server.seed("verify-ro/", &data);
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("dest");
    server.sync("verify-ro/", &dest, &[]).assert_code(0);
    let output = as_nobody(tmp.path(), &["verify".as_ref(), dest.as_os_str()]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout_of(&output).contains("verified 2 files"));
    assert!(has_ready(&dest));
}

#[test]
fn sync_verify_and_ready_agree_about_files_not_in_the_source() {
    let server = Server::local();
    let data = files(&[("a.bin", content(10, 1000))]);
    server.seed("foreign/", &data);
    let (_tmp, dest) = temp_dest();
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(dest.join("notes.txt"), b"mine").unwrap();

    let run = server.sync("foreign/", &dest, &[]);
    run.assert_code(0);
    assert!(has_ready(&dest), "READY covers the source's files");
    assert_eq!(run.count("objects", "foreign"), 1);
    assert!(
        stdout_of(&run.output)
            .contains("1 files in DEST are not in the source; --delete removes them"),
        "{}",
        stdout_of(&run.output)
    );

    let verify = server.hydrator(&["verify".as_ref(), dest.as_os_str()]);
    assert_eq!(verify.status.code(), Some(0), "{verify:?}");
    assert!(stdout_of(&verify).contains("1 files not in the source"));
    assert!(has_ready(&dest), "verify keeps READY");

    // Another prefix into the same DEST would mix two datasets.
    server.seed("foreign-other/", &files(&[("z.bin", content(11, 1000))]));
    let mixed = server.sync("foreign-other/", &dest, &[]);
    mixed.assert_code(2);
    assert!(
        mixed.stderr().contains("holds another dataset"),
        "{}",
        mixed.stderr()
    );
    assert!(has_ready(&dest), "refused before touching DEST");
    let replaced = server.sync("foreign-other/", &dest, &["--delete"]);
    replaced.assert_code(0);
    assert_mirror(&dest, &files(&[("z.bin", content(11, 1000))]));
}

#[test]
fn the_messages_users_hit_name_the_cause_and_the_remedy_in_one_line() {
    let server = Server::local();
    server.seed("messages/", &files(&[("a.txt", content(12, 100))]));
    let tmp = tempfile::tempdir().unwrap();
    let error_lines = |output: &std::process::Output| -> Vec<String> {
        String::from_utf8_lossy(&output.stderr)
            .lines()
            .filter(|l| l.starts_with("hydrator: error:"))
            .map(str::to_string)
            .collect()
    };

    // A profile no file defines is named, before any request.
    let mut command = server.sync_command("messages/", &tmp.path().join("a"));
    let output = command.args(["--profile", "nope"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let lines = error_lines(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("--profile nope") && lines[0].contains("no such profile"));

    // No credentials at all: one line, no list of every provider the SDK tried.
    let mut command = server.sync_command("messages/", &tmp.path().join("b"));
    let output = command
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("Attempted:"), "{stderr}");
    assert!(stderr.contains("no usable credentials"), "{stderr}");

    // Nothing listens: the OS's words, not the SDK's layers.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let output = hydrator_command(&server.target)
        .arg("sync")
        .arg(format!("s3://{}/messages/", server.target.bucket))
        .arg(tmp.path().join("c"))
        .args(["--endpoint-url", &endpoint, "--progress", "none"])
        .output()
        .unwrap();
    let lines = error_lines(&output);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("cannot connect: Connection refused")
                && !l.contains("dispatch failure")),
        "{lines:?}"
    );

    // Boolean switches take what environments say.
    let mut command = server.sync_command("messages/", &tmp.path().join("d"));
    let output = command.env("HYDRATOR_DELETE", "1").output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // A DEST this uid may not write: the remedy a pod needs.
    let locked = tmp.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    let source = format!("s3://{}/messages/", server.target.bucket);
    let output = as_nobody(
        tmp.path(),
        &[
            "sync".as_ref(),
            source.as_ref(),
            locked.join("dest").as_os_str(),
            "--endpoint-url".as_ref(),
            server.target.endpoint.as_ref(),
            "--no-sign-request".as_ref(),
        ],
    );
    let lines = error_lines(&output);
    assert!(
        output.status.code() == Some(2) && lines.len() == 1 && lines[0].contains("fsGroup"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn help_groups_options_hides_environment_values_and_verify_refuses_what_it_ignores() {
    let help = Command::new(env!("CARGO_BIN_EXE_hydrator"))
        .args(["sync", "--help"])
        .env("AWS_CA_BUNDLE", "/secret/path/ca.pem")
        .output()
        .unwrap();
    let text = stdout_of(&help);
    for heading in ["S3 connection:", "Transfer:", "Filters:", "Output:"] {
        assert!(text.contains(heading), "{heading} in {text}");
    }
    assert!(!text.contains("/secret/path"), "{text}");

    let (_tmp, dest) = temp_dest();
    let verify = Command::new(env!("CARGO_BIN_EXE_hydrator"))
        .arg("verify")
        .arg(&dest)
        .args(["--include", "*.jpg"])
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&verify.stderr).contains("apply to --repair"));
}

#[test]
fn completions_and_manual_pages_come_from_the_command_line_definition() {
    let hydrator = env!("CARGO_BIN_EXE_hydrator");
    let script = Command::new(hydrator)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(script.status.success());
    let script = stdout_of(&script);
    assert!(script.contains("--allow-empty") && script.contains("verify"));
    let checked = Command::new("bash")
        .args(["-n", "-c", &script])
        .status()
        .unwrap();
    assert!(checked.success(), "bash -n rejects the completion script");

    let dir = tempfile::tempdir().unwrap();
    let man = Command::new(hydrator)
        .arg("man")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(man.status.success());
    let page = std::fs::read_to_string(dir.path().join("hydrator-sync.1")).unwrap();
    assert!(page.starts_with(".ie") || page.contains(".TH"), "{page}");
    assert!(page.contains("allow\\-empty"), "{page}");
    assert!(dir.path().join("hydrator.1").exists());
}
