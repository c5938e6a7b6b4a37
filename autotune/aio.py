"""Running a coroutine from synchronous code.

The tuning loop is synchronous (one trial at a time); the HTTP clients are asyncio so a
total per-request limit can cut a server that drips bytes. Callers may themselves run inside
an event loop (a notebook, an async test), where ``asyncio.run`` is not allowed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion; in a helper thread when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_run, coro).result()


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` without its Ctrl-C handler. From Python 3.11, ``asyncio.run`` turns
    SIGINT into a cancellation of the main task, and ``asyncio.wait_for`` (before 3.12)
    returns its result instead when the awaited work completes in the same step: a Ctrl-C
    during a health probe was then lost, and the launch went on to its readiness timeout.
    Here SIGINT keeps Python's own handler: KeyboardInterrupt, wherever the loop is."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
