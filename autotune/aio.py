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
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
