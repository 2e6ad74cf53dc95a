"""N-gram drafts per request in `specq serve`: lossless, refused in one 400 when malformed; the
suffix cache of each API key."""

import pytest
from test_serve import KEY, OTHER_KEY
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


# tokens with no pair twice: a second request drafts from the first's text or not at all
FRESH = "t5 t9 t14 t2 t21 t7 t30 t11"


def _accepted(port: int, served: str, key: str, text: str) -> int:
    out = client(port, key).completions.create(model=served, prompt=FRESH, max_tokens=24,
                                               temperature=0,
                                               extra_body={"draft": "ngram", "gamma": 2})
    assert out.choices[0].text == text
    return out.model_extra["specq"]["accepted"]


def test_each_api_key_drafts_from_its_own_earlier_requests(server, dirs, models):  # noqa: F811
    """A request that repeats an earlier one of its API key drafts from it (far more tokens
    accepted); under another key the same request starts from nothing: as many accepted as
    without any cache. The output is the target's own every time."""
    port, app = server
    want = specq.generate(models["fp32"], FRESH, None, max_new_tokens=24).text
    alone = specq.generate(models["fp32"], FRESH, "ngram", gamma=2, max_new_tokens=24)
    alone = alone.stats.accepted
    served = name(dirs)
    first = _accepted(port, served, KEY, want)
    assert _accepted(port, served, KEY, want) >= first + 10
    assert _accepted(port, served, OTHER_KEY, want) == alone  # KEY's text is not OTHER_KEY's
    assert _accepted(port, served, OTHER_KEY, want) >= alone + 10
    pool = app.state.engines[name(dirs)].pool
    assert pool.suffix_cache("fp32", KEY) is not pool.suffix_cache("fp32", OTHER_KEY)


def test_a_seeded_sampled_request_repeats_its_output_beside_the_cache(server, dirs):  # noqa: F811
    """A sampled request with its own seed drafts from its own text only, so the same request
    gives the same text again, though the first one's text is in the cache by then."""
    port, _ = server
    texts = {client(port, OTHER_KEY).completions.create(
        model=name(dirs), prompt="t3 t8 t1 t19 t4", max_tokens=24, temperature=0.9, seed=3,
        extra_body={"draft": "ngram"}).choices[0].text for _ in range(3)}
    assert len(texts) == 1
