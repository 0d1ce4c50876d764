#!/usr/bin/env python3
"""Start-up, weights half: a model's safetensors loaded into CPU memory by Run:ai's Model
Streamer straight from the store, against hydrator (`sync`, then a local load; or a lazy
`hydrator mount`, loaded through while it hydrates), first load and second load on one node.

The model is generated once with the `safetensors` package: a 4096-hidden, 20-layer
transformer in bf16 (32,000 × 4,096 embeddings and LM head, 4,096² q/k/v/o, 11,008 × 4,096
gate/up/down, 4,096 norms), 8.0 GiB in 4 shards named as Hugging Face names them, with
model.safetensors.index.json. Weights are noise (sign, exponent 2⁻⁷ or 2⁻⁶ and mantissa at
random, ±0.008..0.031, as trained weights lie), not zeros. It is uploaded with s5cmd under
s3://bench/weights-8g/ (a marker object records a complete upload) and the local copy removed.

Each load runs in a fresh Python process (torch imported and the loader ready before the clock
starts) that keeps every tensor it is given, owned, in CPU memory and checks the bytes it got
against the set's total. Its wall time is from the go signal to the last tensor, its CPU
(user + sys of every thread, the streamer's native threads included) from getrusage.
hydrator's CPU comes from wait4 (`sync`) or /proc at the end of the load (`mount`).

Per round and store, in this order:
  streamer/S3       first load, caches dropped; concurrency default (RUNAI_STREAMER_CONCURRENCY
                    unset), then --tuned-concurrency; then a second load from the store (no drop)
  sync + streamer   caches dropped, fresh DEST: `hydrator sync` wall + the streamer on DEST
  sync + safetensors  the same with safetensors.torch.load_file per shard
  local second loads  the warm DEST, streamer and safetensors, caches dropped (NVMe) and hot
  mount + streamer  caches dropped, fresh cache: from `hydrator mount`'s start to the last
                    tensor read through the mountpoint while it hydrates
  mount + safetensors  the same with load_file (mmap through the FUSE view)
  mount second load the streamer through the mountpoint after READY, caches dropped

    python3 benches/startup_weights.py --store minio --rounds 3 --hydrator-bin /tmp/hydrator
    python3 benches/startup_weights.py --store garage --rounds 2 --hydrator-bin /tmp/hydrator

benches/startup.py calls run(store, env, hydrator_bin, work, rounds) with a started
compare.MinIO / compare.Garage and compare.s3_env; run() returns the markdown section.
Run as root (drop_caches, FUSE), under a Python with torch, safetensors and
runai-model-streamer(-s3).
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCHES = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHES))
import compare  # noqa: E402
import lazy  # noqa: E402

MiB, GiB = compare.MiB, compare.GiB
PREFIX = "weights-8g"
HIDDEN, INTER, VOCAB, LAYERS, SHARDS = 4096, 11008, 32000, 20, 4
TUNED_CONCURRENCY = 32


def log(*args):
    print(f"[{datetime.datetime.now():%H:%M:%S}]", *args, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the model


def tensors():
    """(name, shape) of the model, in file order."""
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", (HIDDEN,))]
        out += [(f"{p}.self_attn.{x}_proj.weight", (HIDDEN, HIDDEN)) for x in "qkvo"]
        out += [(f"{p}.post_attention_layernorm.weight", (HIDDEN,))]
        out += [(f"{p}.mlp.gate_proj.weight", (INTER, HIDDEN)),
                (f"{p}.mlp.up_proj.weight", (INTER, HIDDEN)),
                (f"{p}.mlp.down_proj.weight", (HIDDEN, INTER))]
    out += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


TOTAL = sum(2 * numel(s) for _, s in tensors())


def shard_names():
    return [f"model-{i + 1:05}-of-{SHARDS:05}.safetensors" for i in range(SHARDS)]


def layout():
    """Tensors split into SHARDS files of about TOTAL / SHARDS bytes each."""
    names, shards, size = shard_names(), [[] for _ in range(SHARDS)], 0
    for name, shape in tensors():
        index = min(SHARDS - 1, size * SHARDS // TOTAL)
        shards[index].append((name, shape))
        size += 2 * numel(shape)
    return list(zip(names, shards))


def generate(dir):
    import numpy as np
    import torch
    from safetensors.torch import save_file

    dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(45)
    weight_map = {}
    for file, shard in layout():
        made = {}
        for name, shape in shard:
            if len(shape) == 1:  # a norm: ones, as initialised
                made[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                bits = rng.integers(0, 1 << 16, size=numel(shape), dtype=np.uint16)
                # sign and 7 mantissa bits at random, exponent 2^-7 or 2^-6: ±0.008..0.031
                bits &= 0x80FF
                bits |= 0x3C00
                made[name] = torch.from_numpy(bits).view(torch.bfloat16).reshape(shape)
            weight_map[name] = file
        save_file(made, str(dir / file), metadata={"format": "pt"})
        log(f"generated {file}: {(dir / file).stat().st_size / GiB:.2f} GiB")
        del made
    index = {"metadata": {"total_size": TOTAL}, "weight_map": weight_map}
    (dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def s5cmd():
    return shutil.which("s5cmd") or compare.s5cmd_binary()


def ensure_uploaded(env, work):
    marker = f"s3://{compare.BUCKET}/_uploaded/{PREFIX}"
    listed = subprocess.run([s5cmd(), "ls", marker], env=env, capture_output=True, text=True)
    if listed.returncode == 0:
        return
    gen = work / "generated"
    if not (gen / "model.safetensors.index.json").exists():
        log(f"generating the model ({TOTAL / GiB:.2f} GiB) under {gen}")
        generate(gen)
    log(f"uploading it to s3://{compare.BUCKET}/{PREFIX}/")
    compare.sh([s5cmd(), "cp", f"{gen}/", f"s3://{compare.BUCKET}/{PREFIX}/"], env=env,
               stdout=subprocess.DEVNULL)
    (work / "marker").write_text(PREFIX)
    compare.sh([s5cmd(), "cp", str(work / "marker"), marker], env=env, stdout=subprocess.DEVNULL)


# ---------------------------------------------------------------- the loader (child process)


def load(method, root, names):
    """Every tensor of NAMES under ROOT (a directory or s3://BUCKET/PREFIX/) into a dict of
    owned CPU tensors; returns (tensors, bytes)."""
    got = {}
    if method == "streamer":
        from runai_model_streamer import SafetensorsStreamer
        paths = [f"{root}{n}" if root.startswith("s3://") else os.path.join(root, n) for n in names]
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(paths)
            for name, tensor in streamer.get_tensors():
                got[name] = tensor
    elif method == "safetensors":
        from safetensors.torch import load_file
        for n in names:
            # load_file's tensors are views of the file's mmap: nothing is read until they
            # are touched. clone() reads each into memory of its own, as a model's
            # parameters are filled.
            for name, tensor in load_file(os.path.join(root, n)).items():
                got[name] = tensor.clone()
    else:
        raise ValueError(method)
    return got, sum(t.numel() * t.element_size() for t in got.values())


def child(method):
    import torch  # noqa: F401  (imported before the clock, as an inference server has it)
    if method == "streamer":
        import runai_model_streamer  # noqa: F401
    else:
        import safetensors.torch  # noqa: F401
    print("ready", flush=True)
    root = sys.stdin.readline().strip()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    got, size = load(method, root, shard_names())
    t1, r1 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(json.dumps(dict(wall=t1 - t0, cpu=cpu, bytes=size, tensors=len(got), end=t1)),
          flush=True)


class Loader:
    """A loader process, imports done, waiting for its root."""

    def __init__(self, method, env, log_path):
        self.log = open(log_path, "ab")
        self.p = subprocess.Popen([sys.executable, __file__, "--child", method], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                  text=True)
        line = self.p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"loader did not start ({line!r}); see {log_path}")

    def go(self, root):
        self.p.stdin.write(root + "\n")
        self.p.stdin.flush()

    def result(self):
        line = self.p.stdout.readline()
        self.p.wait()
        self.log.close()
        if self.p.returncode != 0 or not line:
            raise RuntimeError(f"loader exited {self.p.returncode}; see {self.log.name}")
        r = json.loads(line)
        if r["bytes"] != TOTAL or r["tensors"] != len(tensors()):
            raise RuntimeError(f"loaded {r['bytes']} B in {r['tensors']} tensors, "
                               f"expected {TOTAL} B in {len(tensors())}")
        return r


# ---------------------------------------------------------------- the runs


class Bench(lazy.Bench):
    def __init__(self, store, env, hydrator, work, tuned):
        super().__init__(argparse.Namespace(concurrency=None), store.endpoint, hydrator, work)
        self.store, self.tuned = store, tuned
        self.env = dict(env)
        self.env.setdefault("RUST_LOG", "info")
        self.env.update(AWS_ENDPOINT_URL=store.endpoint, AWS_EC2_METADATA_DISABLED="true",
                        RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0")
        self.env.pop("RUNAI_STREAMER_CONCURRENCY", None)
        self.shape = argparse.Namespace(key="weights")
        self.url = f"s3://{compare.BUCKET}/{PREFIX}/"

    def loader(self, method, tag, **env):
        return Loader(method, dict(self.env, **env), self.logs / f"{tag}.log")

    def settle(self, drop):
        if drop:
            lazy.drop_caches()

    def streamer_s3(self, tag, drop, **env):
        self.settle(drop)
        ld = self.loader("streamer", tag, **env)
        ld.go(self.url)
        r = ld.result()
        return dict(wall=r["wall"], cpu=r["cpu"], hyd_cpu=0.0)

    def sync(self, tag):
        self.clean()
        lazy.drop_caches()
        cmd = [self.hydrator, "sync", self.url, str(self.dest), "--endpoint-url", self.endpoint,
               "--progress", "none"]
        proc = lazy.Proc(cmd, self.env, self.logs / f"{tag}-sync.log")
        proc.wait()
        if proc.status != 0 or not (self.dest / ".hydrator" / "READY").exists():
            raise RuntimeError(f"hydrator sync exited {proc.status}; see {proc.log.name}")
        return proc

    def sync_then(self, method, tag):
        ld = self.loader(method, tag)
        proc = self.sync(tag)
        ld.go(str(self.dest))
        r = ld.result()
        sync_wall = proc.end - proc.start
        return dict(wall=sync_wall + r["wall"], cpu=r["cpu"], hyd_cpu=proc.cpu, sync=sync_wall,
                    load=r["wall"])

    def local(self, method, tag, drop, root=None):
        self.settle(drop)
        ld = self.loader(method, tag)
        ld.go(str(root or self.dest))
        r = ld.result()
        return dict(wall=r["wall"], cpu=r["cpu"], hyd_cpu=0.0)

    def mounted(self, method, tag):
        self.clean()
        lazy.drop_caches()
        ld = self.loader(method, tag)
        t0 = time.monotonic()
        proc, _ = self.mount(self.shape, tag, source=self.url)
        ld.go(str(self.mountpoint))
        r = ld.result()
        hyd_cpu = proc.cpu_now()
        return proc, dict(wall=r["end"] - t0, cpu=r["cpu"], hyd_cpu=hyd_cpu)

    def mounted_only(self, method, tag):
        return self.mounted(method, tag)[1]

    def timed(self, out, key, fn, *a, **kw):
        """fn's result under KEY, with the CPU the store's processes spent meanwhile."""
        before = sum(compare.process_cpu(pid) for pid in self.store.pids)
        got = fn(*a, **kw)
        spent = sum(compare.process_cpu(pid) for pid in self.store.pids) - before
        got["server_cpu"] = spent
        out[key] = got

    def round(self, rnd, methods=("streamer", "safetensors")):
        if methods == ("safetensors",):
            return self.round_safetensors(rnd)
        out = {}
        tuned = {"RUNAI_STREAMER_CONCURRENCY": str(self.tuned)}
        t = self.timed
        t(out, "streamer S3 (default)", self.streamer_s3, f"s3-default-r{rnd}", True)
        t(out, f"streamer S3 (concurrency {self.tuned})", self.streamer_s3, f"s3-tuned-r{rnd}",
          True, **tuned)
        t(out, "streamer S3 2nd (default)", self.streamer_s3, f"s3-2nd-r{rnd}", False)
        t(out, "sync+streamer", self.sync_then, "streamer", f"sync-streamer-r{rnd}")
        t(out, "sync+safetensors", self.sync_then, "safetensors", f"sync-safetensors-r{rnd}")
        for method in ("streamer", "safetensors"):
            out[f"local 2nd: {method}, cold"] = self.local(method, f"local-{method}-cold-r{rnd}",
                                                           True)
            out[f"local 2nd: {method}, hot"] = self.local(method, f"local-{method}-hot-r{rnd}",
                                                          False)
        t(out, "mount+streamer", self.mounted_only, "streamer", f"mount-streamer-r{rnd}")
        self.wait_ready(self.mount_proc)
        out["mount 2nd: streamer"] = self.local("streamer", f"mount-streamer-2nd-r{rnd}", True,
                                                self.mountpoint)
        self.unmount()
        t(out, "mount+safetensors", self.mounted_only, "safetensors",
          f"mount-safetensors-r{rnd}")
        self.unmount()
        self.clean()
        return out


    def round_safetensors(self, rnd):
        """The safetensors loads of a round alone."""
        out, t = {}, self.timed
        t(out, "sync+safetensors", self.sync_then, "safetensors", f"sync-safetensors-r{rnd}")
        out["local 2nd: safetensors, cold"] = self.local(
            "safetensors", f"local-safetensors-cold-r{rnd}", True)
        out["local 2nd: safetensors, hot"] = self.local(
            "safetensors", f"local-safetensors-hot-r{rnd}", False)
        t(out, "mount+safetensors", self.mounted_only, "safetensors",
          f"mount-safetensors-r{rnd}")
        self.unmount()
        self.clean()
        return out


# ---------------------------------------------------------------- report

ORDER = [
    ("streamer S3 (default)", "first"),
    ("streamer S3 (concurrency {t})", "first"),
    ("sync+streamer", "first"),
    ("sync+safetensors", "first"),
    ("mount+streamer", "first"),
    ("mount+safetensors", "first"),
    ("streamer S3 2nd (default)", "second"),
    ("local 2nd: streamer, cold", "second"),
    ("local 2nd: streamer, hot", "second"),
    ("local 2nd: safetensors, cold", "second"),
    ("local 2nd: safetensors, hot", "second"),
    ("mount 2nd: streamer", "second"),
]

LABELS = {
    "streamer S3 (default)": "Run:ai streamer from the store, RUNAI_STREAMER_CONCURRENCY default",
    "streamer S3 (concurrency {t})": "Run:ai streamer from the store, RUNAI_STREAMER_CONCURRENCY={t}",
    "sync+streamer": "`hydrator sync` + streamer on DEST",
    "sync+safetensors": "`hydrator sync` + safetensors `load_file` on DEST",
    "mount+streamer": "`hydrator mount` (lazy) + streamer through the mountpoint",
    "mount+safetensors": "`hydrator mount` (lazy) + safetensors `load_file` through the mountpoint",
    "streamer S3 2nd (default)": "Run:ai streamer from the store again (default concurrency)",
    "local 2nd: streamer, cold": "streamer on the warm DEST, page cache dropped (NVMe)",
    "local 2nd: streamer, hot": "streamer on the warm DEST, page cache hot",
    "local 2nd: safetensors, cold": "safetensors on the warm DEST, page cache dropped (NVMe)",
    "local 2nd: safetensors, hot": "safetensors on the warm DEST, page cache hot",
    "mount 2nd: streamer": "streamer through the mountpoint after READY, page cache dropped",
}


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def section(store_name, rounds, results, tuned):
    lines = [f"### Weights: {TOTAL / GiB:.2f} GiB of safetensors ({SHARDS} shards, "
             f"{len(tensors())} bf16 tensors) into CPU memory, {store_name}, "
             f"medians of {len(results)} round(s)", "",
             "| load | how | wall | GiB/s | client CPU: loader + hydrator (user+sys) "
             "| store's CPU |",
             "|---|---|---|---|---|---|"]
    medians = {}
    for key, kind in ORDER:
        k = key.format(t=tuned)
        runs = [r[k] for r in results if k in r]
        if not runs:
            continue
        wall = med(r["wall"] for r in runs)
        cpu, hyd = med(r["cpu"] for r in runs), med(r["hyd_cpu"] for r in runs)
        server = med(r.get("server_cpu") for r in runs)
        medians[k] = dict(wall=wall, cpu=cpu, hyd=hyd)
        extra = ""
        if "sync" in runs[0]:
            extra = (f" (sync {med(r['sync'] for r in runs):.2f} s + load "
                     f"{med(r['load'] for r in runs):.2f} s)")
        hyd_text = f" + {hyd:.2f}" if hyd else ""
        lines.append(f"| {kind} | {LABELS[key].format(t=tuned)} | {wall:.2f} s{extra} | "
                     f"{TOTAL / GiB / wall:.2f} | {cpu:.2f}{hyd_text} s | "
                     + (f"{server:.2f} s |" if server is not None else "— |"))
    lines.append("")
    base = medians.get("streamer S3 (default)")
    best = min((medians[k]["wall"] for k in medians if k.startswith("streamer S3 (")),
               default=None)
    if base:
        for k in ("sync+streamer", "sync+safetensors", "mount+streamer", "mount+safetensors"):
            if k in medians:
                lines.append(f"- {k}: {medians[k]['wall'] / base['wall']:.2f}× the streamer's "
                             f"first load at default concurrency, "
                             f"{medians[k]['wall'] / best:.2f}× its best (target ≤ 1)")
        lines.append("")
    per_round = ["Per round (wall s): " + "; ".join(
        f"r{i + 1}: " + ", ".join(f"{k} {v['wall']:.2f}" for k, v in r.items())
        for i, r in enumerate(results))]
    return "\n".join(lines + per_round + [""])


def versions(hydrator, store):
    import runai_model_streamer  # noqa: F401
    from importlib.metadata import version
    out = {"hydrator": subprocess.run([hydrator, "--version"], capture_output=True,
                                      text=True).stdout.split()[-1]}
    for p in ("torch", "safetensors", "runai-model-streamer", "runai-model-streamer-s3"):
        out[p] = version(p)
    out["python"] = platform.python_version()
    return out


def run(store, env, hydrator_bin, work, rounds, tuned=TUNED_CONCURRENCY,
        methods=("streamer", "safetensors")):
    """Uploads the model once, runs ROUNDS rounds on STORE and returns the markdown section."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    ensure_uploaded(env, work)
    shutil.rmtree(work / "generated", ignore_errors=True)
    bench = Bench(store, env, hydrator_bin, work, tuned)
    results = []
    try:
        for rnd in range(1, rounds + 1):
            compare.touch_free_memory()
            log(f"weights, round {rnd}/{rounds}")
            results.append(bench.round(rnd, methods))
            log(json.dumps(results[-1]))
    finally:
        bench.unmount()
    return section(type(store).__name__, rounds, results, tuned)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", choices=["minio", "garage"], default="minio")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hydrator-bin")
    ap.add_argument("--work", default="/var/tmp/startup-weights")
    ap.add_argument("--tuned-concurrency", type=int, default=TUNED_CONCURRENCY)
    ap.add_argument("--out", default=str(BENCHES / "RESULTS-startup-weights.md"))
    ap.add_argument("--only-safetensors", action="store_true",
                    help="only the safetensors loads (sync, local, mount)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    if not args.hydrator_bin:
        ap.error("--hydrator-bin is required")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    hydrator = work / "hydrator"
    shutil.copy2(args.hydrator_bin, hydrator)
    page = compare.PageReporting()
    if args.store == "minio":
        store = compare.MinIO(*compare.minio_binaries(), work)
    else:
        store = compare.Garage(shutil.which("garage") or str(Path.home() / ".cargo/bin/garage"),
                               work)
    env = compare.s3_env(store.endpoint, region=store.region)
    try:
        methods = ("safetensors",) if args.only_safetensors else ("streamer", "safetensors")
        text = run(store, env, str(hydrator), work, args.rounds, args.tuned_concurrency, methods)
    finally:
        store.stop()
        page.restore()
    v = versions(str(hydrator), store)
    head = (f"Machine: {compare.machine()}. Versions: "
            + ", ".join(f"{k} {val}" for k, val in v.items())
            + f". Command: `python3 benches/startup_weights.py --store {args.store} "
            f"--rounds {args.rounds} --hydrator-bin HYDRATOR"
            + (" --only-safetensors" if args.only_safetensors else "") + "`"
            f" ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)\n")
    print(head + "\n" + text)
    out = Path(args.out)
    old = out.read_text() if out.exists() else "# Start-up: model weights\n\n"
    out.write_text(old.rstrip("\n") + "\n\n" + head + "\n" + text)


if __name__ == "__main__":
    sys.exit(main())
