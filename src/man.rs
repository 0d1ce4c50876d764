//! The manual pages: `hydrator.1` and `hydrator-COMMAND.1`, clap's sections (`clap_mangen`:
//! NAME, SYNOPSIS, DESCRIPTION, the options) followed by those clap knows nothing of:
//! ENVIRONMENT, EXIT STATUS and EXAMPLES.
//!
//! ENVIRONMENT lists every variable hydrator reads: those behind options come from the clap
//! definitions themselves (so a new option's variable is listed by construction), and those read
//! beside the options (the AWS credential chain, mc's aliases, logging) from [`READ_BESIDE`],
//! which a test holds against the source.

use std::io::{self, Write};
use std::path::Path;

use clap::CommandFactory;
use clap_mangen::Man;

use crate::cli::Cli;
use crate::source::mc_alias;

/// Which commands read a variable that is not behind an option.
#[derive(Clone, Copy)]
enum Readers {
    /// Every command.
    All,
    /// The commands that reach an S3 server.
    S3,
    /// The commands that take a SOURCE.
    Source,
    Only(&'static [&'static str]),
}

impl Readers {
    fn include(self, command: &str) -> bool {
        const S3: [&str; 7] = [
            "sync", "verify", "snapshot", "mount", "warm", "daemon", "demo",
        ];
        const SOURCE: [&str; 4] = ["sync", "snapshot", "mount", "warm"];
        match self {
            Readers::All => true,
            Readers::S3 => command == "hydrator" || S3.contains(&command),
            Readers::Source => command == "hydrator" || SOURCE.contains(&command),
            Readers::Only(names) => command == "hydrator" || names.contains(&command),
        }
    }
}

/// The variables read beside the options: (name, who reads it, what it does).
const READ_BESIDE: &[(&str, Readers, &str)] = &[
    ("AWS_ACCESS_KEY_ID", Readers::S3, "The access key of the AWS credential chain (with AWS_SECRET_ACCESS_KEY and, for temporary keys, AWS_SESSION_TOKEN). Set, it takes precedence over an mc alias's keys."),
    ("AWS_SECRET_ACCESS_KEY", Readers::S3, "The secret key of the AWS credential chain."),
    ("AWS_SESSION_TOKEN", Readers::S3, "The session token of temporary credentials."),
    ("AWS_CONFIG_FILE", Readers::S3, "The shared config file (default ~/.aws/config), for --profile."),
    ("AWS_SHARED_CREDENTIALS_FILE", Readers::S3, "The shared credentials file (default ~/.aws/credentials), for --profile."),
    ("AWS_ROLE_ARN", Readers::S3, "With AWS_WEB_IDENTITY_TOKEN_FILE: web identity (EKS IRSA), a role taken with the pod's token."),
    ("AWS_WEB_IDENTITY_TOKEN_FILE", Readers::S3, "The web identity token file."),
    ("AWS_DEFAULT_REGION", Readers::S3, "The region when AWS_REGION and --region are not given. The AWS SDK's other standard variables (AWS_EC2_METADATA_DISABLED, AWS_CONTAINER_CREDENTIALS_FULL_URI...) are read as the SDK documents them."),
    ("MC_HOST_<ALIAS>", Readers::Source, "An mc alias, for a SOURCE written ALIAS/BUCKET/PREFIX/: http(s)://ACCESS:SECRET@HOST:PORT, or http(s)://ACCESS:SECRET:TOKEN@HOST:PORT. It comes before mc's config file. --endpoint-url (AWS_ENDPOINT_URL), --path-style and credentials given otherwise (AWS_ACCESS_KEY_ID, --profile, --no-sign-request) come before the alias."),
    (mc_alias::CONFIG_DIR_ENV, Readers::Source, "mc's configuration directory: its config.json (version 10) defines the aliases that MC_HOST_<ALIAS> does not. Default: ~/.mc."),
    ("HOME", Readers::Source, "Where ~/.mc and ~/.aws are."),
    ("SSL_CERT_FILE", Readers::S3, "A PEM file of CA certificates that replaces the system's (--ca-bundle adds to them)."),
    ("SSL_CERT_DIR", Readers::S3, "A directory of CA certificates that replaces the system's."),
    ("RUST_LOG", Readers::All, "A log filter that replaces the one -v and -q set (e.g. hydrator=debug,aws_config=info)."),
    ("NO_COLOR", Readers::All, "Set and not empty: no colour in the output."),
    ("TERM", Readers::All, "dumb: no colour."),
    ("TMPDIR", Readers::Only(&["sync", "verify", "demo"]), "Where a dry run keeps its spool, and where the demo's temporary directory is made."),
];

