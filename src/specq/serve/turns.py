"""Served precisions take turns on the CPU, one decoding step each.

Two models computing at once on one CPU only share its cores, and their thread pools (each sized
for every core) then fight over them, which can cost far more than the sharing itself. So by
default one step runs at a time across all of a server's models, in arrival order: a worker
holds the turn for a step (prefill, or one propose + verify) and passes it on after it, so
requests to different precisions progress side by side, step for step.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager


class Turns:
    def __init__(self):
        self._changed = threading.Condition()
        self._waiting: deque[object] = deque()
        self._held = False

    def acquire(self) -> None:
        me = object()
        with self._changed:
            self._waiting.append(me)
            self._changed.wait_for(lambda: not self._held and self._waiting[0] is me)
            self._waiting.popleft()
            self._held = True

    def release(self) -> None:
        with self._changed:
            self._held = False
            self._changed.notify_all()

    def pass_on(self) -> None:
        """Let whoever waits take a step first (returns at once when nobody does)."""
        self.release()
        self.acquire()

    @contextmanager
    def turn(self):
        self.acquire()
        try:
            yield
        finally:
            self.release()


class NoTurns(Turns):
    """Every model computes whenever it has work (a machine with cores for each)."""

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass
