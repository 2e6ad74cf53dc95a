"""kernels/build: the kernel variant is the best this CPU runs (or the one SPECQ_KERNELS forces),
chosen once per process; an unknown variant, or one this CPU cannot run, is refused in one line."""

from __future__ import annotations

import pytest

from specq.cli import main
from specq.errors import SpecqError
from specq.kernels import build

AVX2 = {"sse4_2", "avx", "avx2", "fma", "f16c"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}


@pytest.mark.parametrize("flags,best", [
    (AVX2, "avx2"),
    (AVX2 | {"avx_vnni"}, "avxvnni"),
    (AVX512, "avx512"),
    (AVX512 | {"avx_vnni"}, "avx512"),
    (AVX512 | {"avx512_vnni"}, "avx512vnni"),
    (AVX2 - {"fma"}, "torch"),  # every flag of a variant, or not that variant
    ({"sse4_2", "avx"}, "torch"),
])
def test_the_dispatch_picks_the_best_variant_the_cpu_runs(flags, best, force_kernels, monkeypatch):
    force_kernels("")  # unset: choose
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset(flags))
    built = []
    monkeypatch.setattr(build, "_load", built.append)  # nothing compiles
    assert build.variant() == best and build.available() == (best != "torch")
    assert build.variant() == best and built == ([] if best == "torch" else [best])  # chosen once


def test_a_variant_that_does_not_compile_gives_way_to_the_next(force_kernels, monkeypatch, capsys):
    force_kernels("")
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset(AVX512 | {"avx512_vnni"}))

    def load(name):
        if name == "avx512vnni":
            raise build.KernelUnavailable("compiling specq's avx512vnni kernels failed: unknown "
                                          "-mavx512vnni")

    monkeypatch.setattr(build, "_load", load)
    assert build.variant() == "avx512"
    assert capsys.readouterr().err == ("specq: compiling specq's avx512vnni kernels failed: "
                                       "unknown -mavx512vnni; not using the avx512vnni kernels\n")


def test_on_this_cpu_the_best_variant_runs(force_kernels):
    force_kernels("")
    if not build.runnable():
        pytest.skip("this CPU runs no kernel variant")
    assert build.variant() == build.runnable()[-1] and build.available()


def test_a_forced_variant_runs_and_a_bad_one_is_refused(force_kernels, monkeypatch):
    names = build.runnable()
    for name in names:  # every one this CPU runs, each its own shared object
        force_kernels(name)
        assert build.variant() == name
    assert len({build.load(name)._name for name in names}) == len(names)
    force_kernels("torch")
    assert build.variant() == "torch" and not build.available()
    with pytest.raises(build.KernelUnavailable, match="kernels are off"):
        build.load()
    force_kernels("avx9")
    with pytest.raises(SpecqError, match=r"^SPECQ_KERNELS=avx9: unknown kernel variant \(choose "
                                         r"from torch, avx2, "):
        build.variant()
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset(AVX2))
    force_kernels("avx512vnni")
    with pytest.raises(SpecqError,
                       match=r"^SPECQ_KERNELS=avx512vnni: this CPU lacks avx512_vnni, avx512bw, "
                             r"avx512dq, avx512f, avx512vl \(it runs torch, avx2\)$"):
        build.variant()


def test_the_cli_refuses_a_bad_variant_before_loading_a_model(force_kernels, capsys, tmp_path):
    force_kernels("avx2-please")
    code = main(["generate", "hello", "--target", str(tmp_path / "no-such-model")])
    err = capsys.readouterr().err
    assert (code == 2 and err.count("\n") == 1
            and err.startswith("specq: error: SPECQ_KERNELS=avx2-please: unknown"))


def test_the_cpu_model_and_flags_come_from_cpuinfo(tmp_path, monkeypatch):
    """Fields are matched by name, not by prefix ("flags" is not "vmx flags"), and an unreadable
    /proc/cpuinfo gives no model and no flags (torch's ops then serve)."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvmx flags\t: ept\nmodel name\t: Some CPU @ 2.0GHz\nflags\t\t: "
                    "fpu avx2 fma\n")
    real = build.Path
    monkeypatch.setattr(build, "Path", lambda p: info if p == "/proc/cpuinfo" else real(p))
    assert build._cpuinfo("model name") == "Some CPU @ 2.0GHz"
    assert build._cpuinfo("flags") == "fpu avx2 fma"
    info.unlink()
    assert build._cpuinfo("model name") is None and build._cpuinfo("flags") is None
