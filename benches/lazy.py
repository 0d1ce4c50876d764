#!/usr/bin/env python3
"""Lazy (`hydrator mount`) against eager (`hydrator sync`) for a trainer reading a dataset.

A "trainer" reads every file once in a fixed shuffled order (random.Random(1)) with K=4 reader
threads, each file read fully with 1 MiB reads; shape C (one big file) is read with random
4 KiB preads instead (one pread per 16 pages of the file, at aligned random offsets). Shapes:

    A  256 × 8 MiB shards        (--scale small: 64 × 8 MiB)
    B  20,000 × 64 KiB files     (--scale small: 5,000 × 64 KiB)
    C  1 × 2 GiB, random 4 KiB   (--scale small: 1 × 512 MiB)
    W  WebDataset-like, under --max-bandwidth (default 10MiB): 2 × 150 MiB shards listed
       first, then 64 × 100 KiB files (the same at both scales)

Per shape and round it measures, with the cache / DEST removed between runs:

  1. time to first batch: lazy = from starting `hydrator mount` (mount time included: the script
     polls /proc/self/mountinfo for the fuse mount) until the first file is fully read through
     the mountpoint; eager = `hydrator sync` wall time + the first file read from DEST.
  2. time to read everything once: lazy = mount start until the trainer has read every file
     through the mount; eager = sync wall time (+ the trainer over DEST, reported beside it).
     The ratio is lazy / eager hydration alone (target ≤ 1.1).
  3. hydrated read speed: after READY, the trainer's pass (sequential 1 MiB reads, then random
     4 KiB preads) through the mountpoint (where `hydrator mount` has bound the cache over the
     view) and through the FUSE view itself (a directory fd taken before READY, as a pod that
     started on a lazy CSI volume keeps it) against the same pass over the cache directory
     (a plain directory standing in for a bind mount), with `sync; echo 3 > drop_caches` before
     each pass; ratio = throughput / plain (target ≥ 0.95). The order rotates by round. Each
     sequential pass is followed at once by the same pass with nothing dropped, as a second
     epoch reads (3e: through the FUSE view, target ≥ 0.9).
  4. hydration cost: mount start to CACHE/.hydrator/READY with the trainer reading, against a
     mount with no reader at all (target ≤ 1.15).

Shape W measures pre-emption instead: right after the mount (and --settle seconds, so that
the shards' GETs are under way), one small file is opened and read whole through the view, then
two more, one after the other; the same at once after a mount of the small files alone (no
shards in flight: the file's own transfer). With --baseline-bin OLD, each round runs OLD too, so the table shows before and after.
Shape W also measures reads of a shard still downloading: a mount of the shards with the small
files (under the cap, the first open --settle seconds after the mount) and a mount of the second
shard alone (no cap), in which that shard is opened, its first MiB timed, and then read on to
its end; beside it, `hydrator sync` of that shard alone, uncapped, gives the link's rate in the
same run (its wall time from the process's start: listing included, which the mount's read
does not count). W's table replaces its own section of the results file and leaves the other shapes' alone.

    python3 benches/lazy.py --shapes W --rounds 3 --hydrator-bin NEW --baseline-bin OLD

Client CPU (user + sys) of the hydrator process: `sync` from wait4(2); `mount` from /proc at
READY (hydration alone, no reader) and from wait4 for the mount that served the trainer.
Medians over the rounds go to stdout and benches/RESULTS-lazy.md.

    python3 benches/lazy.py --origin --shapes A,B,C --rounds 3
    python3 benches/lazy.py --origin --shapes A,B --rounds 1 --scale small

The server is benches/origin.rs (compare.Origin: near-free, in-memory), or with --garage a
single-node Garage (compare.Garage, installed by tests/install-garage.sh; the shapes are
uploaded once with s5cmd and kept under --work). Run as root (drop_caches, FUSE).
--hydrator-bin / --origin-bin take prebuilt binaries (copied first, so a concurrent build in
target/ cannot swap them mid-run).

    python3 benches/lazy.py --garage --shapes A,B,C --rounds 1
"""

import argparse
import datetime
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCHES = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHES))
import compare  # noqa: E402

REPO = compare.REPO
MiB, GiB = compare.MiB, compare.GiB
K = 4
READ = 1 * MiB
PAGE = 4096
PER_DIR = 1000

SHAPES = {
    # name: (title, prefix, full count, small count, size full, size small, random)
    "A": ("shards: {count} × 8 MiB", "la", 256, 64, 8 * MiB, 8 * MiB, False),
    "B": ("small files: {count} × 64 KiB", "lb", 20_000, 5_000, 64 << 10, 64 << 10, False),
    "C": ("one big file: 1 × {size}, random 4 KiB preads", "lc", 1, 1, 2 * GiB, 512 * MiB, True),
}


