//! Runs a subcommand: `sync` and `demo` through the engine, `daemon`, `warm`, `lease` and
//! `csi` through their modules, `verify` and `snapshot` here; and how a run's outcome is shown.

use crate::cli::{Command, SnapshotArgs, VerifyArgs};
use crate::config::SyncConfig;
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
        Command::Demo(args) => crate::demo::run(args).await.map(Outcome::print),
        Command::Verify(args) => verify(args).await,
        Command::Snapshot(args) => snapshot(args).await,
        Command::Daemon(args) => crate::daemon::run(&args.config).await,
        Command::Warm(args) => crate::warm::run(args).await,
        Command::Lease(args) => crate::lease::run(args).await,
        Command::Csi(args) => crate::csi::run(args).await,
    }
}

async fn verify(args: VerifyArgs) -> Result<Exit, SyncError> {
    let mode = match (args.dry_run, args.repair) {
        (true, _) => check::Mode::ReadOnly,
        (false, true) => check::Mode::Repair,
        (false, false) => check::Mode::Check,
    };
    let (findings, source) = check::verify(&args.dest, mode).await?;
    let lists = [
        ("missing", &findings.missing),
        ("corrupt", &findings.corrupt),
        ("unexpected", &findings.unexpected),
    ];
    for (what, paths) in lists {
        for path in paths.iter().take(50) {
            eprintln!("hydrator: verify: {what}: {path}");
        }
    }
    println!(
        "hydrator: verified {} files in {}: {} missing, {} corrupt, {} unexpected",
        findings.checked,
        args.dest.display(),
        findings.missing.len(),
        findings.corrupt.len(),
        findings.unexpected.len()
    );
    if !args.repair {
        return Ok(if findings.clean() {
            Exit::Success
        } else {
            Exit::Failed
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

async fn snapshot(args: SnapshotArgs) -> Result<Exit, SyncError> {
    let url = S3Url::parse(&args.source)?;
    let config = args
        .connection
        .apply(SyncConfig::builder(url.clone(), Default::default()))
        .build()?;
    let settings = config.client_settings();
    let client = client::build(settings, Default::default()).await;
    let snapshot = snapshot::create(client, &url, settings).await?;
    snapshot::write(&args.output, &snapshot).local("writing", &args.output)?;
    let versioned = snapshot.entries.iter().filter(|e| e.version_id.is_some());
    println!(
        "hydrator: snapshot of {url}: {} objects ({}), {} pinned to a version id, the rest to their ETag; digest {} written to {}",
        snapshot.objects,
        crate::units::human_bytes(snapshot.bytes),
        versioned.count(),
        snapshot.digest,
        args.output.display()
    );
    Ok(Exit::Success)
}
