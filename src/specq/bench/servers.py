"""The servers a sweep with `engine = "openai"` measures: their bench config entries, and their
processes when the config says how to start them.

A `start` command is run in a shell of its own session (so its whole process group can be
stopped), with its output in a log file beside the results and `$SPECQ_PYTHON` set to the Python
running the bench (so a command can ask specq where a built-in's files are); the sweep waits until
the server answers (`/health`, else `/v1/models`) and stops every server it started when it ends,
on an error or an interrupt too. A server that exits or does not answer in time is one error line
naming its log. Entries that share a URL share one server (a server that lets a request choose its
draft, as `specq serve` does, serves the baseline and the speculative entries at once).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from ..core.gamma import MAX_GAMMA
from ..errors import SpecqError

START_TIMEOUT_S = 600.0  # vLLM on a CPU loads and compiles for minutes
STOP_TIMEOUT_S = 15.0
POLL_S = 0.25
KEYS = ("name", "url", "model", "api_key", "start", "start_timeout", "body", "baseline", "gamma")


@dataclass(frozen=True)
class Server:
    name: str  # the row's label: the baseline's is the target column, the others' the draft column
    url: str  # the base URL, without /v1
    model: str | None = None  # the request's `model` (None: the first of /v1/models)
    api_key: str | None = None  # sent as a bearer token; "$NAME": the environment variable NAME
    start: str | None = None  # a shell command that starts the server (None: already running)
    start_timeout: float = START_TIMEOUT_S
    body: dict = field(default_factory=dict)  # extra request fields (e.g. {speculative = false})
    baseline: bool = False
    gamma: int | None = None  # draft tokens per step as the server is set (None: from its metrics)

    def identity(self) -> str:
        """What makes this server's numbers what they are, as stored in a cell (and hashed into its
        key): a changed command, model or request body is a new cell; the key is never stored."""
        return json.dumps({"url": self.url, "model": self.model, "start": self.start,
                           "body": self.body}, sort_keys=True)

    def key(self) -> str | None:
        if self.api_key and self.api_key.startswith("$"):
            return os.environ.get(self.api_key[1:]) or None
        return self.api_key


def parse(raw) -> list[Server]:
    """The `servers` key: a list of tables, exactly one with `baseline = true`."""
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        raise _error("must be a non-empty list of tables ([[servers]] in TOML)")
    servers = [_server(i, entry) for i, entry in enumerate(raw)]
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise _error(f"two servers are named '{next(n for n in names if names.count(n) > 1)}'")
    baselines = [s.name for s in servers if s.baseline]
    if len(baselines) != 1:
        raise _error("exactly one server needs 'baseline = true' (the plain runs to compare "
                     f"with); found {len(baselines)}")
    if len(servers) < 2:
        raise _error("give the baseline server and at least one speculative server")
    for url in {s.url for s in servers}:
        commands = {s.start for s in servers if s.url == url and s.start}
        if len(commands) > 1:
            raise _error(f"two start commands for {url}: entries with one URL share one server")
    return sorted(servers, key=lambda s: not s.baseline)


def _server(i: int, entry: dict) -> Server:
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise _error(f"[{i}]: unknown key '{unknown[0]}' (valid keys: {', '.join(KEYS)})")
    for key in ("name", "url"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise _error(f"[{i}]: '{key}' is required (a non-empty string)")
    for key in ("model", "api_key", "start"):
        if entry.get(key) is not None and not (isinstance(entry[key], str) and entry[key].strip()):
            raise _error(f"[{i}] '{entry['name']}': '{key}' must be a non-empty string")
    url = entry["url"].strip().rstrip("/").removesuffix("/v1")
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise _error(f"[{i}] '{entry['name']}': url '{entry['url']}' is not an http(s) URL such "
                     "as http://127.0.0.1:8000")
    body = entry.get("body", {})
    if not isinstance(body, dict):
        raise _error(f"[{i}] '{entry['name']}': 'body' must be a table of request fields")
    taken = sorted(set(body) & OWN_FIELDS)
    if taken:
        raise _error(f"[{i}] '{entry['name']}': 'body' may not set '{taken[0]}' (the bench sets "
                     "it from the sweep)")
    gamma, timeout = entry.get("gamma"), entry.get("start_timeout", START_TIMEOUT_S)
    if gamma is not None and not (type(gamma) is int and 1 <= gamma <= MAX_GAMMA):
        raise _error(f"[{i}] '{entry['name']}': 'gamma' must be an integer in [1, {MAX_GAMMA}]")
    if type(timeout) not in (int, float) or not 0 < timeout <= 86400:
        raise _error(f"[{i}] '{entry['name']}': 'start_timeout' must be seconds in (0, 86400]")
    if not isinstance(entry.get("baseline", False), bool):
        raise _error(f"[{i}] '{entry['name']}': 'baseline' must be true or false")
    return Server(name=entry["name"].strip(), url=url, model=entry.get("model"),
                  api_key=entry.get("api_key"), start=entry.get("start"),
                  start_timeout=float(timeout), body=body, baseline=entry.get("baseline", False),
                  gamma=gamma)


# request fields the bench sets itself (`openai_engine.request_body`)
OWN_FIELDS = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens",
              "temperature", "seed", "stream", "stream_options", "ignore_eos", "n"}


def _error(why: str) -> SpecqError:
    return SpecqError(f"bench config 'servers'{'' if why.startswith('[') else ': '}{why}")


def get(url: str, key: str | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body) of a GET; status 0 when nothing answers."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def ready(server: Server) -> bool:
    """The server answers: /health is 200, or it has no /health and /v1/models is 200."""
    status, _ = get(f"{server.url}/health", server.key(), timeout=5.0)
    if status == 200:
        return True
    return status in (404, 405) and get(f"{server.url}/v1/models", server.key(), 5.0)[0] == 200


def check_reachable(server: Server) -> None:
    """One line when nothing answers at a server's URL (a typo, a server not started)."""
    status, body = get(f"{server.url}/v1/models", server.key())
    if status == 0:
        raise SpecqError(f"server '{server.name}': nothing answers at {server.url} (is it "
                         "running? give 'start' to let the bench start it)")
    if status != 200:
        raise SpecqError(f"server '{server.name}': {server.url}/v1/models answered HTTP {status}: "
                         f"{error_message(body)}")


