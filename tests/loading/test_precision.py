"""Model refs with a quant spec: quantized once, cached, saved/loaded, still lossless."""

import pytest
import torch

import specq
from specq.cli import main
from specq.loading.formats.save import save_native

from conftest import perturbed, tiny_model


@pytest.fixture()
def tiny_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    model = tiny_model(vocab=64, hidden=64, scale=3.0)
    save_native(model, tmp_path / "tiny")
    return tmp_path / "tiny"


def test_quantized_ref_is_cached_and_matches_saved_dir(tiny_dir, tmp_path, capsys):
    ref = f"{tiny_dir}@int4-g32-rtn"
    first = specq.load(ref)
    assert first.precision == "int4-g32-rtn"
    cached = list((tmp_path / "cache" / "quantized").iterdir())
    assert len(cached) == 1 and (cached[0] / "quant_config.json").is_file()
    again = specq.load(ref)  # from the cache this time
    ids = torch.tensor([1, 5, 9, 2, 7])
    with torch.no_grad():
        torch.testing.assert_close(first.net(ids, None), again.net(ids, None))
    assert main(["quantize", str(tiny_dir), "int4-g32-rtn", "--out", str(tmp_path / "q")]) == 0
    saved = specq.load(str(tmp_path / "q"))
    assert saved.precision == "int4-g32-rtn"
    with torch.no_grad():
        torch.testing.assert_close(saved.net(ids, None), first.net(ids, None))


@pytest.mark.parametrize("spec", ["int8", "int4-g32-rtn", "int3-g32-rtn", "int2-g32-rtn", "bf16"])
def test_quantized_target_stays_lossless(tiny_dir, spec):
    target = specq.load(f"{tiny_dir}@{spec}")
    # noise on the weights, before any packing
    draft = perturbed(specq.load(str(tiny_dir), backend=None), 0.05)
    for prompt in ([1, 2, 3], [4, 4, 5, 6]):
        base = specq.generate(target, prompt, None, max_new_tokens=30)
        for gamma in (1, 4):
            assert (specq.generate(target, prompt, draft, gamma=gamma, max_new_tokens=30).token_ids
                    == base.token_ids)


@pytest.mark.parametrize("args,needle", [
    (["quantize", "{dir}", "int4-g32-zzz", "--out", "{tmp}/x"], "bad quant spec"),
    (["quantize", "{dir}", "bf16", "--out", "{tmp}/x"], "nothing to quantize"),
    (["quantize", "{dir}", "int4-g7-rtn", "--out", "{tmp}/x"], "group size"),
    (["generate", "t1", "--target", "{dir}@int9"], "bad quant spec"),
])
def test_bad_specs_one_line(tiny_dir, tmp_path, capsys, args, needle):
    code = main([a.format(dir=tiny_dir, tmp=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_a_spec_the_model_cannot_take_is_one_line_before_any_announcement(tiny_dir, capsys):
    """g7 divides no layer of the tiny model: the error comes before 'quantizing ... (once)'."""
    assert main(["generate", "t1", "--target", f"{tiny_dir}@int4-g7-rtn", "--no-speculative"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "group size" in err and "quantizing" not in err


def test_a_precision_that_is_not_a_string_is_one_error(tiny_dir):
    """`ModelPool.generate(..., precision=4)` (the API takes any object): a
    SpecqError, not a crash."""
    from specq.errors import SpecqError

    with pytest.raises(SpecqError, match="a precision is a string such as 'fp32'"):
        specq.ModelPool(str(tiny_dir)).generate("t1", precision=4)


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_damaged_quantization_cache_is_quantized_again(tiny_dir, tmp_path, capsys, damage):
    ref = f"{tiny_dir}@int8"
    first = specq.load(ref)
    cached = next((tmp_path / "cache" / "quantized").iterdir())
    weights = cached / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])
    else:
        weights.unlink()
    capsys.readouterr()
    again = specq.load(ref)
    err = capsys.readouterr().err
    assert f"ignoring a stale or damaged quantization cache (cannot load quantized model from " \
           f"'{cached}': model.safetensors" in err and "quantizing" in err
    ids = torch.tensor([1, 5, 9, 2, 7])
    with torch.no_grad():
        torch.testing.assert_close(first.net(ids, None), again.net(ids, None))
    specq.load(ref)
    assert capsys.readouterr().err == ""  # whole again


def test_a_damaged_qad_cache_is_one_line_naming_the_command(tiny_dir, tmp_path, capsys):
    """A `-qad` model cannot be quantized again on load: its damaged cache is one line that names
    the folder, what is wrong and the command that makes it again."""
    import shutil

    from specq.loading import precision
    from specq.paths import cache_dir

    specq.load(f"{tiny_dir}@int4-g32-rtn")
    made = next((tmp_path / "cache" / "quantized").iterdir())
    qad = precision.cached_quantized_dir(cache_dir(), str(tiny_dir), tiny_dir,
                                         precision.parse("int4-g32-rtn-qad"))
    shutil.copytree(made, qad)  # as `specq qad` would leave it (times kept: the stamp holds)
    assert specq.load(f"{tiny_dir}@int4-g32-rtn-qad").precision == "int4-g32-rtn-qad"
    (qad / "model.safetensors").write_bytes(b"")
    capsys.readouterr()
    assert main(["generate", "t1", "--target", f"{tiny_dir}@int4-g32-rtn-qad"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"is damaged (cannot load quantized model from '{qad}': " \
        "model.safetensors holds 0 bytes" in err and f"make it again with `specq qad {tiny_dir} " \
        "int4-g32-rtn`" in err


def test_calibrated_codes_record_how_they_were_calibrated(tiny_dir, tmp_path):
    """GPTQ's codes depend on the thread count that ordered its calibration's float sums, so the
    folder says it (with the windows); RTN's record no calibration."""
    import json

    specq.load(f"{tiny_dir}@int4-g32-rtn")
    assert main(["quantize", str(tiny_dir), "int4-g32-gptq", "--threads", "1", "--calib-samples",
                 "2", "--calib-len", "16", "--out", str(tmp_path / "q")]) == 0
    [rtn] = (tmp_path / "cache" / "quantized").iterdir()
    assert "provenance" not in json.loads((rtn / "quant_config.json").read_text())
    made = json.loads((tmp_path / "q" / "quant_config.json").read_text())["provenance"]
    assert made == {"calibration": {"windows": 2, "tokens": 16, "threads": 1}}
