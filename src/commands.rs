//! Runs a subcommand: `sync` and `demo` through the engine, `daemon`, `warm`, `lease` and
//! `csi` through their modules, `verify` and `snapshot` here; and how a run's outcome is shown.

use clap::CommandFactory;

use crate::cli::{Cli, Command, SnapshotArgs, VerifyArgs};
use crate::config::SyncConfig;
use crate::console::{self, Level};
use crate::engine::{self, Outcome};
use crate::error::{Exit, IoContext, SyncError, UsageError};
use crate::source::client;
use crate::source::url::S3Url;
use crate::{snapshot, verify as check};

/// Runs `command` to its exit code; `Err` when it could not run at all.
pub async fn run(command: Command) -> Result<Exit, SyncError> {
    match command {
        Command::Sync(args) => {
            let hooks = engine::Hooks {
                stop: Some(crate::signals::stop_on_signals()),
                ..Default::default()
            };
            engine::run_with(args.into_config()?, hooks)
                .await
                .map(Outcome::print)
        }
        #[cfg(feature = "demo")]
        Command::Demo(args) => crate::demo::run(args).await,
        Command::Verify(args) => verify(args).await,
        Command::Snapshot(args) => snapshot(args).await,
        Command::Daemon(args) => crate::daemon::run(&args.config).await,
        Command::Warm(args) => crate::warm::run(args).await,
        Command::Lease(args) => crate::lease::run(args).await,
        Command::Csi(args) => crate::csi::run(args).await,
        Command::CsiKeeper(args) => crate::csi::keep(args).await,
        Command::Admission(args) => crate::admission::run(args).await,
        Command::Mount(args) => crate::mount::run(args).await,
        Command::Completions(args) => {
            let mut command = Cli::command();
            let mut script = Vec::new();
            clap_complete::generate(args.shell, &mut command, "hydrator", &mut script);
            crate::out!("{}", String::from_utf8_lossy(&script).trim_end());
            Ok(Exit::Success)
        }
        Command::Man(args) => {
            crate::man::write_pages(&args.dir).local("writing manual pages into", &args.dir)?;
            crate::out!("hydrator: manual pages written into {}", args.dir.display());
            Ok(Exit::Success)
        }
    }
}

async fn verify(args: VerifyArgs) -> Result<Exit, SyncError> {
    let options = &args.options;
    let scoped = !options.include.is_empty() || !options.exclude.is_empty() || options.delete;
    if scoped && !args.repair {
        return Err(UsageError::new(
            "verify checks every file the manifest holds: --include, --exclude and --delete apply to --repair's sync only",
        )
        .into());
    }
    let mode = match args.repair && !args.dry_run {
        true => check::Mode::Repair,
        false => check::Mode::ReadOnly,
    };
    let (findings, source) = check::verify(&args.dest, mode).await?;
    let lists = [
        (Level::Error, "missing", &findings.missing),
        (Level::Error, "corrupt", &findings.corrupt),
        (Level::Info, "not in the source", &findings.foreign),
    ];
    for (level, what, paths) in lists {
        for path in paths.iter().take(50) {
            console::say(
                level,
                format_args!("verify: {what}: {path}"),
                Some(&serde_json::json!({ "finding": what, "path": path })),
            );
        }
    }
    if let Some(incomplete) = &findings.incomplete {
        let mut fields = incomplete_fields(incomplete);
        fields.insert("finding".into(), "ready_missing".into());
        console::say(
            Level::Error,
            format_args!("verify: {incomplete}; verify --repair, or a sync, completes it"),
            Some(&fields),
        );
    }
    let line = format!(
        "hydrator: verified {} files in {}: {} missing, {} corrupt; {} files not in the source{}{}",
        findings.checked,
        args.dest.display(),
        findings.missing.len(),
        findings.corrupt.len(),
        findings.foreign.len(),
        match findings.foreign.is_empty() {
            true => "",
            false => " (kept: sync --delete removes them)",
        },
        match findings.incomplete {
            Some(_) => "; READY missing",
            None => "",
        }
    );
    crate::out!("{line}");
    if console::json() {
        let mut counts = serde_json::json!({
            "dest": args.dest.display().to_string(),
            "checked": findings.checked,
            "missing": findings.missing.len(),
            "corrupt": findings.corrupt.len(),
            "foreign": findings.foreign.len(),
            "ready": findings.incomplete.is_none(),
        });
        if let (Some(incomplete), Some(counts)) = (&findings.incomplete, counts.as_object_mut()) {
            counts.extend(incomplete_fields(incomplete));
        }
        console::say(Level::Info, &line, Some(&counts));
    }
    if !args.repair {
        return Ok(match findings.passes() {
            true => Exit::Success,
            false => Exit::Failed,
        });
    }
    let url = S3Url {
        bucket: source.bucket.clone(),
        prefix: source.prefix.clone(),
    };
    let mut config = args
        .options
        .apply(SyncConfig::builder(url, args.dest.clone()));
    config.endpoint = config.endpoint.or(source.endpoint);
    if config.include.is_empty() && config.exclude.is_empty() {
        config.include = source.include;
        config.exclude = source.exclude;
    }
    config.snapshot = match (&source.snapshot, &args.snapshot) {
        (None, None) => None,
        (Some(digest), None) => {
            return Err(UsageError::new(format!(
                "{} was hydrated from snapshot {digest}: pass --snapshot FILE so the repair stays pinned to it",
                args.dest.display()
            ))
            .into())
        }
        (expected, Some(file)) => {
            let snapshot = snapshot::read(file)?;
            if expected.as_ref().is_some_and(|d| *d != snapshot.digest) {
                return Err(UsageError::new(format!(
                    "{} holds snapshot {}, not {}",
                    args.dest.display(),
                    expected.as_deref().unwrap_or_default(),
                    snapshot.digest
                ))
                .into());
            }
            Some(std::sync::Arc::new(snapshot))
        }
    };
    config.dry_run = args.dry_run;
    let hooks = engine::Hooks {
        ready_removed: args.dry_run && !findings.clean(),
        // The repair forgets these before it syncs; its dry run takes them as forgotten.
        forgotten: match args.dry_run {
            true => findings.bad_keys.into_iter().collect(),
            false => Default::default(),
        },
        ..Default::default()
    };
    Ok(engine::run_with(config.build()?, hooks).await?.print())
}