/// Exit codes, by command.
fn exit_status(command: &str) -> &'static [(u8, &'static str)] {
    const SYNC: &[(u8, &str)] = &[
        (0, "Every selected object is on disk and hashed; DEST/.hydrator/READY is written."),
        (1, "Some objects failed (the first 20 are named in the log, the others counted by cause; the report names them all), --max-errors objects failed in a row and the run stopped, or the run was cut short: the listing broke off, the endpoint was unreachable, the disk failed, --lock-timeout ran out."),
        (2, "Usage or configuration, which retrying will not change: a bad option or SOURCE, credentials missing or rejected, the listing refused, an untrusted certificate, an https:// endpoint that answers plain HTTP, no such bucket, an empty selection, a DEST that is a file or holds another dataset."),
        (3, "Stopped by SIGTERM or SIGINT; the next run resumes."),
        (4, "No room: DEST's filesystem cannot hold what the selection still needs (found before fetching, or by a write that met a full disk); the room reserved and not written is given back, and the next run resumes."),
    ];
    const MOUNT: &[(u8, &str)] = &[
        (0, "Unmounted (SIGTERM, SIGINT or an unmount from outside) once the dataset was complete in --cache, READY written."),
        (1, "The hydration failed or was cut short, as for sync."),
        (2, "Usage or configuration, as for sync, or a MOUNTPOINT that is not a directory."),
        (3, "Unmounted (SIGTERM or SIGINT) before the dataset was complete; the next mount or sync of the cache resumes."),
        (4, "No room in --cache, as for sync."),
    ];
    const VERIFY: &[(u8, &str)] = &[
        (
            0,
            "Nothing missing or corrupt, and READY there (with --repair: everything repaired).",
        ),
        (1, "Files are missing or corrupt, or READY is missing (the dataset is incomplete); with --repair, as sync."),
        (
            2,
            "Usage: DEST is not a directory or holds no manifest, or options that do not apply.",
        ),
        (3, "--repair stopped by SIGTERM or SIGINT."),
        (4, "--repair found no room, as sync."),
    ];
    const WARM: &[(u8, &str)] = &[
        (0, "The dataset is ready; its directory is printed."),
        (1, "It is still hydrating (without --wait, or after --timeout), its hydration failed, or no daemon answered and no --fallback was given; with --fallback, as sync."),
        (2, "Usage: an unknown dataset, a request the daemon refuses, a socket this process may not use."),
    ];
    const LEASE: &[(u8, &str)] = &[
        (0, "Released on SIGTERM or SIGINT."),
        (
            1,
            "The lease could not be released (it expires by itself) or was refused.",
        ),
        (2, "Usage: a bad option, a socket this process may not use."),
    ];
    const KEEPER: &[(u8, &str)] = &[(
        2,
        "Its socket could not be made or served (a directory it may not use). It runs until a signal ends it: the plugin keeps serving the views it holds, and hands them to the next keeper.",
    )];
    const SERVER: &[(u8, &str)] = &[
        (0, "Stopped by SIGTERM or SIGINT."),
        (
            1,
            "It could not start or serve (a socket or directory it cannot use).",
        ),
        (
            2,
            "Usage or configuration: a catalog or option that is not valid.",
        ),
    ];
    const SIMPLE: &[(u8, &str)] = &[(0, "Done."), (1, "Writing failed."), (2, "Usage.")];
    const SNAPSHOT: &[(u8, &str)] = &[
        (0, "The snapshot file is written."),
        (
            1,
            "The listing broke off, or the file could not be written.",
        ),
        (2, "Usage or configuration, as for sync."),
    ];
    match command {
        "sync" | "demo" => SYNC,
        "mount" => MOUNT,
        "verify" => VERIFY,
        "warm" => WARM,
        "lease" => LEASE,
        "daemon" | "csi" | "admission" => SERVER,
        "csi-keeper" => KEEPER,
        "snapshot" => SNAPSHOT,
        "completions" | "man" => SIMPLE,
        _ => SYNC,
    }
}

