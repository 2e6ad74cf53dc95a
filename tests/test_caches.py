"""The cache's integrity stamps (`caches`) and the sweep of interrupted writes (`atomic`, `paths`):
a damaged entry is told apart from a whole one, what a dead run left is removed and what a live
run is writing is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specq import atomic, caches, paths

SRC = Path(paths.__file__).parents[1]


@pytest.fixture()
def entry(tmp_path) -> Path:
    """A stamped cache folder: a tokenizer-like JSON file and a safetensors file."""
    folder = tmp_path / "entry"

    def write(tmp: Path) -> None:
        (tmp / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
        save_file({"w": torch.arange(64.0)}, tmp / "model.safetensors")

    caches.write_dir(folder, write)
    return folder


def randomise(path: Path, offset: int, n: int, keep_times: bool = False) -> None:
    """Change n bytes at offset in place (the size stays), optionally setting the times back."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(255 - b for b in old))
    if keep_times:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_whole_entry_passes_and_each_damage_is_named(entry):
    required = ("tokenizer.json", "model.safetensors")
    assert caches.damage(entry, required) is None
    tok, weights = entry / "tokenizer.json", entry / "model.safetensors"
    text = tok.read_bytes()

    tok.write_bytes(text[:10])
    assert "tokenizer.json holds 10 bytes" in caches.damage(entry, required)
    tok.write_text("{}")
    assert "tokenizer.json holds 2 bytes" in caches.damage(entry, required)
    tok.unlink()
    assert caches.damage(entry, required) == "tokenizer.json is missing"
    tok.write_bytes(text)  # the same bytes, written later
    os.utime(tok, ns=(time.time_ns(), tok.stat().st_mtime_ns + 1_000_000))
    assert caches.damage(entry, required) == "tokenizer.json was changed after specq wrote it"

    caches.stamp(entry)  # as written again
    randomise(weights, 100, 8, keep_times=True)  # a small file is sampled whole
    assert caches.damage(entry, required) == "model.safetensors's bytes differ from those written"
    assert caches.damage(entry.parent / "gone") == "missing"


def test_a_large_file_changed_through_the_file_system_is_caught(tmp_path):
    """The issue's case: bytes randomised inside a large file, away from the sampled blocks: the
    write moved its modification time. Only with the time set back (and outside the samples)
    does it pass, as the docs say."""
    path = tmp_path / "big.bin"
    caches.write_file(path, lambda f: f.write(b"\0" * (caches.BLOCK * caches.BLOCKS * 4)))
    between = caches.BLOCK * 3 // 2  # inside the gap after the first sampled block
    assert caches.damage(path) is None
    randomise(path, between, 4096)
    os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns + 1_000_000))
    assert caches.damage(path) == "big.bin was changed after specq wrote it"

    caches.stamp(path)
    randomise(path, between, 4096, keep_times=True)
    assert caches.damage(path) is None  # the documented limit of a sampled stamp
    randomise(path, 0, 4096, keep_times=True)  # the header is always sampled
    assert caches.damage(path) == "big.bin's bytes differ from those written"


def test_an_entry_without_a_stamp_is_checked_for_its_shape_and_adopted(entry):
    required = ("tokenizer.json", "model.safetensors")
    weights = entry / "model.safetensors"
    data = weights.read_bytes()
    caches.sidecar(entry).unlink()  # as an older version wrote it
    weights.write_bytes(data[:-16])
    assert "model.safetensors holds" in caches.damage(entry, required)
    weights.write_bytes(b"\xff" * 8 + data[8:])
    assert caches.damage(entry, required) == "model.safetensors is not a safetensors file"
    weights.write_bytes(data)
    (entry / "tokenizer.json").write_text("{}")
    assert caches.damage(entry, required) == "tokenizer.json holds no data"
    (entry / "tokenizer.json").write_text('{"model": ')
    assert caches.damage(entry, required) == "tokenizer.json cannot be read or parsed"
    (entry / "tokenizer.json").write_text('{"model": {}}')
    assert not caches.sidecar(entry).exists()
    assert caches.damage(entry, required) is None and caches.sidecar(entry).is_file()
    (entry / "tokenizer.json").write_text("{}")  # now stamped: a change is a change
    assert "tokenizer.json holds" in caches.damage(entry, required)