class Set:
    """COUNT objects of SIZE bytes under PREFIX/ on the server."""

    def __init__(self, prefix, count, size):
        self.prefix, self.count, self.size = prefix, count, size
        self.name = prefix
        self.names = [f"f{i:06}.bin" for i in range(count)]


class WebDataset:
    """Shape W: large shards listed first, small files after, behind a bandwidth cap."""

    key = "W"
    random = False

    def __init__(self):
        shards, small = (2, 150 * MiB), (64, 100 << 10)
        tag = f"lw-{shards[0]}x{shards[1]}-{small[0]}x{small[1]}"
        # Listed in this order: the set names sort so ("a" before "b").
        self.shards = Set(f"{tag}-a", *shards)
        self.small = Set(f"{tag}-b", *small)
        # One mount of the bucket's root takes both sets, in listing order.
        self.includes = [f"{part.prefix}/*" for part in (self.shards, self.small)]
        self.name = "lazy W"
        self.title = (f"WebDataset-like: {shards[0]} × {human(shards[1])} shards listed first, "
                      f"then {small[0]} × {human(small[1])} files")
        # The small files opened in a round, one after the other.
        n = small[0]
        self.opened = [self.small.names[i] for i in (n // 2, n // 4, 3 * n // 4)]

    @property
    def total(self):
        return sum(s.count * s.size for s in (self.shards, self.small))


class Shape:
    def __init__(self, key, scale):
        title, prefix, full, small, size_full, size_small, rnd = SHAPES[key]
        self.key = key
        self.count = full if scale == "full" else small
        self.size = size_full if scale == "full" else size_small
        # One prefix per scale: Garage keeps what was uploaded between runs.
        self.prefix = f"{prefix}-{self.count}x{self.size}"
        self.name = f"lazy {key}"
        self.random = rnd
        self.title = title.format(count=f"{self.count:,}", size=human(self.size))
        digits = max(6, len(str(self.count - 1)))
        names = [f"f{i:0{digits}}.bin" for i in range(self.count)]
        if self.count > PER_DIR:
            names = [f"d{i // PER_DIR:04}/{n}" for i, n in enumerate(names)]
        self.names = names
        order = list(range(self.count))
        random.Random(1).shuffle(order)
        self.order = [names[i] for i in order]

    @property
    def total(self):
        return self.count * self.size

    def preads(self):
        """(name, offset) of the random pass: one 4 KiB pread per 16 pages of each file."""
        rng = random.Random(1)
        pages = self.size // PAGE
        return [(name, [rng.randrange(pages) * PAGE for _ in range(max(1, pages // 16))])
                for name in self.order]


def server_sets(shapes):
    """What the server holds for `shapes`."""
    return [part for s in shapes
            for part in ((s.shards, s.small) if isinstance(s, WebDataset) else (s,))]


def human(n):
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def log(*args):
    print(f"[{datetime.datetime.utcnow():%H:%M:%S}]", *args, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the trainer


def trainer(root, shape, mode, t0=None):
    """Reads the dataset under root with K threads. mode "seq": each file in shape.order fully
    with 1 MiB reads; mode "rand": shape.preads(). Returns (first-file time, all time) relative
    to t0 (default: the trainer's start), and the bytes read. "First" is the first file fully
    read (seq) or the first pread done (rand)."""
    t0 = t0 if t0 is not None else time.monotonic()
    if mode == "seq":
        work = [(name, None) for name in shape.order]
    else:
        work = shape.preads()
        if shape.count == 1:
            # One file: the K threads share its preads (each opens the file).
            name, offsets = work[0]
            work = [(name, offsets[i::K]) for i in range(K)]
    lock = threading.Lock()
    state = {"next": 0, "first": None, "bytes": 0, "error": None}

    def worker():
        buf = bytearray(READ if mode == "seq" else PAGE)
        view = memoryview(buf)
        got = 0
        try:
            while True:
                with lock:
                    i = state["next"]
                    if i >= len(work) or state["error"]:
                        break
                    state["next"] = i + 1
                name, offsets = work[i]
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    if offsets is None:
                        while True:
                            n = os.readv(fd, [view])
                            if n == 0:
                                break
                            got += n
                    else:
                        for off in offsets:
                            got += os.preadv(fd, [view], off)
                            if state["first"] is None:
                                with lock:
                                    if state["first"] is None:
                                        state["first"] = time.monotonic()
                finally:
                    os.close(fd)
                now = time.monotonic()
                with lock:
                    if state["first"] is None:
                        state["first"] = now
        except BaseException as e:  # noqa: BLE001
            with lock:
                state["error"] = e
        with lock:
            state["bytes"] += got

    threads = [threading.Thread(target=worker) for _ in range(K)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = time.monotonic()
    if state["error"]:
        raise state["error"]
    return state["first"] - t0, end - t0, state["bytes"]


def drop_caches():
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


# ---------------------------------------------------------------- processes


def fuse_mounted(mountpoint):
    mp = str(mountpoint)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) > 4 and fields[4] == mp and right.split()[0].startswith("fuse"):
                return True
    return False


def top_is_fuse(mountpoint):
    """Whether the topmost mount on mountpoint is the FUSE view (not the cache bound over it)."""
    mp, top = str(mountpoint), None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) > 4 and fields[4] == mp:
                top = right.split()[0]
    return top is not None and top.startswith("fuse")


def any_mounted(mountpoint):
    mp = str(mountpoint)
    with open("/proc/self/mountinfo") as f:
        return any(len(l.split()) > 4 and l.split()[4] == mp for l in f)


class Proc:
    """A child reaped with wait4(2) for its rusage."""

    def __init__(self, cmd, env, log_path):
        self.log = open(log_path, "ab")
        self.log.write(("\n$ " + " ".join(cmd) + "\n").encode())
        self.log.flush()
        self.start = time.monotonic()
        self.popen = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                      stderr=self.log)
        self.pid = self.popen.pid
        self.status = None
        self.cpu = None
        self.end = None

    def poll(self):
        if self.status is None:
            pid, status, ru = os.wait4(self.pid, os.WNOHANG)
            if pid:
                self._done(status, ru)
        return self.status

    def wait(self, timeout=None):
        if self.status is not None:
            return self.status
        if timeout is None:
            _, status, ru = os.wait4(self.pid, 0)
            self._done(status, ru)
            return self.status
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.poll() is not None:
                return self.status
            time.sleep(0.01)
        return None

    def _done(self, status, ru):
        self.end = time.monotonic()
        self.status = os.waitstatus_to_exitcode(status)
        self.cpu = ru.ru_utime + ru.ru_stime
        self.popen.returncode = self.status
        self.log.close()

    def cpu_now(self):
        return compare.process_cpu(self.pid)


class Bench:
    def __init__(self, args, endpoint, hydrator, work):
        self.args = args
        self.endpoint = endpoint
        self.env = compare.s3_env(endpoint)
        self.env["RUST_LOG"] = self.env.get("RUST_LOG", "info")
        self.hydrator = hydrator
        self.work = work
        self.mountpoint = work / "mnt"
        self.cache = work / "cache"
        self.dest = work / "dest"
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.mount_proc = None

    def source(self, shape):
        return f"s3://{compare.BUCKET}/{shape.prefix}/"

    def clean(self):
        self.unmount()
        for d in (self.cache, self.dest):
            shutil.rmtree(d, ignore_errors=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        subprocess.run(["sync"], check=True)

    def mount(self, shape, tag, source=None, hydrator=None, extra=()):
        self.cache.mkdir(parents=True, exist_ok=True)
        cmd = [hydrator or self.hydrator, "mount", source or self.source(shape),
               str(self.mountpoint), "--cache", str(self.cache), "--endpoint-url", self.endpoint,
               "--progress", "none", *extra]
        if self.args.concurrency:
            cmd += ["--concurrency", self.args.concurrency]
        proc = Proc(cmd, self.env, self.logs / f"{shape.key}-{tag}.log")
        self.mount_proc = proc
        deadline = time.monotonic() + 300
        while not fuse_mounted(self.mountpoint):
            if proc.poll() is not None:
                raise RuntimeError(f"hydrator mount exited {proc.status} before mounting; "
                                   f"see {proc.log.name}")
            if time.monotonic() > deadline:
                raise RuntimeError("hydrator mount did not mount within 300 s")
            time.sleep(0.002)
        return proc, time.monotonic()

    def unmount(self):
        proc, self.mount_proc = self.mount_proc, None
        if proc and proc.status is None:
            proc.popen.send_signal(signal.SIGTERM)
            if proc.wait(30) is None:
                log("hydrator mount did not exit 30 s after SIGTERM; killing it")
                proc.popen.kill()
                proc.wait()
        if any_mounted(self.mountpoint):
            log(f"{self.mountpoint} still mounted after the mount process ended: umount -l")
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=False)
        return proc

    def wait_ready(self, proc, deadline_s=1800):
        ready = self.cache / ".hydrator" / "READY"
        deadline = time.monotonic() + deadline_s
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"hydrator mount exited {proc.status} before READY")
            if time.monotonic() > deadline:
                raise RuntimeError("no READY within the deadline")
            time.sleep(0.005)
        return time.monotonic()

    # ------------------------------------------------------------ the runs

    def lazy(self, shape, rnd):
        """Mount, the trainer at once; READY watched meanwhile."""
        self.clean()
        mode = "rand" if shape.random else "seq"
        t0 = time.monotonic()
        proc, mounted = self.mount(shape, f"lazy-r{rnd}")
        ready_at = {}

        def watch():
            try:
                ready_at["t"] = self.wait_ready(proc)
            except Exception as e:  # noqa: BLE001
                ready_at["error"] = e

        watcher = threading.Thread(target=watch)
        watcher.start()
        first, everything, nbytes = trainer(self.mountpoint, shape, mode, t0)
        watcher.join()
        if "error" in ready_at:
            raise ready_at["error"]
        proc = self.unmount()
        return dict(mount=mounted - proc.start, first=first, all=everything,
                    ready=ready_at["t"] - proc.start, cpu=proc.cpu, exit=proc.status,
                    bytes=nbytes)

    def idle(self, shape, rnd):
        """Mount with no reader until READY; then the hydrated read passes: through the
        mountpoint (once hydrated, the cache bound over the view), through the FUSE view itself
        (a directory fd taken before READY, as a lazy CSI pod keeps it), and the plain cache."""
        self.clean()
        proc, _ = self.mount(shape, f"idle-r{rnd}")
        view_fd = os.open(self.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        ready = self.wait_ready(proc) - proc.start
        cpu = proc.cpu_now()
        deadline = time.monotonic() + 10
        while top_is_fuse(self.mountpoint) and time.monotonic() < deadline:
            time.sleep(0.01)
        if top_is_fuse(self.mountpoint):
            log("  the cache was not bound over the view: 'mount' reads the view")
        passes = {}
        roots = {"mount": self.mountpoint, "view": f"/proc/self/fd/{view_fd}",
                 "plain": self.cache}
        order = ["mount", "view", "plain"]
        order = order[rnd % 3:] + order[:rnd % 3]
        for mode in ("seq", "rand"):
            for where in order:
                root = roots[where]
                drop_caches()
                _, wall, nbytes = trainer(root, shape, mode)
                passes[(mode, where)] = (wall, nbytes)
                log(f"  {shape.key} hydrated {mode} {where}: {wall:.3f} s, "
                    f"{nbytes / wall / MiB:.1f} MiB/s")
                if mode == "seq":
                    # Again at once, nothing dropped: a second epoch.
                    _, wall, nbytes = trainer(root, shape, mode)
                    passes[("warm", where)] = (wall, nbytes)
                    log(f"  {shape.key} hydrated seq again {where}: {wall:.3f} s, "
                        f"{nbytes / wall / MiB:.1f} MiB/s")
        os.close(view_fd)
        proc = self.unmount()
        return dict(ready=ready, cpu=cpu, passes=passes, exit=proc.status)

    def preempt(self, shape, rnd, hydrator, shards):
        """Shape W: mount (with the shards, or the small files alone), let the GETs start, then
        open and read shape.opened one after the other; seconds for each."""
        self.clean()
        extra = ["--max-bandwidth", self.args.max_bandwidth]
        if shards:
            source, root = f"s3://{compare.BUCKET}/", self.mountpoint / shape.small.prefix
            extra += [arg for glob in shape.includes for arg in ("--include", glob)]
        else:
            source, root = f"s3://{compare.BUCKET}/{shape.small.prefix}/", self.mountpoint
        tag = f"preempt-{'shards' if shards else 'alone'}-{Path(hydrator).name}-r{rnd}"
        proc, mounted = self.mount(shape, tag, source, hydrator, extra)
        if shards:
            time.sleep(self.args.settle)
        partials = sorted(p.name for p in self.cache.rglob("*partial*"))
        times, local = [], 0
        cached = self.cache / shape.small.prefix if shards else self.cache
        for name in shape.opened:
            local += (cached / name).exists()
            t = time.monotonic()
            fd = os.open(root / name, os.O_RDONLY)
            try:
                while os.read(fd, READ):
                    pass
            finally:
                os.close(fd)
            times.append(time.monotonic() - t)
        self.unmount()
        return dict(mount=mounted - proc.start, times=times, partials=len(partials), local=local)

    def ranges(self, shape, rnd, hydrator, capped):
        """Shape W's second shard: mount it (capped: with the other shard and the small files,
        under the cap; uncapped: alone), open it, time its first MiB, then read it on to its
        end."""
        self.clean()
        extra = ["--include", f"{shape.shards.prefix}/{shape.shards.names[1]}"]
        if capped:
            extra = [arg for glob in shape.includes for arg in ("--include", glob)]
            extra += ["--max-bandwidth", self.args.max_bandwidth]
        tag = f"ranges-{'capped' if capped else 'free'}-{Path(hydrator).name}-r{rnd}"
        proc, mounted = self.mount(shape, tag, f"s3://{compare.BUCKET}/", hydrator, extra)
        if capped:
            time.sleep(self.args.settle)
        path = self.mountpoint / shape.shards.prefix / shape.shards.names[1]
        t = time.monotonic()
        fd = os.open(path, os.O_RDONLY)
        try:
            n = 0
            while n < MiB:
                chunk = os.read(fd, MiB - n)
                if not chunk:
                    break
                n += len(chunk)
            first = time.monotonic() - t
            while chunk := os.read(fd, READ):
                n += len(chunk)
            whole = time.monotonic() - t
        finally:
            os.close(fd)
        self.unmount()
        if n != shape.shards.size:
            raise RuntimeError(f"read {n} bytes of a {shape.shards.size}-byte shard")
        return dict(first=first, whole=whole, rate=n / whole)

    def link_rate(self, shape, rnd):
        """`hydrator sync` of shape W's second shard alone, uncapped: bytes per second."""
        self.clean()
        source = f"s3://{compare.BUCKET}/{shape.shards.prefix}/"
        cmd = [self.hydrator, "sync", source, str(self.dest), "--endpoint-url", self.endpoint,
               "--progress", "none", "--include", shape.shards.names[1]]
        proc = Proc(cmd, self.env, self.logs / f"W-sync-shards-r{rnd}.log")
        proc.wait()
        if proc.status != 0:
            raise RuntimeError(f"hydrator sync exited {proc.status}; see {proc.log.name}")
        return shape.shards.size / (proc.end - proc.start)

    def eager(self, shape, rnd):
        self.clean()
        mode = "rand" if shape.random else "seq"
        cmd = [self.hydrator, "sync", self.source(shape), str(self.dest), "--endpoint-url",
               self.endpoint, "--progress", "none"]
        if self.args.concurrency:
            cmd += ["--concurrency", self.args.concurrency]
        proc = Proc(cmd, self.env, self.logs / f"{shape.key}-eager-r{rnd}.log")
        proc.wait()
        if proc.status != 0 or not (self.dest / ".hydrator" / "READY").exists():
            raise RuntimeError(f"hydrator sync exited {proc.status}; see {proc.log.name}")
        sync_wall = proc.end - proc.start
        first, everything, _ = trainer(self.dest, shape, mode, proc.start)
        return dict(sync=sync_wall, first=first, all=everything, cpu=proc.cpu)


# ---------------------------------------------------------------- main


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, unit="s"):
    if v is None:
        return "—"
    return f"{v:.3f} {unit}" if unit else f"{v:.3f}"


def check(ratio, target, op):
    if ratio is None:
        return "—"
    ok = ratio <= target if op == "<=" else ratio >= target
    return "met" if ok else "**missed**"


def summarize(shape, runs):
    lz, idle, eg = runs["lazy"], runs["idle"], runs["eager"]
    m = {}
    m["mount"] = med(r["mount"] for r in lz)
    m["lazy_first"] = med(r["first"] for r in lz)
    m["eager_first"] = med(r["first"] for r in eg)
    m["lazy_all"] = med(r["all"] for r in lz)
    m["eager_sync"] = med(r["sync"] for r in eg)
    m["eager_all"] = med(r["all"] for r in eg)
    m["ratio_all"] = med(a["all"] / b["sync"] for a, b in zip(lz, eg))
    def speed(r, mode, where):
        wall, nbytes = r["passes"][(mode, where)]
        return nbytes / wall / MiB

    for mode in ("seq", "rand", "warm"):
        for where in ("mount", "view", "plain"):
            m[f"{mode}_{where}"] = med(speed(r, mode, where) for r in idle)
        m[f"ratio_{mode}"] = med(speed(r, mode, "mount") / speed(r, mode, "plain") for r in idle)
        m[f"ratio_{mode}_view"] = med(speed(r, mode, "view") / speed(r, mode, "plain")
                                      for r in idle)
    m["ready_reader"] = med(r["ready"] for r in lz)
    m["ready_idle"] = med(r["ready"] for r in idle)
    m["ratio_ready"] = med(a["ready"] / b["ready"] for a, b in zip(lz, idle))
    m["cpu_mount_idle"] = med(r["cpu"] for r in idle)
    m["cpu_mount_reader"] = med(r["cpu"] for r in lz)
    m["cpu_sync"] = med(r["cpu"] for r in eg)
    m["rounds"] = len(lz)
    return m


def table(shape, m):
    seq_unit = "4 KiB preads" if shape.random else "1 MiB reads"
    rows = [
        "| figure | lazy (mount) | eager (sync) | ratio | target |",
        "|---|---|---|---|---|",
        f"| 1. time to first batch (lazy: mount start → first file read; mount itself "
        f"{fmt(m['mount'])}) | {fmt(m['lazy_first'])} | {fmt(m['eager_first'])} "
        f"| {fmt(m['lazy_first'] / m['eager_first'], '')} | (lower is better) |",
        f"| 2. time to read everything once (eager: sync alone; sync + reading DEST = "
        f"{fmt(m['eager_all'])}) | {fmt(m['lazy_all'])} | {fmt(m['eager_sync'])} "
        f"| {fmt(m['ratio_all'], '')} | ≤ 1.1 ({check(m['ratio_all'], 1.1, '<=')}) |",
        f"| 3a. hydrated read, sequential 1 MiB reads (mountpoint vs plain cache dir, MiB/s) "
        f"| {fmt(m['seq_mount'], '')} | {fmt(m['seq_plain'], '')} | {fmt(m['ratio_seq'], '')} "
        f"| ≥ 0.95 ({check(m['ratio_seq'], 0.95, '>=')}) |",
        f"| 3b. hydrated read, random 4 KiB preads (mount vs plain, MiB/s) "
        f"| {fmt(m['rand_mount'], '')} | {fmt(m['rand_plain'], '')} | {fmt(m['ratio_rand'], '')} "
        f"| ≥ 0.95 ({check(m['ratio_rand'], 0.95, '>=')}) |",
        f"| 3c. the same sequential reads through the FUSE view under it (what a "
        f"pod that started lazily keeps) | {fmt(m['seq_view'], '')} | {fmt(m['seq_plain'], '')} "
        f"| {fmt(m['ratio_seq_view'], '')} | ≥ 0.95 ({check(m['ratio_seq_view'], 0.95, '>=')}) |",
        f"| 3d. the same random reads through the FUSE view | {fmt(m['rand_view'], '')} "
        f"| {fmt(m['rand_plain'], '')} | {fmt(m['ratio_rand_view'], '')} "
        f"| ≥ 0.95 ({check(m['ratio_rand_view'], 0.95, '>=')}) |",
        f"| 3e. the sequential reads again at once, nothing dropped (a second epoch), through "
        f"the FUSE view | {fmt(m['warm_view'], '')} | {fmt(m['warm_plain'], '')} "
        f"| {fmt(m['ratio_warm_view'], '')} | ≥ 0.9 ({check(m['ratio_warm_view'], 0.9, '>=')}) |",
        f"| 4. hydration wall (mount start → READY): with trainer vs no reader "
        f"| {fmt(m['ready_reader'])} | {fmt(m['ready_idle'])} (no reader) "
        f"| {fmt(m['ratio_ready'], '')} | ≤ 1.15 ({check(m['ratio_ready'], 1.15, '<=')}) |",
        f"| client CPU user+sys: mount (no reader, at READY) / mount (trainer, whole life) vs sync "
        f"| {fmt(m['cpu_mount_idle'])} / {fmt(m['cpu_mount_reader'])} | {fmt(m['cpu_sync'])} "
        f"| {fmt(m['cpu_mount_idle'] / m['cpu_sync'], '') if m['cpu_sync'] else '—'} | — |",
    ]
    del seq_unit
    return "\n".join(rows)


PREEMPTION = "## W, pre-emption:"


def replace_section(text, section):
    """`text` with its pre-emption section (up to the next "## ") replaced by `section`."""
    at = text.find(PREEMPTION)
    if at < 0:
        return text.rstrip("\n") + "\n\n" + section
    end = text.find("\n## ", at + 1)
    return text[:at] + section + (text[end + 1:] if end >= 0 else "")


def preemption(bench, shape, hydrator, baseline):
    """Shape W's rounds; its table (per binary: the first small file's open+read right after
    the mount with the shards in flight, the next two, and the same without the shards)."""
    binaries = [("this build", hydrator)] + ([("baseline", baseline)] if baseline else [])
    runs = {(label, shards): [] for label, _ in binaries for shards in (True, False)}
    for rnd in range(bench.args.rounds):
        order = binaries if rnd % 2 == 0 else binaries[::-1]
        for label, binary in order:
            for shards in (True, False):
                log(f"W round {rnd + 1}/{bench.args.rounds}: {label}, "
                    f"{'behind the shards' if shards else 'alone'}")
                r = bench.preempt(shape, rnd, binary, shards)
                log("  W: " + ", ".join(f"{t:.3f} s" for t in r["times"])
                    + f" (shards' partial files at the first open: {r['partials']}; "
                    f"files local before their open: {r['local']})")
                runs[(label, shards)].append(r)
    reads = {(label, capped): [] for label, _ in binaries for capped in (True, False)}
    links = []
    for rnd in range(bench.args.rounds):
        links.append(bench.link_rate(shape, rnd))
        log(f"W round {rnd + 1}: sync of the shard at {links[-1] / MiB:.1f} MiB/s")
        for label, binary in (binaries if rnd % 2 == 0 else binaries[::-1]):
            for capped in (True, False):
                r = bench.ranges(shape, rnd, binary, capped)
                log(f"  W ranges, {label}, {'capped' if capped else 'uncapped'}: first MiB "
                    f"{r['first']:.3f} s, the shard in {r['whole']:.3f} s "
                    f"({r['rate'] / MiB:.1f} MiB/s)")
                reads[(label, capped)].append(r)
    size = human(shape.small.size)
    cap = bench.args.max_bandwidth
    part = 8 * MiB
    shard = human(shape.shards.size)
    range_rows = [
        f"| hydrator | first MiB of a {shard} shard, shards in flight, cap {cap} | that shard "
        f"read on to its end | the shard alone, no cap: first MiB | read sequentially | "
        "`sync` of the shard, no cap (the link) |",
        "|---|---|---|---|---|---|",
    ]
    for label, _ in binaries:
        capped, free = reads[(label, True)], reads[(label, False)]
        rate_capped = med(r["rate"] for r in capped)
        rate_free, link = med(r["rate"] for r in free), med(links)
        range_rows.append(
            f"| {label} | {fmt(med(r['first'] for r in capped))} "
            f"(target ≤ 1 s + one {human(part)} part's transfer) "
            f"| {rate_capped / MiB:.1f} MiB/s | {fmt(med(r['first'] for r in free))} "
            f"| {rate_free / MiB:.1f} MiB/s ({rate_free / link:.2f} × the link) "
            f"| {link / MiB:.1f} MiB/s |")
    rows = [
        f"| hydrator | first {size} file, behind the shards | the next two | "
        f"first {size} file, no shards | shards in flight at the open | opened files already local "
        "| target |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, _ in binaries:
        behind, alone = runs[(label, True)], runs[(label, False)]
        first = med(r["times"][0] for r in behind)
        alone_first = med(r["times"][0] for r in alone)
        rest = [t for r in behind for t in r["times"][1:]]
        partials = med(r["partials"] for r in behind)
        target = "—" if first is None else check(first - alone_first, 1.0, "<=")
        firsts = ", ".join(f"{r['times'][0]:.2f}" for r in behind)
        rows.append(
            f"| {label} | {fmt(first)} (each: {firsts}) "
            f"| {fmt(med(rest))} (max {max(rest):.2f} s) | {fmt(alone_first)} "
            f"| {partials:g} partial files | {sum(r['local'] for r in behind)} of "
            f"{sum(len(r['times']) for r in behind)} | ≤ 1 s + its own transfer ({target}) |")
    table = "\n".join(rows) + "\n\nReads of a shard still downloading:\n\n" + "\n".join(range_rows)
    print(f"\n{PREEMPTION} {shape.title}\n\n{table}\n", flush=True)
    return (f"Cap --max-bandwidth {bench.args.max_bandwidth}; {bench.args.rounds} rounds, "
            f"medians; the first open {bench.args.settle:g} s after the mount was up.\n\n"
            + table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--origin", action="store_true", help="benches/origin.rs (default)")
    parser.add_argument("--garage", action="store_true",
                        help="a single-node Garage instead of the origin")
    parser.add_argument("--shapes", default="A,B,C")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", choices=["full", "small"], default="full")
    parser.add_argument("--concurrency", default=None)
    parser.add_argument("--work", default="/var/tmp/hydrator-lazy-bench")
    parser.add_argument("--hydrator-bin", default=None)
    parser.add_argument("--origin-bin", default=None)
    parser.add_argument("--output", default=None,
                        help="default: benches/RESULTS-lazy.md (origin), RESULTS-lazy-garage.md")
    parser.add_argument("--baseline-bin", default=None,
                        help="shape W: another hydrator run beside --hydrator-bin (before/after)")
    parser.add_argument("--max-bandwidth", default="10MiB", help="shape W's cap")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="shape W: seconds between the mount and the first open")
    parser.add_argument("--note", action="append", default=[],
                        help="a line added to the results file (e.g. what was not run)")
    args = parser.parse_args()
    if args.output is None:
        name = "RESULTS-lazy-garage.md" if args.garage else "RESULTS-lazy.md"
        args.output = str(BENCHES / name)
    if os.geteuid() != 0:
        sys.exit("run as root (drop_caches, FUSE)")
    shapes = [WebDataset() if k.strip() == "W" else Shape(k.strip(), args.scale)
              for k in args.shapes.split(",")]
    if args.garage and any(isinstance(s, WebDataset) for s in shapes):
        sys.exit("shape W runs against the origin only")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    hydrator_src = args.hydrator_bin
    if not hydrator_src:
        log("building hydrator (release)")
        compare.sh(["cargo", "build", "--release", "--locked", "--bin", "hydrator"], cwd=REPO)
        hydrator_src = str(REPO / "target/release/hydrator")
    hydrator = str(work / "hydrator")
    shutil.copy2(hydrator_src, hydrator)
    version = subprocess.run([hydrator, "--version"], capture_output=True,
                             text=True).stdout.strip()
    baseline = None
    if args.baseline_bin:
        baseline = str(work / "hydrator-baseline")
        shutil.copy2(args.baseline_bin, baseline)

    if args.garage:
        tools = compare.ensure_tools(["s5cmd"])
        origin = compare.Garage(tools["garage"], work)
        for s in shapes:
            compare.upload(s, tools, compare.s3_env(origin.endpoint), work)
        server = "a single-node Garage (sqlite metadata) on loopback, data on the same disk"
    elif args.origin_bin:
        origin = compare.Origin.__new__(compare.Origin)
        sets = []
        for s in server_sets(shapes):
            sets += ["--set", f"{s.prefix}={s.count}x{s.size}"]
        origin.process = subprocess.Popen([args.origin_bin] + sets, stdout=subprocess.PIPE,
                                          text=True)
        origin.endpoint = origin.process.stdout.readline().strip()
        if not origin.endpoint.startswith("http://"):
            sys.exit(f"the origin did not start: {origin.endpoint!r}")
    else:
        origin = compare.Origin(server_sets(shapes))
    if not args.garage:
        server = "benches/origin.rs (in-memory, near-free S3 origin) on loopback"
    bench = Bench(args, origin.endpoint, hydrator, work)
    results = {}
    started = datetime.datetime.now(datetime.timezone.utc)
    try:
        for shape in shapes:
            if isinstance(shape, WebDataset):
                results[shape.key] = (shape, preemption(bench, shape, hydrator, baseline), None)
                continue
            runs = {"lazy": [], "idle": [], "eager": []}
            for rnd in range(args.rounds):
                # Alternate which kind goes first.
                kinds = ["lazy", "idle", "eager"] if rnd % 2 == 0 else ["eager", "idle", "lazy"]
                for kind in kinds:
                    log(f"{shape.key} round {rnd + 1}/{args.rounds}: {kind}")
                    r = getattr(bench, kind)(shape, rnd)
                    log(f"  {shape.key} {kind}: " + ", ".join(
                        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in r.items() if k != "passes"))
                    runs[kind].append(r)
            results[shape.key] = (shape, summarize(shape, runs), runs)
            print(f"\n## {shape.key}: {shape.title}\n\n{table(shape, results[shape.key][1])}\n",
                  flush=True)
    finally:
        bench.unmount()
        origin.stop()

    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    scale = ("full (as specified)" if args.scale == "full" else
             "small: counts/sizes scaled down for this 2-core machine")
    out = [
        "# Lazy (`hydrator mount`) vs eager (`hydrator sync`): a trainer's view",
        "",
        f"- date: {started:%Y-%m-%d %H:%M} UTC",
        f"- CPU: {cpu}, {os.cpu_count()} cores; kernel {os.uname().release}",
        f"- hydrator: {version}",
        f"- server: {server}",
        f"- command: `python3 benches/lazy.py {' '.join(sys.argv[1:])}`",
        f"- scale: {scale}; rounds: {args.rounds}; medians reported",
        f"- cache / DEST: plain directories under {work} (same filesystem), removed between runs",
        f"- trainer: K={K} threads, shuffled order (random.Random(1)), 1 MiB reads "
        "(shape C: random 4 KiB preads, one per 16 pages)",
        "",
    ]
    out += [f"- note: {n}" for n in args.note]
    out.append("\n## garage\n" if args.garage else "\n## origin\n")
    for key, (shape, m, _) in results.items():
        if isinstance(shape, WebDataset):
            continue
        out += [f"### {key}: {shape.title} ({human(shape.total)}, {m['rounds']} rounds)", "",
                table(shape, m), ""]
    output = Path(args.output)
    text = "\n".join(out) + "\n"
    if all(isinstance(shape, WebDataset) for shape, _, _ in results.values()):
        text = output.read_text() if output.exists() else ""
    for shape, m, _ in results.values():
        if isinstance(shape, WebDataset):
            section = "\n".join([
                f"{PREEMPTION} {shape.title}", "",
                f"- date: {started:%Y-%m-%d %H:%M} UTC; {cpu}, {os.cpu_count()} cores",
                f"- hydrator: {version}; server: {server}",
                f"- command: `python3 benches/lazy.py {' '.join(sys.argv[1:])}`",
                *[f"- note: {n}" for n in args.note], "", m, ""])
            text = replace_section(text, section)
    output.write_text(text)
    log(f"wrote {args.output}")


if __name__ == "__main__":
    main()