/// Examples, by command: (what it does, the command line).
fn examples(command: &str) -> &'static [(&'static str, &'static str)] {
    match command {
        "hydrator" | "sync" => &[
            ("Mirror a prefix of an in-cluster MinIO into /data/imagenet, with a JSON report.", "AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... hydrator sync s3://datasets/imagenet/train/ /data/imagenet --endpoint-url http://minio.minio.svc:9000 --report /data/report.json"),
            ("The same through an mc alias, as mc mirror takes it (the endpoint and keys from MC_HOST_depot or ~/.mc/config.json).", "MC_HOST_depot=http://KEY:SECRET@minio:9000 hydrator sync depot/datasets/imagenet/train/ /data/imagenet"),
            ("Say what a run would fetch, and write nothing.", "hydrator sync s3://datasets/imagenet/train/ /data/imagenet --dry-run"),
            ("One node's share of eight.", "hydrator sync s3://datasets/laion/ /data/laion --shard 3/8"),
            ("Hydrate exactly a frozen listing.", "hydrator sync --snapshot imagenet.snap /data/imagenet"),
        ],
        "verify" => &[
            ("Re-hash every file against the manifest.", "hydrator verify /data/imagenet"),
            ("Fetch missing and corrupt files again.", "hydrator verify /data/imagenet --repair"),
        ],
        "snapshot" => &[
            ("Freeze a listing.", "hydrator snapshot s3://datasets/imagenet/train/ -o imagenet.snap --endpoint-url http://minio:9000"),
            ("Seal it with the BLAKE3 of each object, from a DEST hydrated from it.", "hydrator snapshot s3://datasets/imagenet/train/ -o sealed.snap --seal /data/imagenet --from imagenet.snap"),
        ],
        "mount" => &[
            ("Show the whole dataset at once and hydrate it behind the view.", "hydrator mount s3://datasets/imagenet/train/ /mnt/imagenet --cache /nvme/imagenet"),
        ],
        "daemon" => &[
            ("Run the node cache with its catalog.", "hydrator daemon --config /etc/hydrator/catalog.toml"),
        ],
        "warm" => &[
            ("Wait until the node holds imagenet, lease it for this pod, write its directory for the trainer.", "hydrator warm imagenet --wait --lease-holder \"$POD_UID\" --path-file /work/dataset-path"),
            ("Sync directly where no daemon runs.", "hydrator warm imagenet --wait --fallback s3://datasets/imagenet/train/ /data/imagenet"),
        ],
        "lease" => &[
            ("Hold the snapshot warm leased while the trainer runs (a sidecar).", "hydrator lease imagenet --holder \"$POD_UID\" --path-file /work/dataset-path"),
        ],
        "csi" => &[
            ("Run the CSI node plugin (as the DaemonSet does).", "hydrator csi --endpoint unix:///csi/csi.sock --node-id \"$NODE_NAME\""),
        ],
        "admission" => &[
            ("Serve the Kueue AdmissionChecks of controllerName hydrator.dev/prewarm (as the Deployment hydrator-admission does), four nodes fetching from the store at once.", "hydrator admission --token-file /etc/hydrator/token/admission --warm-budget 4 --hold-seconds 600"),
        ],
        "csi-keeper" => &[
            ("Hold the lazy views' connections (as the DaemonSet hydrator-keeper does); the plugin then runs with --keeper-socket on the same path.", "hydrator csi-keeper --socket /run/hydrator-keeper/keeper.sock"),
        ],
        "completions" => &[("Install bash completion.", "hydrator completions bash > /etc/bash_completion.d/hydrator")],
        "man" => &[("Install the manual pages.", "hydrator man /usr/local/share/man/man1")],
        "demo" => &[("Try hydrator against an in-process S3 server.", "hydrator demo --size 64MiB")],
        _ => &[],
    }
}

