"""Lookahead drafts per request in `specq serve`: lossless, refused in one 400 when malformed."""

import pytest
from test_serve import client, dirs, models, name, post, server  # noqa: F401 (fixtures)

import specq
from specq.serve.app import servable
from specq.serve.errors import APIError


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
