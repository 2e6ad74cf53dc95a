"""`specq serve`'s start-up errors: one line on stderr and exit 2, before uvicorn runs and before
the URL is printed, whichever check finds them (the refs, the port, the loaded models, the
warm-up). uvicorn is replaced by a recorder, so nothing listens."""

from __future__ import annotations

import socket

import pytest
import uvicorn

from specq.cli import main
from specq.loading import models
from specq.loading.formats.save import save_native
from specq.serve import engine as engine_module
from specq.serve.server import ServeConfig

from conftest import GGUF_TOKENS, add_bpe_tokenizer, tiny_model, tiny_tokenizer, write_tiny_gguf


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-start")
    target = tiny_model(scale=3.0)
    save_native(target, root / "target")
    foreign = tiny_model(seed=4)
    foreign.tokenizer = tiny_tokenizer(32, prefix="u")
    save_native(foreign, root / "foreign")  # a folder: its tokenizer.json tells it apart
    # a file beside a folder: told apart at load
    vocab = len(GGUF_TOKENS)
    write_tiny_gguf(root / "foreign.gguf", tiny_model(vocab=vocab), extra=add_bpe_tokenizer)
    write_tiny_gguf(root / "target.gguf", tiny_model(vocab=vocab, layers=3, scale=3.0),
                    extra=add_bpe_tokenizer)
    return root


@pytest.fixture
def uvicorn_runs(monkeypatch):
    """The uvicorn servers run (none listens), and what was loaded meanwhile."""
    runs = []

    class Recorder:
        def __init__(self, config):
            self.config = config

        def run(self, sockets):
            runs.append((self.config.app, sockets))

    monkeypatch.setattr(uvicorn, "Server", Recorder)
    return runs


@pytest.fixture
def no_loads(monkeypatch):
    """Any model load fails the test: what the refs show must be refused before one."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a model loaded: {args}")

    monkeypatch.setattr(models, "_load", refuse)


def _refused(args, capsys, needle, runs):
    code = main(["serve", *map(str, args), "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert "http://" not in err and not runs


@pytest.mark.parametrize("args,needle", [
    (["--draft", "{root}/foreign"], "different vocabularies"),
    (["--draft", "no-such-draft"], "unknown model 'no-such-draft'"),
    (["--draft", "{root}/missing.gguf"], "GGUF file not found"),
    (["--target", "{root}/missing.gguf"], "GGUF file not found"),
    (["--target", "{root}/missing"], "unknown model"),
    (["--draft", "ngram:k=0"], "k"),
    (["--precisions", "fp32,int9"], "bad quant spec 'int9'"),
    (["--target", "{root}/target.gguf", "--precisions", "gguf-keep2"], "a draft, not a target"),
    (["--target", "{root}/target.gguf", "--precisions", "gguf-head1k"], "a draft, not a target"),
])
def test_what_the_refs_show_is_one_line_before_any_model_loads(dirs, args, needle, capsys,
                                                                uvicorn_runs, no_loads):
    args = [a.format(root=dirs) for a in args]
    _refused(["--target", dirs / "target", *args], capsys, needle, uvicorn_runs)


def test_a_port_in_use_is_one_line_before_any_model_loads(dirs, capsys, uvicorn_runs, no_loads):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        code = main(["serve", "--target", str(dirs / "target"), "--port",
                     str(held.getsockname()[1])])
    err = capsys.readouterr().err
    assert code == 2 and "cannot listen" in err and err.count("\n") == 1 and not uvicorn_runs


@pytest.mark.parametrize("args,needle", [
    # a file's tokenizer beside a folder's is compared on the loaded models
    (["--draft", "{root}/foreign.gguf"], "different vocabularies"),
    # a precision only the load can refuse
    (["--precisions", "gguf"], "not a .gguf file"),
])
def test_what_the_loaded_models_show_is_one_line_before_uvicorn_runs(dirs, args, needle, capsys,
                                                                     uvicorn_runs):
    args = [a.format(root=dirs) for a in args]
    _refused(["--target", dirs / "target", *args], capsys, needle, uvicorn_runs)


def test_a_failed_warm_up_is_one_line_before_uvicorn_runs(dirs, capsys, uvicorn_runs,
                                                          monkeypatch):
    from specq.errors import SpecqError

    def fail(*args, **kwargs):
        raise SpecqError("the warm-up failed")

    monkeypatch.setattr(engine_module.api, "start", fail)
    _refused(["--target", dirs / "target"], capsys, "the warm-up failed", uvicorn_runs)


def test_a_good_start_warms_the_engines_then_runs_uvicorn_once(dirs, capsys, uvicorn_runs):
    assert main(["serve", "--target", str(dirs / "target"), "--port", "0"]) == 0
    (app, sockets), = uvicorn_runs
    assert app.state.started and all(e.thread.is_alive() for e in app.state.engines.values())
    assert "http://127.0.0.1:" in capsys.readouterr().err
    for engine in app.state.engines.values():
        engine.stop()
    sockets[0].close()


def test_a_gguf_target_is_served_at_its_own_precision_as_generate_runs_it(dirs):
    """One default precision for a target everywhere: the ref's own (`refs.default_precision`)."""
    from specq.bench.config import BenchConfig
    from specq.loading.refs import model_ref
    from specq.serve.pool import ModelPool

    gguf, folder = str(dirs / "target.gguf"), str(dirs / "target")
    assert ServeConfig(target=gguf).precisions == ("gguf",) == (model_ref(gguf).spec,)
    assert ServeConfig(target=folder).precisions == ("fp32",)
    assert BenchConfig(targets=[gguf, folder]).target_refs() == [f"{gguf}@gguf", f"{folder}@fp32"]
    pool = ModelPool(gguf)
    assert pool.spec() == "gguf" and pool.target_model().ref == f"{gguf}@gguf"
    assert ModelPool(folder).spec() == "fp32"
