//! Running the real `hydrator daemon` against a test server, and talking to it the way a pod
//! would: `hydrator warm` processes, and plain HTTP over its unix socket or TCP port.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{hydrator_command, S3Target};

/// The token TCP callers of the test daemons must send.
pub const TOKEN: &str = "test-token-0123456789abcdef";

/// One dataset of a test catalog.
pub struct DatasetSpec<'a> {
    pub name: &'a str,
    pub prefix: &'a str,
    /// Extra TOML lines for its table.
    pub extra: &'a str,
    /// How long a listing counts as current: 0 lists the source again at every warm.
    pub refresh_seconds: u64,
}

pub fn dataset<'a>(name: &'a str, prefix: &'a str) -> DatasetSpec<'a> {
    DatasetSpec {
        name,
        prefix,
        extra: "",
        refresh_seconds: 0,
    }
}

/// A catalog for `target` with these datasets; `cache_extra` adds lines to `[cache]`.
pub fn catalog(
    dir: &Path,
    target: &S3Target,
    quota: &str,
    cache_extra: &str,
    datasets: &[DatasetSpec],
) -> String {
    let mut text = format!(
        "[cache]\nroot = {root:?}\nquota = {quota:?}\nmaintenance_interval_seconds = 1\nconcurrency = \"8\"\n{cache_extra}\n\
         [listen]\nsocket = {socket:?}\ntcp = \"127.0.0.1:0\"\ntoken_file = {token:?}\n",
        root = dir.join("cache"),
        socket = dir.join("hydrator.sock"),
        token = dir.join("token"),
    );
    for d in datasets {
        text += &format!(
            "\n[datasets.{}]\nsource = \"s3://{}/{}\"\nendpoint = {:?}\nregion = {:?}\n\
             access_key_id_env = \"TEST_S3_KEY\"\nsecret_access_key_env = \"TEST_S3_SECRET\"\n\
             refresh_seconds = {}\n{}\n",
            d.name,
            target.bucket,
            d.prefix,
            target.endpoint,
            target.region,
            d.refresh_seconds,
            d.extra
        );
    }
    text
}

/// A running daemon; killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub dir: PathBuf,
    pub socket: PathBuf,
    target: S3Target,
}

impl Daemon {
    /// Writes `catalog` into `dir` and starts the daemon on it; waits until it answers.
    pub fn start(dir: &Path, target: &S3Target, catalog: &str) -> Self {
        std::fs::write(dir.join("token"), TOKEN).unwrap();
        std::fs::write(dir.join("catalog.toml"), catalog).unwrap();
        let log = std::fs::File::create(dir.join("daemon.log")).unwrap();
        let mut daemon = Self {
            child: spawn(target, dir, log),
            dir: dir.to_path_buf(),
            socket: dir.join("hydrator.sock"),
            target: target.clone(),
        };
        daemon.wait_until_ready();
        daemon
    }

    fn wait_until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.try_request("GET", "/readyz", "").is_none() {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the daemon exited with {status}:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "daemon not up:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, as a crash or an OOM kill would end it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the daemon again on the same catalog and directory (after [`Daemon::kill`], as
    /// the DaemonSet would), its log appended to the previous lives'; waits until it answers.
    pub fn start_again(&mut self) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join("daemon.log"))
            .unwrap();
        self.child = spawn(&self.target, &self.dir, log);
        self.wait_until_ready();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// `hydrator warm NAME --daemon unix://SOCKET --wait ARGS...`.
    pub fn warm(&self, name: &str, args: &[&str]) -> Output {
        self.warm_command(name, args).output().unwrap()
    }

    pub fn warm_command(&self, name: &str, args: &[&str]) -> Command {
        let mut command = hydrator_command(&self.target);
        command
            .arg("warm")
            .arg(name)
            .arg("--daemon")
            .arg(format!("unix://{}", self.socket.display()))
            .arg("--wait")
            .args(args);
        command
    }

