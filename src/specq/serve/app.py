"""The FastAPI app: OpenAI's routes over the engines, plus /health and /metrics.

A request's `model` is `target@precision` (`/v1/models` lists them) or the bare target name
(the first served precision). Handlers never compute: they validate, queue a job on its model's
engine and relay the worker's events, as one JSON body or as server-sent events.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from ..drafters import lookahead, ngram
from ..errors import SpecqError
from ..loading import precision
from ..loading.refs import free_ref, model_ref
from . import errors
from .engine import Engine, Job
from .errors import APIError
from .metrics import Metrics
from .options import REGISTRY, plan
from .responses import DONE, FINISH, Reply, event
from .schemas import ChatRequest, CompletionRequest, invalid_body, unsupported_values

# how often a request with no response started checks that its client is still there
DISCONNECT_POLL_S = 0.5


def create_app(engines: dict[str, Engine], metrics: Metrics, target: str, drafts: set[str],
               api_keys: tuple[str, ...] = ()) -> FastAPI:
    """`engines` by served name (`target@precision`, the first is the bare name's); `drafts`: the
    draft refs a request may name (the registry's for the target, and the server's own);
    `api_keys`: one of them is required (none: open), and each is its requests' own namespace."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if not app.state.started:  # `serve.server.run` starts them before uvicorn runs
            for engine in engines.values():
                await asyncio.to_thread(engine.start)
        yield
        for engine in engines.values():
            engine.stop()

    app = FastAPI(title="specq serve", lifespan=lifespan)
    app.state.engines = engines
    app.state.started = False  # whether the engines are warm and taking requests
    errors.install(app)
    created = int(time.time())

    def authorize(request: Request) -> str:
        """The request's API key ("" on an open server); a 401 without one of `api_keys`."""
        if not api_keys:
            return ""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        sent = token.strip().encode()
        # every key compared, in constant time: which one matched takes no longer to find
        matched = [key for key in api_keys if secrets.compare_digest(sent, key.encode())]
        if scheme.lower() != "bearer" or not matched:
            raise APIError(401, "invalid or missing API key: send the header 'Authorization: "
                                "Bearer KEY'",
                           code="invalid_api_key")
        return matched[0]

    def engine_for(name: str) -> Engine:
        if name in engines:
            return engines[name]
        try:
            ref = model_ref(name)
            if ref.name == target and ref.window is None:
                if not ref.has_spec:
                    return next(iter(engines.values()))
                canonical = f"{target}@{precision.canonical(ref.spec)}"
                if canonical in engines:
                    return engines[canonical]
        except SpecqError:  # not a ref, or not a precision: served by no engine
            pass
        raise APIError(404, f"model '{name}' is not served here; served: {', '.join(engines)}",
                       param="model", code="model_not_found")

    async def parsed(request: Request, schema: type[BaseModel]) -> BaseModel:
        try:
            return schema.model_validate_json(await request.body())
        except ValidationError as e:
            raise invalid_body(e) from None

    async def serve(request: Request, schema: type[BaseModel]) -> Response:
        key = authorize(request)
        body = await parsed(request, schema)
        unsupported_values(body)
        engine = engine_for(body.model)
        job_plan = plan(body)
        if job_plan.draft not in (REGISTRY, None) and not servable(job_plan.draft, drafts):
            raise APIError(400, f"unknown draft '{job_plan.draft}'; known: "
                                f"{', '.join(sorted(drafts)) or 'none'}, "
                           f"{ngram.NAME}[:n=N][:k=K] alone or +one of those, and "
                           f"{lookahead.NAME}[:w=W][:n=N][:g=G]", param="draft",
                           code="draft_not_found")
        job = engine.new_job(job_plan, key)
        engine.submit(job)
        reply = Reply(chat=schema is ChatRequest, model=engine.name)
        if job_plan.stream:
            return await stream(job, reply, request)
        return await whole(job, reply, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(request, ChatRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, CompletionRequest)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        authorize(request)
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "specq", "root": target,
             "draft": engine.draft.ref if engine.draft else None}
            for name, engine in engines.items()]}

    @app.get("/health")
    async def health() -> Response:
        dead = [name for name, engine in engines.items() if not engine.alive()]
        if dead:
            return JSONResponse({"status": "error", "dead": dead}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type=metrics.content_type)

    return app


async def next_event(job: Job, request: Request) -> tuple | None:
    """The worker's next event for this request, or None once the client has hung up (the
    generation is then cancelled)."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                return None


async def whole(job: Job, reply: Reply, request: Request) -> Response:
    while (got := await next_event(job, request)) is not None:
        kind, *payload = got
        if kind == "error":
            raise payload[0]
        if kind == "done":
            return JSONResponse(reply.whole(payload[0]))
    return Response(status_code=499)  # nobody reads it


async def stream(job: Job, reply: Reply, request: Request) -> Response:
    """Server-sent events. The status line waits for the first token, so a request that fails
    before it (bad prompt, queue timeout) still gets its 4xx/5xx; a failure after it arrives as an
    error event. A client that hangs up cancels the generation (the generator is closed)."""
    first = await next_event(job, request)
    if first is None:
        return Response(status_code=499)
    if first[0] == "error":
        raise first[1]
    usage = job.plan.include_usage

    async def events():
        try:
            if reply.chat:
                yield reply.chunk("", role=True, with_usage=usage)
            kind, *payload = first
            while True:
                if kind == "text" and payload[0]:
                    yield reply.chunk(payload[0], with_usage=usage)
                elif kind == "error":
                    yield event(payload[0].body())
                    break
                elif kind == "done":
                    out, rest = payload
                    if rest:
                        yield reply.chunk(rest, with_usage=usage)
                    yield reply.chunk(None, finish=FINISH[out.finish_reason], with_usage=usage)
                    if usage:
                        yield reply.usage_chunk(out)
                    break
                kind, *payload = await job.events.get()
            yield DONE
        finally:
            job.cancel()  # a no-op once the generation has ended

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def servable(draft: str, drafts: set[str]) -> bool:
    """Whether a request may name this draft: one of `drafts` (loaded or known to the registry), or
    an n-gram draft, which loads nothing, alone or falling back to one of them, or a lookahead
    draft, which loads nothing."""
    try:
        lookup = free_ref(draft)
    except SpecqError as e:
        raise APIError(400, str(e), param="draft", code="invalid_value") from None
    if lookup is None:
        return draft in drafts
    return lookup.fallback is None or lookup.fallback.text in drafts
