"""`specq serve`: load the target at each precision with its draft, bind, and run uvicorn.

What the refs show is checked first (`ServeConfig`: names, paths, file headers), then the socket is
bound, so a port in use is one error line at once, not after a minute of loading; then the models
load and the engines warm up (`build_app`, `run`), all before the server listens and prints its
URL: bad input is one line, never a failure inside uvicorn's start-up.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass

from fastapi import FastAPI

from .. import checks
from ..drafters.ngram import draft_models
from ..drafters.suffix import DEFAULT_TOKENS, check_tokens
from ..errors import SpecqError
from ..loading.drafts.select import known_drafts
from ..loading.precision import canonical
from ..loading.refs import check_ref, draft_ref, model_ref
from ..loading.vocab import check_compatible, check_names, check_target_ref
from .app import create_app
from .engine import Engine
from .metrics import Metrics
from .pool import ModelPool

# On this project's 2-core CPU a batch of two fp32 requests still gained from speculating, while at
# four and more requests plain steps gave more tokens/s on both measured targets (docs/serve.md at
# 4a89039, "Speculation under load").
SPEC_MAX_BATCH = 2


@dataclass(frozen=True)
class ServeConfig:
    target: str = "smollm2-135m"
    # None: the target's own, as `specq generate` runs it (`refs.default_precision`)
    precisions: tuple[str, ...] | None = None
    draft: str | None = None  # one draft for every precision (None: the registry's per precision)
    api_keys: tuple[str, ...] = ()  # one is required (none: open); each its own suffix cache
    queue: int = 16  # requests waiting per served model, beyond the running ones
    timeout_s: float = 600.0  # arrival to last token
    max_batch: int = 16  # requests decoded together per served model (1: one at a time)
    # speculate only in steps of at most this many requests, larger steps decode plainly (None:
    # always); the default follows docs/performance.md, "The server under load"
    spec_max_batch: int | None = SPEC_MAX_BATCH
    # tokens of earlier requests kept per served model and API key for n-gram drafts (0: none)
    suffix_tokens: int = DEFAULT_TOKENS

    def __post_init__(self):
        given = (model_ref(self.target).spec,) if self.precisions is None else self.precisions
        specs = [canonical(p) for p in given]
        if not specs:
            raise SpecqError("give at least one precision to serve")
        if len(set(specs)) != len(specs):
            raise SpecqError(f"a precision is listed twice: {', '.join(given)}")
        # a typo, a broken folder or a draft of another tokenizer fails before the socket is bound
        # and a model loads
        drafts = draft_ref(self.draft).for_target(self.target).models if self.draft else []
        for ref in [self.target, *drafts]:
            check_ref(ref)
        for spec in specs:
            check_target_ref(f"{model_ref(self.target).name}@{spec}")
        for ref in drafts:
            check_names(ref, self.target)
        checks.integer("max_batch", self.max_batch, 1)
        check_tokens("suffix_tokens", self.suffix_tokens)
        if any(not key or any(c.isspace() or c == "," for c in key) for key in self.api_keys):
            raise SpecqError("an API key must be a non-empty string without spaces or commas")
        if self.spec_max_batch is not None:
            checks.integer("spec_max_batch", self.spec_max_batch, 0)
        object.__setattr__(self, "precisions", tuple(specs))


def build_app(config: ServeConfig) -> FastAPI:
    """Load every served model (the engines start, warm up and take requests with the app)."""
    pool = ModelPool(config.target, draft=config.draft, suffix_tokens=config.suffix_tokens)
    metrics = Metrics()
    engines = {}
    for spec in config.precisions:
        name = f"{pool.target}@{spec}"
        engines[name] = Engine(name, pool, spec, metrics, config.queue, config.timeout_s,
                               config.max_batch, config.spec_max_batch)
    for engine in engines.values():  # what the loaded models show, before the server starts
        for draft in draft_models(engine.draft):
            check_compatible(draft, engine.target)
    drafts = known_drafts(pool.target) | {d.ref for e in engines.values()
                                          for d in [e.draft, *draft_models(e.draft)]
                                          if d is not None}  # an n-gram draft's fallback too
    return create_app(engines, metrics, pool.target, drafts, config.api_keys)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: any free port)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise SpecqError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise SpecqError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def run(app: FastAPI, sock: socket.socket, log_level: str = "info") -> None:
    """Warm the engines up, then serve on `sock` until stopped. The engines start here rather than
    in the app's lifespan, so that a failure is the command's one-line error, not a traceback of
    uvicorn's start-up, and comes before the URL is printed."""
    import uvicorn

    started = []
    try:
        for engine in app.state.engines.values():
            engine.start()
            started.append(engine)
    except BaseException:
        for engine in started:
            engine.stop()
        sock.close()
        raise
    app.state.started = True
    host, port = sock.getsockname()[:2]
    print(f"specq serve: {', '.join(app.state.engines)} on http://{host}:{port}", file=sys.stderr,
          flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5)).run(
        sockets=[sock])
