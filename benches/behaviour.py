#!/usr/bin/env python3
"""hydrator against `mc mirror --overwrite --retry`, the init container it replaces, on MinIO:
what each does when the run goes wrong. Every cell of the table comes from a run.

Starts MinIO on loopback (built with mc by tests/install-minio.sh) behind a counting proxy, so
the bytes the server sent each run are measured on the wire, whatever the tool says. The proxy
also caps the bandwidth (--rate, default 64 MiB/s), so that "half-way" is a point in time that
the harness can hit. Both tools read the same mc alias (`mc alias set depot …` in
MC_CONFIG_DIR) and run as an init container would:

    hydrator sync depot/bench/train/ DEST
    mc mirror --overwrite --retry depot/bench/train/ DEST/

The scenarios:

- clean: a cold run, nothing goes wrong (the bytes a full copy costs);
- kill -9 half-way, then the same command again: bytes fetched again, final copy right or not
  (on train/, and on one 192 MiB object);
- an object replaced (same size, new bytes) while it is being fetched: what lands, then what a
  second run makes of it;
- a typo in the prefix, and a bucket typo: exit code and message;
- an empty selection (an existing, empty bucket): exit code and message;
- SIGTERM half-way, and the server going away half-way (the proxy drops its connections and
  refuses new ones): exit codes, what DEST holds, whether anything in it says it is incomplete;
- two runs started together on one DEST.

    python3 benches/behaviour.py                    # builds hydrator (release) first
    python3 benches/behaviour.py --hydrator PATH    # a built binary

A final copy is "right" when every object's file holds the object's bytes (SHA-256 of each file
against the uploaded data) and nothing else is in DEST but hydrator's `.hydrator/` state.
The table goes to stdout and to benches/RESULTS-behaviour.md.
"""

import argparse
import datetime
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  (MinIO, its binaries, the machine's description)

REPO = compare.REPO
MiB = compare.MiB
log = compare.log
ALIAS = "depot"  # what the tools use, through the proxy
DIRECT = "direct"  # the harness's own uploads, around the proxy
BUCKET = "bench"
EMPTY_BUCKET = "empty"
TRAIN = [(f"shard-{i:02}.bin", 24 * MiB) for i in range(16)] + [
    (f"small/{i:03}.bin", 64 << 10) for i in range(200)]
BIG = ("big.bin", 192 * MiB)
TIMEOUT = 300  # seconds a run may take before the harness kills it
REPLACE_RATE = 16 * MiB  # slower, so that the new object is in place well before the end
GONE_WAIT = 90  # seconds a run is watched after the server went away


# ---------------------------------------------------------------- the counting proxy


class Proxy:
    """TCP relay in front of MinIO: counts the bytes the server sends, caps the rate, and can
    go away (drop every connection, refuse new ones) and come back."""

    def __init__(self, upstream_port, rate):
        self.upstream = ("127.0.0.1", upstream_port)
        self.rate = rate
        self.lock = threading.Lock()
        self.sent = 0  # server → client, since the last reset
        self.budget_start = time.monotonic()
        self.budget_bytes = 0
        self.conns = set()
        self.listener = None
        self.port = compare.free_port()
        self.up()

    def up(self):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(256)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self):
        """The server goes away: connections reset, new ones refused."""
        listener, self.listener = self.listener, None
        if listener:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close alone would not
            except OSError:
                pass
            listener.close()
        with self.lock:
            conns = list(self.conns)
            self.conns.clear()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes the relay threads; the client sees EOF
            except OSError:
                pass

    def reset(self):
        with self.lock:
            sent, self.sent = self.sent, 0
            self.budget_start, self.budget_bytes = time.monotonic(), 0
        return sent

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src, dst, counted):
        try:
            while True:
                data = src.recv(64 << 10)
                if not data:
                    break
                if counted:
                    self._pace(len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self.lock:
                self.conns.discard(src)
                self.conns.discard(dst)
            for s in (src, dst):
                s.close()

    def _pace(self, n):
        with self.lock:
            self.sent += n
            self.budget_bytes += n
            due = self.budget_start + self.budget_bytes / self.rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)


# ---------------------------------------------------------------- the dataset