    /// One HTTP/1.1 request over the unix socket: (status, body).
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.try_request(method, path, body)
            .unwrap_or_else(|| panic!("{method} {path}: no answer\n{}", self.log()))
    }

    fn try_request(&self, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
        let stream = std::os::unix::net::UnixStream::connect(&self.socket).ok()?;
        http(stream, method, path, body, None)
    }

    /// A bodiless request over the unix socket that gives up after `limit` without an answer
    /// (a daemon that is down or restarting): `None`.
    pub fn request_within(
        &self,
        method: &str,
        path: &str,
        limit: Duration,
    ) -> Option<(u16, String)> {
        let stream = std::os::unix::net::UnixStream::connect(&self.socket).ok()?;
        stream.set_read_timeout(Some(limit)).ok()?;
        stream.set_write_timeout(Some(limit)).ok()?;
        http(stream, method, path, "", None)
    }

    /// A request over TCP with `token` as the bearer token.
    pub fn tcp_request(&self, method: &str, path: &str, body: &str, token: &str) -> (u16, String) {
        let addr = self.tcp_addr();
        let stream = std::net::TcpStream::connect(addr).unwrap();
        http(stream, method, path, body, Some(token)).expect("an answer over TCP")
    }

    /// The TCP address the daemon logged (it binds port 0).
    pub fn tcp_addr(&self) -> String {
        let log = self.log();
        // The last life's, when the daemon was started again.
        let line = log
            .lines()
            .rfind(|l| l.contains("listening on http://"))
            .expect("the TCP listener is logged");
        let start = line.find("http://").unwrap() + "http://".len();
        line[start..].split_whitespace().next().unwrap().to_string()
    }

    /// The status JSON of a dataset.
    pub fn status(&self, name: &str) -> serde_json::Value {
        let (code, body) = self.request("GET", &format!("/v1/datasets/{name}"), "");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The sum of the metric's series that `series` names: a name, optionally with labels
    /// (`name{a="x"}`), matching every series of that name that has those labels, as PromQL's
    /// `sum(name{a="x"})` (so `hydrator_bytes_fetched_total` adds up its datasets); 0 if none.
    pub fn metric(&self, series: &str) -> f64 {
        let (_, text) = self.request("GET", "/metrics", "");
        let labels = |s: &str| -> Vec<String> {
            s.trim_start_matches('{')
                .trim_end_matches('}')
                .split(',')
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        };
        let (name, wanted) = match series.split_once('{') {
            Some((name, rest)) => (name, labels(rest)),
            None => (series, Vec::new()),
        };
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|line| {
                let (head, value) = line.rsplit_once(' ')?;
                let (line_name, line_labels) = match head.split_once('{') {
                    Some((n, rest)) => (n, labels(rest)),
                    None => (head, Vec::new()),
                };
                let matches = line_name == name && wanted.iter().all(|w| line_labels.contains(w));
                matches.then(|| value.parse::<f64>().unwrap())
            })
            .sum()
    }

    /// SIGTERM, then the exit status and how long the daemon took to go.
    pub fn terminate(mut self) -> (std::process::ExitStatus, Duration) {
        let started = Instant::now();
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        (status, started.elapsed())
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The daemon on `dir`'s catalog, logging into `log`.
fn spawn(target: &S3Target, dir: &Path, log: std::fs::File) -> Child {
    daemon_command(target, dir)
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap()
}

/// `hydrator daemon --config DIR/catalog.toml` with the test credentials in the environment.
pub fn daemon_command(target: &S3Target, dir: &Path) -> Command {
    let mut command = hydrator_command(target);
    command
        .env("TEST_S3_KEY", &target.access_key)
        .env("TEST_S3_SECRET", &target.secret_key)
        .arg("daemon")
        .arg("--config")
        .arg(dir.join("catalog.toml"));
    command
}

fn http(
    mut stream: impl Read + Write,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> Option<(u16, String)> {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let body = match head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        true => dechunk(body),
        false => body.to_string(),
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}
