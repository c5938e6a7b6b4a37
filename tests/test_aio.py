"""``run_sync``: a coroutine run from synchronous code, Ctrl-C included."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from autotune.aio import run_sync


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)
def test_ctrl_c_while_a_coroutine_runs_is_a_keyboard_interrupt() -> None:
    # Python 3.11's asyncio.run made SIGINT a cancellation of its task, which
    # asyncio.wait_for (before 3.12) swallows when the awaited work completes in the same
    # step: the Ctrl-C was lost and the coroutine ran on to "done".
    async def go() -> str:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        loop.call_soon(answer.set_result, 200)  # the probe's answer, already on its way
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(answer, 1.0)
        await asyncio.sleep(0.2)
        return "done"

    with pytest.raises(KeyboardInterrupt):
        run_sync(go())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_coroutine_inside_a_running_loop_runs_in_a_helper_thread() -> None:
    async def inner() -> int:
        return 7

    async def outer() -> int:
        return run_sync(inner())

    assert run_sync(outer()) == 7
