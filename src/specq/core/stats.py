"""Per-run counters and the metrics derived from them (names as in vLLM / EAGLE / Spec-Bench).

- acceptance rate: accepted draft tokens / drafted tokens (a token tree's every node is drafted)
- tau, mean accepted length: tokens emitted per target verify pass, *bonus token included*
  (1.0 for plain decoding)
- per-position acceptance, unconditional U_i = P(accepted length >= i) and conditional
  a_i = P(token i accepted | tokens 1..i-1 accepted), both over the steps that drafted at least
  i tokens: proposals cut short (by the token budget or the draft's confidence stop) do not count
  at the positions they never drafted, so on few steps U_i need not fall monotonically
- draft cost share: draft time / decode time (prefill is timed separately)
- per route (`routes`): steps, drafted and accepted tokens of each drafter of a drafter made of
  several (`ngram+MODEL`: "lookup", "model"), "draft" for a single drafter, "plain" for the steps
  that drafted nothing
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DecodeStats:
    gamma: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    steps: int = 0  # target forward passes after prefill
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens produced by verify passes (accepted + one per pass), before stops
    drafted_at: list[int] = field(default_factory=list)  # per draft position i = 1..gamma
    reached_at: list[int] = field(default_factory=list)  # positions 1..i-1 were all accepted
    accepted_at: list[int] = field(default_factory=list)
    routes: dict[str, dict[str, int]] = field(default_factory=dict)  # route -> steps, drafted, ...

    def __post_init__(self):
        for name in ("drafted_at", "reached_at", "accepted_at"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.gamma)

    def record_step(self, drafted: int, accepted: int, depth: int | None = None,
                    route: str = "draft") -> None:
        """One verify pass: `drafted` nodes (a chain's tokens), `depth` levels deep (a chain's depth
        is its length), `accepted` of them on the accepted path, proposed by `route` (a step that
        drafted nothing counts as "plain"). Per-position counters are per depth: a tree's level d
        counts once, however many nodes it holds."""
        counts = self.routes.setdefault(route if drafted else "plain",
                                        {"steps": 0, "drafted": 0, "accepted": 0})
        counts["steps"] += 1
        counts["drafted"] += drafted
        counts["accepted"] += accepted
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += accepted + 1
        for i in range(drafted if depth is None else depth):
            self.drafted_at[i] += 1
            if i <= accepted:
                self.reached_at[i] += 1
            if i < accepted:
                self.accepted_at[i] += 1

    @property
    def other_s(self) -> float:
        return max(0.0, self.decode_s - self.draft_s - self.verify_s)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        """Mean accepted length, bonus token included."""
        return self.emitted / self.steps if self.steps else None

    @property
    def per_position_unconditional(self) -> list[float | None]:
        return [a / d if d else None for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def per_position_conditional(self) -> list[float | None]:
        return [a / r if r else None for a, r in zip(self.accepted_at, self.reached_at)]

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tokens_per_s(self) -> float | None:
        """End-to-end: new tokens / (prefill + decode) time."""
        return self.new_tokens / self.total_s if self.total_s > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Decode phase only: tokens after the first / decode time."""
        return ((self.new_tokens - 1) / self.decode_s
                if self.decode_s > 0 and self.new_tokens > 1 else None)

    @property
    def draft_share(self) -> float | None:
        return self.draft_s / self.decode_s if self.decode_s > 0 else None

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("other_s", "acceptance_rate", "tau", "per_position_unconditional",
                     "per_position_conditional", "tokens_per_s", "decode_tokens_per_s",
                     "draft_share"):
            d[name] = getattr(self, name)
        return d


def bootstrap_ci(values, confidence: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): percentile bootstrap CI of the mean over independent units (prompts,
    text chunks), never over correlated tokens of one sequence. Fewer than 2 values: no spread."""
    import numpy as np
    from scipy.stats import bootstrap

    data = np.asarray([v for v in values if v is not None], dtype=float)
    if data.size == 0:
        return (float("nan"),) * 3
    mean = float(data.mean())
    if data.size < 2 or np.all(data == data[0]):
        return mean, mean, mean
    res = bootstrap((data,), np.mean, n_resamples=resamples, confidence_level=confidence,
                    method="percentile", rng=np.random.default_rng(seed))
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)