/// Writes `hydrator.1` and one page per subcommand into `dir` (created if missing).
pub(crate) fn write_pages(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut root = Cli::command().disable_help_subcommand(true);
    root.build();
    for command in root.get_subcommands().filter(|c| !c.is_hide_set()) {
        write_page(dir, command.clone(), command.get_name())?;
    }
    write_page(dir, root, "hydrator")
}

fn write_page(dir: &Path, command: clap::Command, name: &str) -> io::Result<()> {
    let environment = environment(&command, name);
    let man = Man::new(command.clone());
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    if command.get_subcommands().next().is_some() {
        man.render_subcommands_section(&mut page)?;
    }
    render_environment(&mut page, &environment)?;
    render_exit_status(&mut page, exit_status(name))?;
    render_examples(&mut page, examples(name))?;
    if command.get_version().is_some() {
        man.render_version_section(&mut page)?;
    }
    let mut file = std::fs::File::create(dir.join(man.get_filename()))?;
    file.write_all(&page)?;
    file.flush()
}

/// The variables `command` reads: its options' (named by option), then those read beside them.
fn environment(command: &clap::Command, name: &str) -> Vec<(String, String)> {
    let mut variables: Vec<(String, String)> = Vec::new();
    let mut add = |variable: String, text: String| {
        if !variables.iter().any(|(known, _)| *known == variable) {
            variables.push((variable, text));
        }
    };
    let all = std::iter::once(command).chain(command.get_subcommands());
    for arg in all.flat_map(clap::Command::get_arguments) {
        if let Some(variable) = arg.get_env() {
            let option = arg.get_long().map_or_else(
                || arg.get_id().to_string().to_uppercase(),
                |long| format!("--{long}"),
            );
            add(
                variable.to_string_lossy().into_owned(),
                format!("Sets {option}."),
            );
        }
    }
    for (variable, readers, text) in READ_BESIDE {
        if readers.include(name) {
            add(variable.to_string(), text.to_string());
        }
    }
    if Readers::Only(&["daemon"]).include(name) {
        add(
            "(named in the catalog)".into(),
            "The variables a dataset's access_key_id_env and secret_access_key_env name hold its keys.".into(),
        );
    }
    variables
}

/// Text for roff: backslashes and hyphens escaped, no line starting with a control character.
fn roff_text(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    match escaped.starts_with(['.', '\'']) {
        true => format!("\\&{escaped}"),
        false => escaped,
    }
}

fn render_environment(out: &mut Vec<u8>, variables: &[(String, String)]) -> io::Result<()> {
    writeln!(out, ".SH ENVIRONMENT")?;
    for (variable, text) in variables {
        writeln!(
            out,
            ".TP\n\\fB{}\\fR\n{}",
            roff_text(variable),
            roff_text(text)
        )?;
    }
    Ok(())
}

fn render_exit_status(out: &mut Vec<u8>, codes: &[(u8, &str)]) -> io::Result<()> {
    writeln!(out, ".SH \"EXIT STATUS\"")?;
    for (code, text) in codes {
        writeln!(out, ".TP\n\\fB{code}\\fR\n{}", roff_text(text))?;
    }
    Ok(())
}

