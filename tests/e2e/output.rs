//! What a run says, with the real binary: each failed object once (the first ones with their
//! reason, the rest counted by cause), `--max-errors` stopping a run whose every GET is denied,
//! the closing line of an interrupted run, and `exit_code` / `error_kind` in the report and the
//! JSON closing line.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::support::faults::{Fault, Rule};
use crate::support::{content, files, has_ready, temp_dest, wait_until, Run, Server, MIB};

/// `hydrator sync` of `prefix` into `dest` with a report, `args` and `env`.
fn sync(server: &Server, prefix: &str, dest: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let report = dest.with_extension("report.json");
    let output = server
        .sync_command(prefix, dest)
        .arg("--report")
        .arg(&report)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let report = std::fs::read(&report)
        .ok()
        .map(|bytes| serde_json::from_slice(&bytes).expect("the report is JSON"));
    Run { output, report }
}

/// `n` small objects under `prefix`, every GET of which is refused with 403 AccessDenied.
fn denied_dataset(server: &Server, prefix: &str, n: usize) {
    let data: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| (format!("{i:04}.bin"), content(i as u64, 16)))
        .collect();
    server.seed(prefix, &data.into_iter().collect());
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get(prefix, Fault::Status(403, "AccessDenied")).times(usize::MAX)
    });
}

/// The JSON lines of stderr, and the closing one (the summary).
fn closing_json_line(run: &Run) -> Value {
    run.stderr()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|line| line["fields"].get("result").is_some())
        .unwrap_or_else(|| panic!("no closing line:\n{}", run.stderr()))
}

#[test]
fn each_denied_get_is_said_once_and_the_report_keeps_every_failure() {
    let server = Server::local();
    denied_dataset(&server, "out-denied/", 310);
    let (_tmp, dest) = temp_dest();
    let run = sync(
        &server,
        "out-denied/",
        &dest,
        &[],
        &[("HYDRATOR_MAX_ERRORS", "0")],
    );
    run.assert_code(1);
    let stderr = run.stderr();
    let lines: Vec<&str> = stderr.lines().collect();
    eprintln!("310 denied GETs: {} lines on stderr", lines.len());
    assert!(lines.len() <= 25, "{} lines:\n{stderr}", lines.len());
    let named = lines.iter().filter(|l| l.contains("failed: out-denied/"));
    assert_eq!(named.count(), 20, "{stderr}");
    assert!(
        lines.contains(
            &"hydrator: ... and 290 more failures: 290 × GET denied (HTTP 403 AccessDenied)"
        ),
        "{stderr}"
    );
    let report = run.report();
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 310);
    assert_eq!(run.count("objects", "failed"), 310);
    assert!(failures
        .iter()
        .all(|f| f["reason"].as_str().unwrap().contains("access denied")));
    assert!(!has_ready(&dest));
}

#[test]
fn max_errors_stops_a_run_whose_every_get_is_denied() {
    let server = Server::local();
    denied_dataset(&server, "out-systematic/", 1000);
    let (_tmp, dest) = temp_dest();
    let run = sync(&server, "out-systematic/", &dest, &[], &[]);
    run.assert_code(1);
    let stderr = run.stderr();
    let failed = run.count("objects", "failed");
    eprintln!(
        "1000 denied GETs, --max-errors 100: stopped after {failed} failures, {} lines on stderr",
        stderr.lines().count()
    );
    assert!((100..1000).contains(&failed), "{failed} failed\n{stderr}");
    let stopping: Vec<&str> = stderr.lines().filter(|l| l.contains("stopping:")).collect();
    assert_eq!(stopping.len(), 1, "{stderr}");
    assert!(
        stopping[0].starts_with(
            "hydrator: stopping: 100 objects failed in a row and none succeeded since (--max-errors 100); first cause: out-systematic/"
        ),
        "{}",
        stopping[0]
    );
    assert!(stopping[0].contains("access denied (HTTP 403 AccessDenied"));
    let report = run.report();
    assert_eq!(report["failures"].as_array().unwrap().len() as u64, failed);
    assert_eq!(report["exit_code"], 1);
    assert_eq!(report["error_kind"], "objects_failed");
    assert!(!has_ready(&dest));
}

