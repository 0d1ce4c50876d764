//! Progress with totals: the listing runs ahead of the downloads, so a pod log shows a
//! percentage and an ETA while the first objects are still coming, and JSON progress lines
//! carry the figures.

use crate::support::{content, Server, MIB};

#[test]
fn progress_lines_carry_totals_a_percentage_and_an_eta_from_the_start() {
    let server = Server::local();
    let expected: std::collections::BTreeMap<String, Vec<u8>> = (0..12)
        .map(|i| (format!("p{i:02}"), content(700 + i, MIB)))
        .collect();
    server.seed("progress/", &expected);
    let (_dir, dest) = crate::support::temp_dest();
    // 12 MiB at 1 MiB/s: two progress lines (every 5 s) before the end.
    let output = crate::support::hydrator_command(&server.target)
        .arg("sync")
        .arg(format!("s3://{}/progress/", server.target.bucket))
        .arg(&dest)
        .args(["--endpoint-url", &server.target.endpoint])
        .args(["--progress", "log", "--log-format", "json"])
        .args(["--max-bandwidth", "1MiB"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let progress: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| {
            line["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("progress:"))
        })
        .collect();
    assert!(progress.len() >= 2, "{stderr}");
    let first = &progress[0]["fields"];
    assert_eq!(first["objects_total"], 12, "{first}");
    assert_eq!(first["bytes_total"], 12 * MIB as u64, "{first}");
    assert_eq!(first["totals_final"], true, "{first}");
    // The bytes may all be in while their durable batch is still syncing: an ETA of 0.
    assert!(
        first["bytes_done"].as_u64().unwrap() <= 12 * MIB as u64,
        "{first}"
    );
    let eta = first["eta_seconds"].as_u64().expect("an ETA");
    assert!(eta <= 15, "{first}");
    assert!(first["bytes_per_second"].as_u64().unwrap() > 0, "{first}");
    let message = first["message"].as_str().unwrap();
    assert!(
        message.contains(" %), ") && message.contains("ETA "),
        "{message}"
    );
}