fn render_examples(out: &mut Vec<u8>, examples: &[(&str, &str)]) -> io::Result<()> {
    if examples.is_empty() {
        return Ok(());
    }
    writeln!(out, ".SH EXAMPLES")?;
    for (what, line) in examples {
        writeln!(
            out,
            ".PP\n{}\n.PP\n.RS 4\n.nf\n{}\n.fi\n.RE",
            roff_text(what),
            roff_text(line)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages() -> (tempfile::TempDir, Vec<(String, String)>) {
        let dir = tempfile::tempdir().unwrap();
        write_pages(dir.path()).unwrap();
        let mut pages: Vec<(String, String)> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&path).unwrap())
            })
            .collect();
        pages.sort();
        (dir, pages)
    }

    #[test]
    fn every_page_has_environment_exit_status_and_examples() {
        let (_dir, pages) = pages();
        assert!(pages.iter().any(|(name, _)| name == "hydrator.1"));
        assert!(pages.iter().any(|(name, _)| name == "hydrator-sync.1"));
        let main = &pages
            .iter()
            .find(|(name, _)| name == "hydrator.1")
            .unwrap()
            .1;
        assert!(main.contains(".SH VERSION"));
        for (name, page) in &pages {
            for section in [
                ".SH ENVIRONMENT",
                ".SH \"EXIT STATUS\"",
                ".SH EXAMPLES",
                ".SH SYNOPSIS",
            ] {
                assert!(page.contains(section), "{name} has no {section}");
            }
            // Options sections come before ours, the version last.
            let environment = page.find(".SH ENVIRONMENT").unwrap();
            assert!(
                page.find(".SH OPTIONS").is_none_or(|o| o < environment),
                "{name}"
            );
            assert!(
                page.find(".SH VERSION").is_none_or(|v| v > environment),
                "{name}"
            );
        }
    }

    #[test]
    fn the_main_page_lists_every_variable_hydrator_reads() {
        let (_dir, pages) = pages();
        let main = &pages
            .iter()
            .find(|(name, _)| name == "hydrator.1")
            .unwrap()
            .1;
        let environment = &main[main.find(".SH ENVIRONMENT").unwrap()..];
        let environment = &environment[..environment.find(".SH \"EXIT STATUS\"").unwrap()];
        let listed =
            |variable: &str| environment.contains(&format!("\\fB{}\\fR", roff_text(variable)));
        // Every option's variable, of every command.
        let mut root = Cli::command();
        root.build();
        let commands = std::iter::once(&root).chain(root.get_subcommands());
        for arg in commands.flat_map(clap::Command::get_arguments) {
            if let Some(variable) = arg.get_env() {
                let variable = variable.to_string_lossy();
                assert!(
                    listed(&variable),
                    "{variable} is not in hydrator.1's ENVIRONMENT"
                );
            }
        }
        // Every variable the source reads by name (env::var, var_os, an env lookup closure).
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for variable in variables_read_in(&src) {
            assert!(
                listed(&variable),
                "{variable} is read in src/ but not in hydrator.1's ENVIRONMENT"
            );
        }
        assert!(listed("MC_HOST_<ALIAS>") && listed("MC_CONFIG_DIR") && listed("RUST_LOG"));
    }

    /// The upper-case names in `var("…")`, `var_os("…")` and `env("…")` calls under `dir`,
    /// tests and the build script left out.
    fn variables_read_in(dir: &Path) -> Vec<String> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                found.extend(variables_read_in(&path));
                continue;
            }
            let name = path.to_string_lossy();
            if path.extension().is_none_or(|e| e != "rs")
                || name.contains("test")
                || name.ends_with("build.rs")
            {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for call in ["var(\"", "var_os(\"", "env(\""] {
                for (at, _) in code.match_indices(call) {
                    let rest = &code[at + call.len()..];
                    let name: String = rest.chars().take_while(|c| *c != '"').collect();
                    if !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    {
                        found.push(name);
                    }
                }
            }
        }
        found
    }

    #[test]
    fn roff_text_is_escaped() {
        assert_eq!(roff_text("--dry-run"), "\\-\\-dry\\-run");
        assert_eq!(roff_text(".hidden"), "\\&.hidden");
        assert_eq!(roff_text("a\\b"), "a\\eb");
    }
}