/// A DEST without READY, as JSON fields: the published objects and bytes the manifest records
/// and, when the last run's listing ended, what it selected (else `null`).
fn incomplete_fields(incomplete: &check::Incomplete) -> serde_json::Map<String, serde_json::Value> {
    let selected = incomplete.selected;
    let fields = [
        ("recorded_objects", Some(incomplete.objects)),
        ("recorded_bytes", Some(incomplete.bytes)),
        ("selected_objects", selected.map(|s| s.objects)),
        ("selected_bytes", selected.map(|s| s.bytes)),
    ];
    fields
        .into_iter()
        .map(|(name, value)| (name.to_string(), value.into()))
        .collect()
}

async fn snapshot(args: SnapshotArgs) -> Result<Exit, SyncError> {
    let config = args
        .connection
        .for_source(&args.source, Default::default())?
        .build()?;
    let url = config.source.clone();
    let settings = config.client_settings();
    let mut snapshot = match &args.from {
        Some(file) => snapshot::read(file)?,
        None => {
            let client = client::build(settings, Default::default()).await;
            let created = snapshot::create(client, &url, settings).await?;
            if let Some(unversioned) = &created.unversioned {
                tracing::warn!("{unversioned}");
            }
            created.snapshot
        }
    };
    if snapshot.url() != url {
        return Err(UsageError::new(format!(
            "--from {}: a snapshot of {}, not of {url}",
            args.from
                .as_deref()
                .unwrap_or_else(|| "".as_ref())
                .display(),
            snapshot.url()
        ))
        .into());
    }
    if let Some(dest) = &args.seal {
        crate::seal::seal(&mut snapshot, dest)?;
    }
    snapshot::write(&args.output, &snapshot).local("writing", &args.output)?;
    let versioned = snapshot.entries.iter().filter(|e| e.version_id.is_some());
    let sealed = match &args.seal {
        Some(dest) => format!(
            ", sealed with the BLAKE3 of each object from {}",
            dest.display()
        ),
        None => String::new(),
    };
    crate::out!(
        "hydrator: snapshot of {url}: {} objects ({}), {} pinned to a version id, the rest to their ETag{sealed}; digest {} written to {}",
        snapshot.objects,
        crate::units::human_bytes(snapshot.bytes),
        versioned.count(),
        snapshot.digest,
        args.output.display()
    );
    Ok(Exit::Success)
}
