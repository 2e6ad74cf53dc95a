"""The suffix cache: earlier runs' text where n-gram drafts also look. Its lookups against a
brute-force reference (eviction included), its memory bound, the drafter's order (the current
text first), and lossless decoding with it, greedy and sampled."""

import random

import pytest
import torch

import specq
from specq.core.sampling import SamplingConfig
from specq.drafters import NgramDraft, NgramDrafter
from specq.drafters import suffix as suffix_module
from specq.drafters.suffix import GRAM, MAX_CHAIN, SuffixCache
from specq.errors import SpecqError
from specq.loading.kinds import for_pair

from conftest import _exact_sequence_distribution, chi_square_p, perturbed, tiny_model


pytestmark = pytest.mark.usefixtures("one_thread")


def _cache(*texts: list[int], max_tokens: int = 1000) -> SuffixCache:
    cache = SuffixCache(max_tokens)
    for text in texts:
        cache.add(text)
    return cache


# ---------------------------------------------------------------------------------- lookups


def test_the_continuation_of_an_earlier_text():
    cache = _cache([1, 2, 3, 4, 5, 6])
    assert cache.continuation([9, 2, 3], 2, 3) == [4, 5, 6]
    assert cache.continuation([9, 2, 3], 2, 2) == [4, 5]
    assert cache.continuation([9, 4, 5], 2, 4) == [6]  # a text's end ends the continuation
    assert cache.continuation([9, 5, 6], 2, 4) == []  # nothing followed
    assert cache.continuation([9, 3, 2], 2, 4) == []  # no such pair


def test_the_longest_then_the_newest_match_wins():
    cache = _cache([7, 1, 2, 10], [8, 1, 2, 11], [5, 1, 2, 12])
    assert cache.continuation([7, 1, 2], 2, 1) == [10]  # three tokens beat two
    assert cache.continuation([6, 1, 2], 2, 1) == [12]  # two each: the newest
    assert cache.continuation([7, 1, 2], 3, 1) == [10] and cache.continuation([6, 1, 2], 3, 1) == []


def test_no_match_crosses_from_one_text_into_the_next():
    cache = _cache([1, 2], [3, 4, 5], [6, 7, 8])
    assert cache.continuation([2, 3, 4], 3, 2) == []  # (2, 3) never occurred: 2 ended a text
    assert cache.continuation([5, 6], 2, 3) == []
    assert cache.continuation([3, 4], 2, 3) == [5]


def test_matches_shorter_than_a_pair_are_not_served():
    cache = _cache([1, 2, 3])
    assert cache.continuation([2], 1, 2) == []
    assert cache.continuation([1, 2], 1, 2) == [3]


def _reference(texts: list[list[int]], tail: list[int], n_min: int, k: int) -> list[int]:
    """What `continuation` promises, by brute force over the texts still held."""
    shortest = max(n_min, GRAM)
    if len(tail) < shortest:
        return []
    seen = [(t, i) for t in reversed(texts) for i in range(len(t) - 1, GRAM - 1, -1)
            if t[i - 2:i] == tail[-2:]][:MAX_CHAIN]  # newest first
    best, longest = None, shortest - 1
    for text, i in seen:
        n = GRAM
        while n < len(tail) and i - n > 0 and text[i - n - 1] == tail[-n - 1]:
            n += 1
        if n > longest:
            best, longest = (text, i), n
    return [] if best is None else best[0][best[1]:best[1] + k]


def test_lookups_match_a_brute_force_reference_as_texts_are_evicted():
    """Random texts over a small vocabulary (pairs recur, chains grow long) through a small cache:
    every lookup equals the brute force over exactly the texts that fit, and the index holds one
    head per distinct pair of them, however many texts came and went."""
    rng = random.Random(0)
    cache, budget, held = SuffixCache(120), 120, []
    for _ in range(200):
        text = [rng.randrange(5) for _ in range(rng.randrange(1, 50))]
        cache.add(text)
        if len(text) > GRAM:
            held.append(text)
        while sum(len(t) + 1 for t in held) > budget:
            held.pop(0)
        assert len(cache) == sum(len(t) + 1 for t in held) <= budget
        for _ in range(5):
            tail = [rng.randrange(5) for _ in range(rng.randrange(1, 6))]
            n_min = rng.randrange(1, 4)
            assert cache.continuation(tail, n_min, 4) == _reference(held, tail, n_min, 4)
        pairs = {tuple(t[i - 2:i]) for t in held for i in range(GRAM, len(t))}
        assert len(cache._head) == len(pairs)


