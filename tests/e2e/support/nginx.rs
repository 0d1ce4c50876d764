//! nginx (from Debian, `tests/install-nginx.sh`) as the TLS terminator in front of a test
//! server, as on-prem MinIO and Ceph RGW are served: a certificate from a CA made at test time,
//! the TLS versions asked for, connections closed after `keepalive_requests` requests (nginx's
//! default is 1,000), and an access log that tells of each request its TLS version, whether
//! its session was resumed, its connection, and whether the AWS SDK sent it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::authority::Authority;
use super::keeper::{free_ports, log_tail};

const REQUIRE_ENV: &str = "HYDRATOR_REQUIRE_NGINX";

pub struct Nginx {
    pub port: u16,
    /// The CA's certificate (PEM), for `--ca-bundle`.
    pub ca_file: PathBuf,
    dir: tempfile::TempDir,
    child: Child,
}

/// One line of the access log.
#[derive(Debug)]
pub struct Logged {
    pub method: String,
    pub uri: String,
    /// `TLSv1.3` or `TLSv1.2`.
    pub protocol: String,
    pub resumed: bool,
    pub connection: u64,
    /// Sent by the AWS SDK (it names each request with `amz-sdk-invocation-id`).
    pub sdk: bool,
}

fn nginx_bin() -> Option<PathBuf> {
    let installed = Path::new("/usr/sbin/nginx");
    installed.exists().then(|| installed.to_path_buf())
}

impl Nginx {
    /// nginx serving `https://localhost:PORT` in front of `upstream` (`HOST:PORT`) with
    /// `protocols` (`"TLSv1.2 TLSv1.3"`). `None` when nginx is not installed (the caller
    /// skips), unless `HYDRATOR_REQUIRE_NGINX=1`.
    pub fn start(upstream: &str, protocols: &str, keepalive_requests: usize) -> Option<Self> {
        let Some(bin) = nginx_bin() else {
            let hint = "nginx is not installed (tests/install-nginx.sh)";
            if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
                panic!("{REQUIRE_ENV}=1 but {hint}");
            }
            eprintln!("SKIP: {hint}");
            return None;
        };
        let authority = Authority::new();
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name).display().to_string();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &authority.ca_pem).unwrap();
        std::fs::write(at("server.pem"), authority.server.pem()).unwrap();
        std::fs::write(at("server.key"), authority.server_key.serialize_pem()).unwrap();
        let [port, _] = free_ports().unwrap();
        let config = format!(
            "daemon off;\nmaster_process off;\npid {pid};\nerror_log {error} info;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n\
               log_format requests '$request_method $request_uri $ssl_protocol $ssl_session_reused $connection $http_amz_sdk_invocation_id';\n\
               access_log {access} requests;\n\
               client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};\n\
               uwsgi_temp_path {tmp}; scgi_temp_path {tmp};\n\
               server {{\n\
                 listen 127.0.0.1:{port} ssl;\n\
                 server_name localhost;\n\
                 ssl_certificate {cert};\n\
                 ssl_certificate_key {key};\n\
                 ssl_protocols {protocols};\n\
                 ssl_session_cache shared:hydrator:1m;\n\
                 keepalive_requests {keepalive_requests};\n\
                 client_max_body_size 0;\n\
                 location / {{\n\
                   proxy_pass http://{upstream};\n\
                   proxy_http_version 1.1;\n\
                   proxy_set_header Connection \"\";\n\
                   proxy_set_header Host $http_host;\n\
                   proxy_buffering off;\n\
                   proxy_request_buffering off;\n\
                 }}\n\
               }}\n\
             }}\n",
            pid = at("nginx.pid"),
            error = at("error.log"),
            access = at("access.log"),
            tmp = at("tmp"),
            cert = at("server.pem"),
            key = at("server.key"),
        );
        std::fs::create_dir(at("tmp")).unwrap();
        std::fs::write(at("nginx.conf"), config).unwrap();
        let child = Command::new(bin)
            .args(["-p", &at(""), "-c", &at("nginx.conf")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let nginx = Self {
            port,
            ca_file,
            dir,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not listen on {port}:\n{}",
                log_tail(&nginx.dir.path().join("error.log"))
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(nginx)
    }

    /// Every request logged so far.
    pub fn requests(&self) -> Vec<Logged> {
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        log.lines()
            .map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let [method, uri, protocol, reused, connection, invocation] = fields[..] else {
                    panic!("an access log line of another form: {line}");
                };
                Logged {
                    method: method.to_string(),
                    uri: uri.to_string(),
                    protocol: protocol.to_string(),
                    resumed: reused == "r",
                    connection: connection.parse().unwrap(),
                    sdk: invocation != "-",
                }
            })
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
