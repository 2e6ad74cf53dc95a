"""Lookahead drafts per request in `specq serve`: lossless, refused in one 400 when malformed."""

import pytest
from test_serve import client, dirs, models, name, post, server  # noqa: F401 (fixtures)

import specq
from specq.serve.app import servable
from specq.serve.errors import APIError
from specq.serve.server import ServeConfig, build_app


def test_serve_takes_lookahead_drafts_per_request(server, dirs, models):  # noqa: F811
    port, _ = server
    want = specq.generate(models["fp32"], "t1 t2 t3 t1 t2 t3 t1", None, max_new_tokens=16).text
    for draft in ("lookahead", "lookahead:w=2:n=3:g=1"):
        out = client(port).completions.create(model=name(dirs), prompt="t1 t2 t3 t1 t2 t3 t1",
                                              max_tokens=16, temperature=0,
                                              extra_body={"draft": draft})
        assert out.choices[0].text == want, draft
        specq_extra = out.model_extra["specq"]
        assert specq_extra["draft"].startswith("lookahead:w=") and specq_extra["drafted"]
    for draft in ("lookahead:w=0", "lookahead+x"):
        status, reply, _ = post(port, "/v1/completions",
                                {"model": name(dirs), "prompt": "t1", "draft": draft})
        assert (status == 400 and reply["error"]["code"] == "invalid_value"
                and reply["error"]["param"] == "draft")


def test_lookahead_is_servable_without_a_model():
    assert servable("lookahead", set()) and servable("lookahead:g=0", set())
    with pytest.raises(APIError, match="w must be"):
        servable("lookahead:w=0", set())


def test_a_pool_and_a_server_with_lookahead_for_every_precision(dirs, models):  # noqa: F811
    """`specq serve --draft lookahead`: no model to load for it, the target's own output."""
    pool = specq.ModelPool(str(dirs / "target"), draft="lookahead")
    _, draft, note = pool.models("fp32")
    assert isinstance(draft, specq.LookaheadDraft) and note == "draft lookahead (given)"
    prompt = "t1 t2 t3 t1 t2 t3 t1"
    out = pool.generate(prompt, max_new_tokens=16)
    assert out.text == specq.generate(models["fp32"], prompt, None, max_new_tokens=16).text
    assert out.draft == "lookahead:w=4:n=3:g=3" and out.stats.drafted > 0
    build_app(ServeConfig(target=str(dirs / "target"), precisions=("fp32",), draft="lookahead"))