def test_an_evicted_text_is_never_proposed():
    cache = _cache([1, 2, 3, 4], max_tokens=10)
    assert cache.continuation([1, 2], 2, 2) == [3, 4]
    cache.add([5, 6, 7, 8])  # 5 + 5 slots: both fit
    assert cache.continuation([1, 2], 2, 2) == [3, 4]
    cache.add([9, 1, 2, 7])  # the first goes; (1, 2) now leads to 7 only
    assert cache.continuation([1, 2], 2, 2) == [7]
    cache.add([20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30])  # longer than the cache: its end
    assert len(cache) == 10 and cache.continuation([1, 2], 2, 2) == []
    assert cache.continuation([24, 25], 2, 2) == [26, 27]
    assert cache.continuation([21, 22], 2, 2) == []  # cut off with its start


def test_a_bad_size_is_one_error():
    with pytest.raises(SpecqError, match="between 4 and"):
        SuffixCache(3)
    with pytest.raises(SpecqError, match="suffix_cache must be a specq.SuffixCache"):
        specq.generate(tiny_model(), [1, 2], "ngram", suffix_cache={})


# ---------------------------------------------------------------------------------- the drafter


def test_the_drafter_looks_in_the_text_first_then_in_the_cache():
    sampling, g = SamplingConfig(), torch.Generator()
    drafter = NgramDrafter(NgramDraft(k=3), _cache([8, 1, 2, 30, 31, 32, 33], [4, 5, 40, 41]))
    drafter.start(torch.tensor([1, 2, 3, 9, 4, 5]), 64, None)
    # (4, 5): no earlier match in the text, the cache's
    assert drafter.route_after([1, 2, 3, 9, 4, 5]) == "lookup"
    assert drafter.propose([1, 2, 3, 9, 4, 5], 4, sampling, g).tokens.tolist() == [40, 41]
    # (1, 2): the text's own match wins over the cache's
    seq = [1, 2, 3, 9, 4, 5, 1, 2]
    assert drafter.propose(seq, 4, sampling, g).tokens.tolist() == [3, 9, 4]
    # (7, 6): neither
    assert drafter.route_after(seq + [7, 6]) is None
    assert drafter.propose(seq + [7, 6], 4, sampling, g).tokens.numel() == 0
    # n=1 reads no cache (one token is no evidence across texts); k caps it
    alone = NgramDrafter(NgramDraft(1, 1, 1), _cache([4, 5, 40, 41]))
    alone.start(torch.tensor([4, 5]), 64, None)
    assert alone.propose([4, 5], 4, sampling, g).tokens.numel() == 0
    capped = NgramDrafter(NgramDraft(k=1), _cache([4, 5, 40, 41]))
    capped.start(torch.tensor([4, 5]), 64, None)
    assert capped.propose([4, 5], 4, sampling, g).tokens.tolist() == [40]


def _counting(cache: SuffixCache) -> list[int]:
    """Counts [lookups, lookups that proposed tokens] of `cache`."""
    counts, real = [0, 0], cache.continuation

    def continuation(*args):
        out = real(*args)
        counts[0] += 1
        counts[1] += bool(out)
        return out
    cache.continuation = continuation
    return counts


# prompts with no pair twice: whatever matches before the output repeats itself is the cache's
FRESH = [5, 9, 14, 2, 21, 7, 30, 11]


