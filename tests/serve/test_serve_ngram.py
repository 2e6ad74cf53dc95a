"""N-gram drafts per request in `specq serve`: lossless, refused in one 400 when malformed."""

import pytest
from test_serve import client, dirs, models, name, post, server  # noqa: F401 (fixtures)

import specq
from specq.loading.refs import draft_ref
from specq.serve.app import servable
from specq.serve.errors import APIError


def test_serve_takes_ngram_drafts_per_request(server, dirs, models):  # noqa: F811
    port, _ = server
    want = specq.generate(models["fp32"], "t1 t2 t3 t1 t2 t3 t1", None, max_new_tokens=16).text
    for draft in ("ngram", "ngram:n=1-3:k=5", f"ngram+{dirs / 'draft'}"):
        out = client(port).completions.create(model=name(dirs), prompt="t1 t2 t3 t1 t2 t3 t1",
                                              max_tokens=16, temperature=0,
                                              extra_body={"draft": draft})
        assert out.choices[0].text == want, draft
        specq_extra = out.model_extra["specq"]
        assert specq_extra["draft"] == draft_ref(draft).for_target("").text
        assert specq_extra["drafted"]
    for draft, code in (("ngram:k=0", "invalid_value"), ("ngram+/etc", "draft_not_found")):
        status, reply, _ = post(port, "/v1/completions",
                                {"model": name(dirs), "prompt": "t1", "draft": draft})
        assert (status == 400 and code == reply["error"]["code"]
                and reply["error"]["param"] == "draft")


def test_servable_drafts():
    assert (servable("ngram", set()) and servable("ngram:k=2+a", {"a"})
            and not servable("ngram+b", {"a"}))
    assert servable("a", {"a"}) and not servable("ngram,a", {"a"})
    with pytest.raises(APIError, match="k must be"):
        servable("ngram:k=0", set())