def test_usable_says_a_damaged_entry_is_rebuilt_in_one_line(entry, capsys):
    assert caches.usable(entry, ("tokenizer.json",))
    assert not caches.usable(entry.parent / "none")
    assert capsys.readouterr().err == ""  # a missing entry is simply built
    (entry / "tokenizer.json").write_text("{}")
    assert not caches.usable(entry, ("tokenizer.json",))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{entry} is damaged (tokenizer.json holds 2 bytes" in err


def dead_pid() -> int:
    """The id of a process that has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def temporary(folder: Path, name: str, pid: int, host: str = atomic.HOST, age: float = 0,
              directory: bool = False) -> Path:
    path = folder / f".{name}.specq-tmp-{host}-{pid}-abcd_123"
    if directory:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"x" * 1000)
    else:
        path.write_bytes(b"x" * 1000)
    if age:
        then = time.time() - age
        for p in [path, *path.glob("*")]:
            os.utime(p, (then, then))
    return path


def test_sweep_removes_only_the_temporaries_of_gone_processes(tmp_path, capsys):
    gone = [temporary(tmp_path, "model.gguf", dead_pid()),
            temporary(tmp_path, "q@int4", dead_pid(), directory=True),
            temporary(tmp_path, "x", os.getppid(), host="0badc0de", age=2 * atomic.FOREIGN_AGE)]
    kept = [temporary(tmp_path, "a", os.getpid()),  # this process's write in flight
            temporary(tmp_path, "b", os.getppid()),  # a running process's
            temporary(tmp_path, "c", dead_pid(), host="0badc0de"),  # another machine's, recent
            tmp_path / ".model.gguf.k2j3h4g5",  # an older version's: only with unowned_age
            tmp_path / ".hidden-user-file", tmp_path / "model.gguf"]
    for p in kept[3:]:
        p.write_text("keep")
        os.utime(p, (0, 0))
    assert atomic.sweep(tmp_path) == 3000
    assert [p for p in gone if p.exists()] == [] and all(p.exists() for p in kept)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"interrupted run left in {tmp_path}" in err
    assert atomic.sweep(tmp_path, unowned_age=3600) == 4
    assert not kept[3].exists() and all(p.exists() for p in kept[:3] + kept[4:])


def test_an_interrupted_write_is_removed_by_the_next_run(tmp_path):
    """A process killed while writing into the cache leaves its temporary file; the next process
    that uses the cache removes it, once (a later write would also sweep its own folder)."""
    cache = tmp_path / "cache"
    killed = ("import os; from pathlib import Path; from specq import atomic\n"
              "def write(f):\n    f.write(b'x' * 100_000); f.flush(); os._exit(9)\n"
              f"atomic.write_file(Path({str(cache / 'files' / 'model.gguf')!r}), write)\n")
    env = {**os.environ, "PYTHONPATH": str(SRC), "SPECQ_CACHE": str(cache)}
    assert subprocess.run([sys.executable, "-c", killed], env=env).returncode == 9
    left = list((cache / "files").iterdir())
    assert len(left) == 1 and left[0].name.startswith(".model.gguf.specq-tmp-")
    # an older version's, unnamed: removed from the folders specq writes, after an hour untouched
    (cache / "inductor").mkdir()
    older = [cache / "files" / ".model.gguf.k2j3h4g5", cache / "inductor" / ".lock.k2j3h4g5"]
    for p in older:
        p.write_bytes(b"x" * 100_000)
        os.utime(p, (time.time() - 2 * paths.UNOWNED_AGE,) * 2)
    swept = subprocess.run([sys.executable, "-c", "from specq import paths; paths.cache_dir()"],
                           env=env, capture_output=True, text=True)
    assert swept.returncode == 0 and "removed 0.2 MiB of temporary files" in swept.stderr
    assert list((cache / "files").iterdir()) == [] and older[1].exists()