@pytest.mark.parametrize("fallback", [False, True], ids=["ngram", "ngram+MODEL"])
def test_a_repeated_request_drafts_from_the_cache_and_stays_the_target_own(fallback):
    """Requests in a row share one cache: each output is the target's own; a request that repeats
    an earlier one drafts from the cache and gets those tokens accepted (many more than without
    the cache); and some proposal is rejected along the way (both paths ran)."""
    target = tiny_model(scale=3.0, seed=4)
    draft = NgramDraft(fallback=perturbed(target, 0.3, seed=2)) if fallback else NgramDraft()
    cache = SuffixCache()
    counts = _counting(cache)
    rejected = 0
    for i, prompt in enumerate([FRESH, [17, 9, 14, 2, 21, 8], FRESH]):
        base = specq.generate(target, prompt, max_new_tokens=40)
        alone = specq.generate(target, prompt, draft, gamma=2, max_new_tokens=40)
        before = list(counts)
        out = specq.generate(target, prompt, draft, gamma=2, max_new_tokens=40, suffix_cache=cache)
        assert out.token_ids == alone.token_ids == base.token_ids
        rejected += out.stats.drafted - out.stats.accepted
        if i == 2:  # the repeat: the cache proposed, and what it proposed was accepted
            assert counts[1] > before[1]
            assert out.stats.accepted >= alone.stats.accepted + 20
    assert rejected > 0
    assert len(cache) == 3 * 40 + len(FRESH) * 2 + 6 + 3  # every run's prompt, output and end


def test_a_ready_drafter_keeps_its_own_cache_and_the_run_still_feeds():
    target = tiny_model(scale=3.0, seed=4)
    cache = SuffixCache()
    drafter = for_pair(NgramDraft(), target, 0.0, None, 2)
    specq.generate(target, FRESH, "ngram", drafter=drafter, max_new_tokens=8, suffix_cache=cache)
    assert drafter.earlier is None and len(cache) == len(FRESH) + 8 + 1


NEW = 4


def test_sampling_with_the_cache_follows_the_target():
    """Seeded runs sharing one cache, each feeding it (so each later run's proposals depend on
    earlier outputs), vs the target's exact joint distribution of the first NEW tokens. The
    prompt has no pair twice, so the first steps draft from the cache or not at all."""
    prompt = [1, 2, 3, 4]
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    exact = _exact_sequence_distribution(target, prompt, NEW, SamplingConfig(temperature=1.0))
    cache = _cache([3, 4, 0, 1, 1, 2, 0, 3])
    proposed = _counting(cache)
    runs, counts, accepted, rejected = 2000, {}, 0, 0
    for seed in range(runs):
        out = specq.generate(target, prompt, NgramDraft(2, 2, 2), max_new_tokens=NEW,
                             temperature=1.0, seed=seed, suffix_cache=cache)
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        accepted += out.stats.accepted
        rejected += out.stats.drafted - out.stats.accepted
    assert proposed[1] > runs // 2 and accepted > runs // 10 and rejected > runs // 10
    assert chi_square_p(dict.fromkeys(exact, 0) | counts, exact, runs) > 0.001


def test_the_lookup_walks_a_bounded_chain(monkeypatch):
    """However often a pair occurred, a lookup compares at most MAX_CHAIN of its occurrences."""
    cache = _cache(*[[1, 2, i] for i in range(3, 200)], max_tokens=10_000)
    compared = []
    real = suffix_module.array

    class Spy(real):  # counts the buffer's reads of matched positions' tokens
        def __getitem__(self, i):
            compared.append(i)
            return super().__getitem__(i)

    spied = Spy("q", cache._tokens)
    monkeypatch.setattr(cache, "_tokens", spied)
    assert cache.continuation([0, 1, 2], 2, 1) == [199]  # the newest of the two-token matches
    assert 0 < len(compared) <= MAX_CHAIN + 1


def test_a_pool_keeps_one_cache_per_precision_and_key(tmp_path, monkeypatch):
    """`ModelPool.generate` drafts from and feeds its key's cache at that precision only; a pool
    with suffix_tokens 0 keeps none."""
    from specq.loading.formats.save import save_native

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    save_native(tiny_model(scale=3.0, seed=4), tmp_path / "tiny")
    pool = specq.ModelPool(str(tmp_path / "tiny"), draft="ngram")
    mine = pool.suffix_cache("fp32", "me")
    assert pool.suffix_cache("fp32", "me") is mine
    others = [pool.suffix_cache("fp32"), pool.suffix_cache("bf16", "me")]
    pool.generate(FRESH, key="me", max_new_tokens=8)
    assert len(mine) == len(FRESH) + 8 + 1 and all(len(c) == 0 for c in others)
    assert specq.ModelPool(str(tmp_path / "tiny"), suffix_tokens=0).suffix_cache() is None
    with pytest.raises(SpecqError, match="0 .no suffix cache. or at least 4"):
        specq.ModelPool(str(tmp_path / "tiny"), suffix_tokens=2)
