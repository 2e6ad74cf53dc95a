"""`specq serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over a `ModelPool`.

    pool.py       `specq.ModelPool`: the target per precision, its draft, gamma auto's memory
    schemas.py    request bodies (strict; unknown fields are a 400)
    options.py    a request -> the prompt, the draft choice, `specq.generate`'s options
    engine.py     per served model: bounded queue, one worker thread that batches requests,
                  timeout, cancellation
    text.py       streamed text deltas (stop strings and partial characters held back)
    responses.py  OpenAI response bodies and server-sent events
    metrics.py    Prometheus metrics with vLLM's names
    errors.py     OpenAI-style error bodies
    app.py        the routes
    server.py     load, bind, run (`ServeConfig`, `build_app`, `bind`, `run`)

Nothing is imported here: `specq.ModelPool` (`pool.py`) must not pull in the web stack.
"""
