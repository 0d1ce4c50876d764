use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use hydrator::cli::Cli;
use hydrator::console::{self, Format, Level};
use hydrator::error::Exit;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if err.use_stderr() && json_asked() => {
            // A usage error in a pod whose log pipeline reads JSON: one JSON line too.
            console::init(Format::Json);
            console::say(Level::Error, err.render().to_string().trim_end(), None);
            return Exit::Usage.into();
        }
        Err(err) => err.exit(),
    };
    console::init(cli.log_format);
    if cli.log_format == Format::Json {
        std::panic::set_hook(Box::new(|panic| {
            console::say(Level::Error, format_args!("panic: {panic}"), None);
        }));
    }
    init_logging(cli.verbose, cli.quiet, cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            console::say(
                Level::Error,
                format_args!("cannot start the async runtime: {err}"),
                None,
            );
            return Exit::Failed.into();
        }
    };
    let result = runtime.block_on(hydrator::commands::run(cli.command));
    match result {
        Ok(exit) => exit.into(),
        Err(err) => {
            let exit = err.exit();
            let fields = serde_json::json!({ "exit_code": exit as u8, "error_kind": err.kind() });
            console::say(Level::Error, format_args!("error: {err}"), Some(&fields));
            exit.into()
        }
    }
}

/// Whether the command line or the environment asks for JSON logs, read before the command
/// line could be parsed.
fn json_asked() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let in_args = args.iter().enumerate().any(|(i, arg)| {
        arg == "--log-format=json"
            || (arg == "--log-format" && args.get(i + 1).is_some_and(|v| v == "json"))
    });
    in_args || std::env::var("HYDRATOR_LOG_FORMAT").is_ok_and(|v| v == "json")
}

fn init_logging(verbose: u8, quiet: u8, format: Format) {
    let level = match (verbose, quiet) {
        (0, 0) => "info",
        (1, _) => "debug",
        (v, _) if v >= 2 => "trace",
        (_, 1) => "warn",
        _ => "error",
    };
    // The crate's own level; the SDK's internals stay at warn unless RUST_LOG says otherwise,
    // and its credential chain at error: what it warns of (every provider it tried, at length)
    // the error that follows names in one line.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("warn,aws_config=error,hydrator={level}")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(console::colour())
        .with_writer(std::io::stderr);
    match format {
        Format::Text => builder.init(),
        Format::Json => builder.json().init(),
    }
}