def error_message(body: bytes) -> str:
    text = body.decode(errors="replace").strip()
    try:
        error = json.loads(text).get("error", text)
        text = error.get("message", str(error)) if isinstance(error, dict) else str(error)
    except (json.JSONDecodeError, AttributeError):
        pass
    return " ".join(text.split())[:300] or "(no body)"


class Process:
    """One started server: its process group, stopped on `stop`."""

    def __init__(self, server: Server, log: Path):
        self.server, self.log = server, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(server.start, shell=True, stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True,
                                          env=os.environ | {"SPECQ_PYTHON": sys.executable})

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.server.start_timeout
        while not ready(self.server):
            code = self.popen.poll()
            if code is not None:
                raise SpecqError(f"server '{self.server.name}' did not start: `{self.server.start}`"
                                 f" exited with code {code}{self._tail()} (log: {self.log})")
            if time.monotonic() > deadline:
                raise SpecqError(f"server '{self.server.name}' did not answer at "
                                 f"{self.server.url}/health within {self.server.start_timeout:g} s"
                                 f" of `{self.server.start}`{self._tail()} (log: {self.log})")
            time.sleep(POLL_S)

    def _tail(self) -> str:
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines()
                 if line.strip()]
        return f": {lines[-1][:200]}" if lines else ""

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL after STOP_TIMEOUT_S."""
        if self.popen.poll() is None:
            _signal(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _signal(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        _signal(self.popen.pid, signal.SIGKILL)  # what the shell's child left behind


def _signal(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


@contextlib.contextmanager
def running(servers: list[Server], logs: Path, log=print):
    """Start the servers that have a start command (each URL once), wait until they answer, check
    that every server answers; stop what was started on leaving, however it is left. A URL that
    already answers before its start command ran is refused: the bench would measure that server."""
    started: list[Process] = []
    restore = _terminate_as_interrupt()
    try:
        for url in dict.fromkeys(s.url for s in servers):
            server = next((s for s in servers if s.url == url and s.start), None)
            if server is None:
                continue
            if get(f"{url}/v1/models", server.key(), 2.0)[0] or get(f"{url}/health")[0]:
                raise SpecqError(f"server '{server.name}': something already answers at {url}; "
                                 "stop it, or drop 'start' to measure it as it is")
            path = logs.with_name(f"{logs.name}.{_slug(server.name)}.log")
            log(f"starting server '{server.name}': {server.start} (log: {path})")
            started.append(Process(server, path))
            started[-1].wait_ready()
        for server in servers:
            check_reachable(server)
        yield
    finally:
        for process in reversed(started):
            process.stop()
        restore()


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


def _terminate_as_interrupt():
    """Make SIGTERM unwind like Ctrl-C while servers run, so they are stopped; returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, previous)