def content(name, size, generation=0):
    """Deterministic bytes for an object: SHA-256 in counter mode over its name."""
    seed = hashlib.sha256(f"{name}/{generation}".encode()).digest()
    out = bytearray()
    block = 0
    while len(out) < size:
        out += hashlib.sha256(seed + block.to_bytes(8, "little")).digest() * 32  # 1 KiB
        block += 1
    return bytes(out[:size])


def upload(mc, env, key, data, scratch):
    path = scratch / "upload.bin"
    path.write_bytes(data)
    subprocess.run([mc, "cp", "-q", str(path), f"{DIRECT}/{key}"], env=env, check=True,
                   stdout=subprocess.DEVNULL)


def prepare(mc, env, work):
    """Uploads train/ and replace/ (once: a marker records it) and returns the expected hashes."""
    scratch = work / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    expected = {name: hashlib.sha256(content(name, size)).hexdigest() for name, size in TRAIN}
    marker = work / "uploaded"
    if not marker.exists():
        log(f"uploading train/ ({len(TRAIN)} objects) and replace/")
        for b in (BUCKET, EMPTY_BUCKET):
            subprocess.run([mc, "mb", "--ignore-existing", f"{DIRECT}/{b}"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        src = scratch / "train"
        shutil.rmtree(src, ignore_errors=True)
        for name, size in TRAIN:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes(content(name, size))
        subprocess.run([mc, "cp", "-q", "-r", f"{src}/", f"{DIRECT}/{BUCKET}/train/"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(src)
        marker.write_text("train\n")
    marker = work / "uploaded-big"
    if not marker.exists():
        upload(mc, env, f"{BUCKET}/big/{BIG[0]}", content(*BIG), scratch)
        marker.write_text("big\n")
    return expected


# ---------------------------------------------------------------- running a tool


class Tools:
    def __init__(self, hydrator, mc, env):
        self.hydrator, self.mc, self.env = hydrator, mc, env

    def command(self, tool, source, dest):
        if tool == "hydrator":
            return [self.hydrator, "sync", source, str(dest)]
        return [self.mc, "mirror", "--overwrite", "--retry", source, f"{dest}/"]

    def start(self, tool, source, dest, log_path):
        out = open(log_path, "wb")
        return subprocess.Popen(self.command(tool, source, dest), env=self.env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait(process, timeout=TIMEOUT):
    """The exit code, or None if the run had to be killed at the timeout."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None


def wait_for_bytes(proxy, target, process, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while proxy.sent < target:
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def message(log_path, dest):
    """The lines a person would read: errors and warnings, else the last line; DEST for its
    path, log timestamps left out."""
    lines = []
    table = []
    for line in Path(log_path).read_text(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("│"):  # mc's transfer summary, a box of columns
            table.append([cell.strip() for cell in line.strip("│").split("│")])
        elif line and line[0] not in "┌├└─":
            lines.append(line)
    if len(table) >= 2:
        lines.append("summary: " + ", ".join(f"{k} {v}" for k, v in zip(table[0], table[-1])))
    picked = [line for line in lines if any(w in line.lower() for w in (
        "error", "warn", "fail", "no such", "not exist", "empty", "nothing", "incomplete",
        "interrupted", "stopp", "signal", "matched"))]
    picked = [tidy(line, dest) for line in picked or lines[-1:]]
    text = " / ".join(f"`{line}`" for line in dict.fromkeys(picked))
    return (text[:240] + "…`") if len(text) > 240 else text


def tidy(line, dest):
    """A log line without its timestamp and module, DEST for the path."""
    return re.sub(r"^\S+Z\s+(\w+) \S+: ", r"\1: ", line.strip()).replace(str(dest), "DEST")


def examine(dest, expected):
    """What DEST holds against the expected {relative path: sha256}."""
    found = {}
    extras = []
    if dest.exists():
        for root, dirs, files in os.walk(dest):
            if ".hydrator" in dirs:
                dirs.remove(".hydrator")
            for name in files:
                path = Path(root) / name
                rel = str(path.relative_to(dest))
                if rel in expected:
                    found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
                else:
                    extras.append((rel, path.stat().st_size))
    right = sum(1 for rel, digest in found.items() if digest == expected[rel])
    wrong = [rel for rel, digest in found.items() if digest != expected[rel]]
    missing = len(expected) - len(found)
    return right, wrong, missing, extras


def describe(dest, expected):
    right, wrong, missing, extras = examine(dest, expected)
    if right == len(expected) and not extras:
        return "right"
    parts = [f"{right}/{len(expected)} files right"]
    if wrong:
        parts.append(f"{len(wrong)} wrong at the final name")
    if missing:
        parts.append(f"{missing} missing")
    if extras:
        example = sorted(rel for rel, _ in extras)[0]
        parts.append(f"{len(extras)} other files ({sum(s for _, s in extras) / MiB:.1f} MiB, "
                     f"e.g. `{example}`)")
    return ", ".join(parts)


def mib(n):
    return f"{n / MiB:.1f} MiB"


def code(rc):
    return "killed at the timeout" if rc is None else f"exit {rc}"


# ---------------------------------------------------------------- the scenarios


class Harness:
    def __init__(self, tools, proxy, admin_env, mc, work, expected):
        self.tools, self.proxy, self.admin_env, self.mc = tools, proxy, admin_env, mc
        self.work, self.expected = work, expected
        self.total = sum(size for _, size in TRAIN)
        self.train = f"{ALIAS}/{BUCKET}/train/"
        self.expected_big = {BIG[0]: hashlib.sha256(content(*BIG)).hexdigest()}
        self.n = 0

    def dest(self, tool, name):
        dest = self.work / "dest" / f"{tool}-{name}"
        shutil.rmtree(dest, ignore_errors=True)
        return dest

    def log_path(self, tool, name):
        self.n += 1
        path = self.work / "logs" / f"{self.n:02}-{tool}-{name}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def run(self, tool, source, dest, name):
        self.proxy.reset()
        path = self.log_path(tool, name)
        start = time.monotonic()
        rc = wait(self.tools.start(tool, source, dest, path))
        return rc, self.proxy.reset(), time.monotonic() - start, path

    def clean(self, tool):
        dest = self.dest(tool, "clean")
        rc, sent, wall, _ = self.run(tool, self.train, dest, "clean")
        return f"{code(rc)}, {describe(dest, self.expected)}; {mib(sent)} fetched in {wall:.1f} s"

    def interrupted(self, tool, name, how, source=None, total=None):
        """Starts a run, does `how` once half the bytes went by; returns (rc, sent, dest, log)."""
        dest = self.dest(tool, name)
        self.proxy.reset()
        path = self.log_path(tool, name)
        process = self.tools.start(tool, source or self.train, dest, path)
        reached = wait_for_bytes(self.proxy, (total or self.total) // 2, process)
        if not reached:
            rc = wait(process)
            return rc, self.proxy.reset(), dest, path, "finished before half-way"
        how(process)
        rc = wait(process, GONE_WAIT if name == "gone" else TIMEOUT)
        return rc, self.proxy.reset(), dest, path, ""

    def kill9(self, tool, times=3, big=False):
        """Three times: bytes the server sent twice, and the final copy."""
        source, total, expected = self.train, self.total, self.expected
        if big:
            source, total, expected = f"{ALIAS}/{BUCKET}/big/", BIG[1], self.expected_big
        outcomes = []
        for i in range(times):
            name = f"kill9{'-big' if big else ''}-{i + 1}"
            rc1, sent1, dest, _, note = self.interrupted(
                tool, name, lambda p: os.killpg(p.pid, signal.SIGKILL), source, total)
            if note:
                outcomes.append(note)
                continue
            rc2, sent2, wall, _ = self.run(tool, source, dest, f"{name}-again")
            again = max(sent1 + sent2 - total, 0)
            outcomes.append(f"killed at {mib(sent1)}, the re-run fetched {mib(sent2)}: "
                            f"**{again / MiB:.1f} MiB twice**, {code(rc2)}, "
                            f"{describe(dest, expected)}")
        return "; ".join(outcomes)

    def sigterm(self, tool):
        rc, sent, dest, path, note = self.interrupted(
            tool, "sigterm", lambda p: os.killpg(p.pid, signal.SIGTERM))
        return (f"{code(rc)} after {mib(sent)}; DEST: {describe(dest, self.expected)}; "
                f"says: {message(path, dest) or '(nothing)'}")

    def gone(self, tool):
        start = [0.0]

        def cut(process):
            start[0] = time.monotonic()
            self.proxy.down()

        rc, sent, dest, path, note = self.interrupted(tool, "gone", cut)
        took = time.monotonic() - start[0]
        self.proxy.up()
        if rc is None:
            ended = f"still running {GONE_WAIT} s after, killed"
        else:
            ended = f"{code(rc)} {took:.0f} s after"
        return (f"{ended}; DEST: {describe(dest, self.expected)}; "
                f"says: {message(path, dest) or '(nothing)'}")

    def replaced(self, tool):
        name, size = BIG
        key = f"{BUCKET}/replace-{tool}/{name}"
        old, new = content(name, size, 0), content(name, size, 1)
        scratch = self.work / "scratch"
        upload(self.mc, self.admin_env, key, old, scratch)
        dest = self.dest(tool, "replace")
        source = f"{ALIAS}/{BUCKET}/replace-{tool}/"
        rate, self.proxy.rate = self.proxy.rate, min(self.proxy.rate, REPLACE_RATE)
        self.proxy.reset()
        path = self.log_path(tool, "replace")
        process = self.tools.start(tool, source, dest, path)
        if not wait_for_bytes(self.proxy, size // 8, process):
            return "finished before an eighth of the object"
        upload(self.mc, self.admin_env, key, new, scratch)
        replaced_at = self.proxy.sent
        replaced_during = process.poll() is None
        rc = wait(process)
        self.proxy.rate = rate
        self.proxy.reset()
        first = landed(dest / name, old, new)
        rc2, sent2, _, _ = self.run(tool, source, dest, "replace-again")
        second = landed(dest / name, old, new)
        when = (f"the new one in place at {mib(replaced_at)} of {mib(size)}" if replaced_during
                else "the new one in place only after the run ended")
        return (f"{code(rc)}, **{first}** ({when}); says: {message(path, dest) or '(nothing)'}; "
                f"a second run: {code(rc2)}, {second}")

    def typo(self, tool, source, name):
        dest = self.dest(tool, name)
        rc, _, _, path = self.run(tool, source, dest, name)
        if not dest.exists():
            made = "DEST not created"
        else:
            held = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
            made = "DEST created, holding " + (", ".join(f"`{h}`" for h in held) or "nothing")
        return f"{code(rc)}; {made}; says: {message(path, dest) or '(nothing)'}"

    def concurrent(self, tool):
        dest = self.dest(tool, "two")
        self.proxy.reset()
        logs = [self.log_path(tool, "two-a"), self.log_path(tool, "two-b")]
        runs = [self.tools.start(tool, self.train, dest, path) for path in logs]
        rcs = [wait(run) for run in runs]
        sent = self.proxy.reset()
        said = [tidy(line, dest) for path in logs
                for line in path.read_text(errors="replace").splitlines()
                if re.search(r"\b(wait|lock)", line, re.I)]
        return (f"{code(rcs[0])} and {code(rcs[1])}; **{mib(sent)} fetched in all**; "
                f"{describe(dest, self.expected)}"
                + (f"; says: `{said[0][:160]}`" if said else ""))


def landed(path, old, new):
    """old, new, absent, or a mix (by 64 KiB block) of the two."""
    if not path.exists():
        return "nothing at the final name"
    data = path.read_bytes()
    if data == old:
        return "the old object"
    if data == new:
        return "the new object"
    block = 64 << 10
    blocks = max(1, (len(data) + block - 1) // block)
    from_old = from_new = 0
    for i in range(0, len(data), block):
        chunk = data[i:i + block]
        from_old += chunk == old[i:i + block]
        from_new += chunk == new[i:i + block]
    return (f"a mix: {len(data) / MiB:.1f} MiB, {from_old * 100 // blocks}% old blocks, "
            f"{from_new * 100 // blocks}% new, {(blocks - from_old - from_new) * 100 // blocks}% "
            f"neither")


SCENARIOS = [
    ("clean run (baseline)", lambda h, t: h.clean(t)),
    ("kill -9 half-way, then the same command again (three times)", lambda h, t: h.kill9(t)),
    ("kill -9 half-way through one 192 MiB object, then again (three times)",
     lambda h, t: h.kill9(t, big=True)),
    ("an object (192 MiB) replaced by another of the same size while it is fetched",
     lambda h, t: h.replaced(t)),
    ("a typo in the prefix (`train/` → `trian/`)",
     lambda h, t: h.typo(t, f"{ALIAS}/{BUCKET}/trian/", "typo")),
    ("a typo in the bucket (`bench` → `bnech`)",
     lambda h, t: h.typo(t, f"{ALIAS}/bnech/train/", "bucket-typo")),
    ("an empty selection (an existing, empty bucket)",
     lambda h, t: h.typo(t, f"{ALIAS}/{EMPTY_BUCKET}/", "empty")),
    ("SIGTERM half-way", lambda h, t: h.sigterm(t)),
    ("the server goes away half-way", lambda h, t: h.gone(t)),
    ("two runs at once on one DEST", lambda h, t: h.concurrent(t)),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hydrator", help="a built hydrator (default: cargo build --release)")
    parser.add_argument("--rate", type=float, default=64, help="proxy cap in MiB/s (default 64)")
    parser.add_argument("--tools", default="hydrator,mc")
    parser.add_argument("--scenarios", help="comma-separated numbers (1-based) to run; default all")
    parser.add_argument("--work", type=Path,
                        default=Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
                        / "bench-behaviour")
    parser.add_argument("--results", type=Path, default=REPO / "benches/RESULTS-behaviour.md")
    args = parser.parse_args()
    tool_names = [t.strip() for t in args.tools.split(",") if t.strip()]
    scenarios = SCENARIOS
    if args.scenarios:
        scenarios = [SCENARIOS[int(i) - 1] for i in args.scenarios.split(",")]

    hydrator = args.hydrator
    if not hydrator:
        hydrator = compare.ensure_tools(set(), "none")["hydrator"]
    minio_bin, mc = compare.minio_binaries()
    args.work.mkdir(parents=True, exist_ok=True)
    server = compare.MinIO(minio_bin, mc, args.work)
    proxy = Proxy(int(server.endpoint.rsplit(":", 1)[1]), args.rate * MiB)
    try:
        mc_config = args.work / "mc"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MC_HOST_"))}
        env["MC_CONFIG_DIR"] = str(mc_config)
        for alias, port in ((ALIAS, proxy.port), (DIRECT, int(server.endpoint.rsplit(":", 1)[1]))):
            subprocess.run([mc, "alias", "set", alias, f"http://127.0.0.1:{port}",
                            compare.ACCESS_KEY, compare.SECRET_KEY], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        expected = prepare(mc, env, args.work)
        harness = Harness(Tools(hydrator, mc, env), proxy, env, mc, args.work, expected)
        rows = []
        for title, scenario in scenarios:
            cells = []
            for tool in tool_names:
                start = time.monotonic()
                cells.append(scenario(harness, tool))
                log(f"{title} | {tool}: {cells[-1]} ({time.monotonic() - start:.0f} s)")
            rows.append((title, cells))
    finally:
        proxy.down()
        server.stop()
    versions = compare.version_of({"hydrator": hydrator, "minio": minio_bin, "mc": mc})
    table = [f"| scenario | {' | '.join(tool_names)} |", "|---" * (len(tool_names) + 1) + "|"]
    table += [f"| {title} | {' | '.join(c.replace('|', '/') for c in cells)} |"
              for title, cells in rows]
    print("\n".join(table))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    args.results.write_text("\n".join([
        "# hydrator against `mc mirror --overwrite --retry`, when things go wrong", "",
        f"Measured {now} by `python3 benches/behaviour.py {' '.join(sys.argv[1:])}`.", "",
        f"- Machine: {compare.machine()}.",
        "- Tools: " + "; ".join(f"{k}: `{v}`" for k, v in versions.items()) + ".",
        f"- Dataset `train/`: {len(TRAIN)} objects, {mib(harness.total)} "
        f"(16 × 24 MiB, 200 × 64 KiB); `big/` one object of {mib(BIG[1])}; the replaced object "
        f"is one of {mib(BIG[1])} too, fetched at "
        f"{min(args.rate * MiB, REPLACE_RATE) / MiB:g} MiB/s.",
        f"- MinIO (single drive) on loopback behind a counting proxy capped at {args.rate:g} MiB/s;"
        " "
        "bytes fetched are what the server sent through it (bodies, headers, listings).",
        "- Commands: `hydrator sync depot/bench/train/ DEST` and "
        "`mc mirror --overwrite --retry depot/bench/train/ DEST/`, one mc alias for both.",
        "", *table, ""]))
    log(f"written to {args.results}")


if __name__ == "__main__":
    main()
