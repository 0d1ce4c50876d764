#!/usr/bin/env python3
"""The lazy view at ImageNet's object count ("lazy W6"): `hydrator mount` of 1,281,167 × 4 KiB
objects from the near-free origin (benches/origin.rs), per binary and round:

  - mounted: seconds from starting `hydrator mount` until the FUSE mount is in
    /proc/self/mountinfo;
  - first file: seconds from the start until the first listed file has been read whole through
    the mountpoint;
  - RSS: the mount process's peak (VmHWM) when it mounts and 5 s later, and its VmRSS then;
  - CPU: the process's user + system seconds when it mounts.

The mount is then unmounted (SIGTERM) and the cache removed: this measures the listing's cost,
not the hydration, which `compare.py --origin --workloads W6` measures for `sync`.

    python3 benches/lazy_scale.py --hydrator-bin NEW --baseline-bin OLD --rounds 1

Run as root (FUSE). --count changes the object count (default W6's). Figures go to stdout and
benches/RESULTS-lazy-scale.md.
"""

import argparse
import datetime
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402
from lazy import fuse_mounted  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PREFIX = "w6"


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def one_run(binary, endpoint, work, env, log):
    cache, mountpoint = work / "cache", work / "mnt"
    shutil.rmtree(cache, ignore_errors=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True)
    cmd = [binary, "mount", f"s3://{compare.BUCKET}/{PREFIX}/", str(mountpoint),
           "--cache", str(cache), "--endpoint-url", endpoint, "--progress", "none"]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        while not fuse_mounted(mountpoint):
            if proc.poll() is not None:
                raise RuntimeError(f"hydrator mount exited {proc.returncode} before mounting")
            if time.monotonic() - start > 900:
                raise RuntimeError("hydrator mount did not mount within 900 s")
            time.sleep(0.005)
        mounted = time.monotonic() - start
        hwm_at_mount = status_kib(proc.pid, "VmHWM")
        cpu = compare.process_cpu(proc.pid)
        with os.scandir(mountpoint) as entries:
            first = next(e for e in entries if e.is_file())
            with open(first.path, "rb") as f:
                while f.read(1 << 20):
                    pass
        first_file = time.monotonic() - start
        time.sleep(max(0.0, mounted + 5 - (time.monotonic() - start)))
        hwm_later = status_kib(proc.pid, "VmHWM")
        rss_later = status_kib(proc.pid, "VmRSS")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["umount", "-l", str(mountpoint)], stderr=subprocess.DEVNULL)
        shutil.rmtree(cache, ignore_errors=True)
    return dict(mounted=mounted, first_file=first_file, cpu=cpu,
                hwm_at_mount=hwm_at_mount, hwm_later=hwm_later, rss_later=rss_later)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hydrator-bin", required=True)
    parser.add_argument("--baseline-bin", default=None)
    parser.add_argument("--count", type=int, default=1_281_167)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work", default="/var/tmp/hydrator-lazy-scale")
    parser.add_argument("--results", default=str(REPO / "benches/RESULTS-lazy-scale.md"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    binaries = [("hydrator", args.hydrator_bin)]
    if args.baseline_bin:
        binaries.append(("hydrator-base", args.baseline_bin))
    workload = compare.Workload(PREFIX, f"{args.count} × 4 KiB", PREFIX, args.count, 4096)
    origin = compare.Origin([workload])
    env = compare.s3_env(origin.endpoint)
    rows = []
    try:
        with open(work / "mount.log", "ab") as log:
            for round_no in range(args.rounds):
                order = binaries if round_no % 2 == 0 else list(reversed(binaries))
                for name, binary in order:
                    run = one_run(binary, origin.endpoint, work, env, log)
                    compare.log(f"{name} round {round_no + 1}: {run}")
                    rows.append((name, run))
    finally:
        origin.stop()
    lines = [
        f"# The lazy view at {args.count:,} objects ({datetime.date.today()})",
        "",
        f"`python3 benches/lazy_scale.py --rounds {args.rounds}`, origin {args.count:,} × 4 KiB,"
        f" {os.cpu_count()} cores.",
        "",
        "| binary | mounted | first file | CPU at mount | VmHWM at mount | VmHWM +5 s | VmRSS +5 s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        lines.append(f"| {name} | {r['mounted']:.2f} s | {r['first_file']:.2f} s | "
                     f"{r['cpu']:.2f} CPU-s | {r['hwm_at_mount'] / 1024:.0f} MiB | "
                     f"{r['hwm_later'] / 1024:.0f} MiB | {r['rss_later'] / 1024:.0f} MiB |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.results).write_text(text)


if __name__ == "__main__":
    main()