#[test]
fn an_interrupted_run_says_what_it_finished_of_what_was_listed() {
    let server = Server::local();
    let data = files(&[
        ("big.bin", content(81, 24 * MIB)),
        ("small.txt", content(82, 100)),
    ]);
    server.seed("out-stop/", &data);
    server.faults.add(
        Rule::get(
            "out-stop/big.bin",
            Fault::StallBody(MIB, Duration::from_secs(60)),
        )
        .skip(1),
    );
    let (_tmp, dest) = temp_dest();
    let report = dest.with_extension("report.json");
    let child = server
        .sync_command("out-stop/", &dest)
        .args(["--log-format", "json", "--report"])
        .arg(&report)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(
        "small.txt and part of big.bin",
        Duration::from_secs(30),
        || dest.join("small.txt").exists() && dest.join(".big.bin.partial").exists(),
    );
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let output = child.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let run = Run {
        output,
        report: Some(report),
    };
    run.assert_code(3);
    let stdout = String::from_utf8_lossy(&run.output.stdout).into_owned();
    eprintln!("interrupted: {stdout}");
    assert!(
        stdout.starts_with("hydrator: INCOMPLETE: 1 of ")
            && stdout.contains(" listed objects (100 B of 24.0 MiB) from "),
        "{stdout}"
    );
    let closing = closing_json_line(&run);
    assert_eq!(closing["level"], "ERROR", "{closing}");
    assert_eq!(closing["fields"]["exit_code"], 3);
    assert_eq!(closing["fields"]["error_kind"], "interrupted");
    assert_eq!(run.report()["exit_code"], 3);
    assert_eq!(run.report()["error_kind"], "interrupted");
    assert_eq!(run.report()["selection"]["complete"], true);
}

#[test]
fn exit_code_and_error_kind_say_how_a_run_ended() {
    let server = Server::local();
    server.seed(
        "out-kinds/",
        &files(&[("a.bin", content(91, 1000)), ("b.bin", content(92, 1000))]),
    );
    let json = ["--log-format", "json"];

    let (_ok, dest) = temp_dest();
    let complete = sync(&server, "out-kinds/", &dest, &json, &[]);
    complete.assert_code(0);
    assert_eq!(complete.report()["exit_code"], 0);
    assert_eq!(complete.report()["error_kind"], Value::Null);
    let closing = closing_json_line(&complete);
    assert_eq!(closing["level"], "INFO", "{closing}");
    assert_eq!(closing["fields"]["exit_code"], 0);

    let (_refused, dest) = temp_dest();
    let wrong_secret = [("AWS_SECRET_ACCESS_KEY", "not-the-secret-of-this-key")];
    let refused = sync(&server, "out-kinds/", &dest, &json, &wrong_secret);
    refused.assert_code(2);
    assert_eq!(refused.report()["exit_code"], 2);
    assert_eq!(refused.report()["error_kind"], "credentials");
    let closing = closing_json_line(&refused);
    assert_eq!(closing["level"], "ERROR", "{closing}");
    assert_eq!(closing["fields"]["error_kind"], "credentials");

    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("out-kinds/b.bin", Fault::Status(403, "AccessDenied")).times(usize::MAX)
    });
    let (_failed, dest) = temp_dest();
    let failed = sync(&server, "out-kinds/", &dest, &json, &[]);
    failed.assert_code(1);
    assert_eq!(failed.report()["exit_code"], 1);
    assert_eq!(failed.report()["error_kind"], "objects_failed");
    let closing = closing_json_line(&failed);
    assert_eq!(closing["level"], "ERROR", "{closing}");
    assert_eq!(closing["fields"]["exit_code"], 1);
    assert_eq!(closing["fields"]["error_kind"], "objects_failed");
    assert!(closing["fields"].get("failures").is_none());
}
