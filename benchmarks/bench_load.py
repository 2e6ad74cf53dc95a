"""Load time and resident memory: a cached load of GGUF files at their own precision (by default
the Qwen2.5-Coder pair's), and what it leaves resident (the goals: a cached load of the 1.5B file
under 10 s, resident memory of the loaded 1.5B target at most 1.3x its file size).

    python benchmarks/bench_load.py [--refs qwen2.5-coder-1.5b,qwen2.5-coder-0.5b] [--rounds 3]
        [--threads 2] [--machine KIND] [--out docs/results/load-time-memory.jsonl]

Results: one JSON row per (ref, round) written to `--out` (replacing it; default
docs/results/load-time-memory.jsonl), each with the machine (`cpu`, `cpus`, `loadavg_1min`);
prints medians (`specq.bench.tools.load_time` makes the docs' tables of that file).

Each load runs in a fresh process (`--child REF`), so its peak is its own: after one warm-up load
per file (the file in the page cache, the kernels compiled, the tokenizer cached: what "cached"
means), each round records the seconds of `specq.load(ref)` (the kernels backend, as users get
it), the process's VmRSS and VmHWM after its imports and after the load, and the bytes of the
packed weights (the int8dot tensors of every `FileBlocks`; the embedding stays the file's), each
beside the file's size, and those bytes per file format and the kernel form it runs as.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REFS = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")


def memory() -> dict[str, int]:
    """This process's VmRSS and VmHWM in bytes (/proc/self/status gives kB)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def child(ref: str, threads: int) -> dict:
    """One load of `ref` in this process: seconds, memory and weight bytes. specq is imported
    here, timed, not at the top of the script."""
    import torch

    torch.set_num_threads(threads)
    started = time.perf_counter()
    import specq
    from specq.weights.quant.modules import FileBlocks

    imported, before = time.perf_counter() - started, memory()
    started = time.perf_counter()
    model = specq.load(ref)
    load_s = time.perf_counter() - started
    after = memory()
    blocks = [m for m in model.net.modules() if isinstance(m, FileBlocks)]
    packed = sum(m._blocks.nbytes() for m in blocks)
    by_kind: dict[str, dict] = {}  # the file's formats and the kernel form they run as
    for m in blocks:
        w = m._blocks
        form = (f"{w.bits}-bit codes, groups of {w.group_size}"
                f"{', offsets' if w.m is not None else ''}"
                f"{', two-level scales' if w.sub is not None else ''}")
        cell = by_kind.setdefault(f"{m.kind}: {form}", {"weights": 0, "bytes": 0})
        cell["weights"] += w.out_features * w.in_features
        cell["bytes"] += w.nbytes()
    size = Path(model.source).stat().st_size
    return {"ref": ref, "file_bytes": size, "import_s": imported, "load_s": load_s,
            "rss_after_import": before["VmRSS"], "rss": after["VmRSS"], "hwm": after["VmHWM"],
            "packed_weight_bytes": packed, "rss_per_file": after["VmRSS"] / size,
            "hwm_per_file": after["VmHWM"] / size, "weights_per_file": packed / size,
            "packed_by_kind": by_kind, "backend": model.info.get("backend"), "threads": threads}


def run_child(ref: str, threads: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", ref, "--threads", str(threads)],
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"loading {ref} failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", default=",".join(REFS),
                    help="model refs or GGUF files, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/results/load-time-memory.jsonl")
    # not specq.bench.tools.add_machine_option: a child times specq's import, so none before it
    ap.add_argument("--machine", default=platform.processor() or platform.machine(),
                    help="the kind of machine, kept in each row's `machine` (docs/results' rows: "
                         "epyc-zen4-avx512, xeon-avx512, epyc-avx2; default: the platform's name)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.threads)))
        return
    if args.rounds < 1 or args.threads < 1:
        sys.exit("--rounds and --threads must be at least 1")
    from specq.bench.tools.load_time import table
    from specq.kernels import build

    refs = [r.strip() for r in args.refs.split(",") if r.strip()]
    meta = {"machine": args.machine, "cpu": build.cpu_model(),
            "cpus": os.cpu_count()}
    rows = []
    for ref in refs:
        run_child(ref, args.threads)  # warm-up: page cache, kernels, tokenizer cache
        for i in range(args.rounds):
            row = {**run_child(ref, args.threads), "round": i,
                   "loadavg_1min": os.getloadavg()[0], **meta}
            rows.append(row)
            print(f"{ref} round {i}: load {row['load_s']:.2f} s, RSS {row['rss_per_file']:.2f}x, "
                  f"peak {row['hwm_per_file']:.2f}x, packed weights "
                  f"{row['weights_per_file']:.3f}x the file", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(table(rows))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
