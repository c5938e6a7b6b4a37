"""The process state of one simulated server, which every HTTP handler reads.

:class:`State` holds the parsed configuration, the log, the engine, readiness and the PD
hand-over's two ends; the app carries it under :data:`STATE_KEY`. Separate from
``server`` so that both groups of routes (``_info_routes``, ``_generate_routes``) and the
start-up in ``server`` share one definition of what a handler may touch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from aiohttp import web

from autotune.sim._engine import Engine
from autotune.sim._kv_transfer import KVReceiver, KVRooms, _env_seconds
from autotune.sim._log import Log
from autotune.sim.args import SimConfig


class State:
    def __init__(self, cfg: SimConfig, log: Log, argv: Sequence[str] = ()) -> None:
        self.cfg = cfg
        self.log = log
        self.argv = list(argv)
        self.ready = False
        self.started = time.monotonic()
        self.startup_time = 0.0
        self.engine = Engine(cfg, log)
        self.pd = cfg.disaggregation_mode in ("prefill", "decode")
        self.fake_transfer = cfg.disaggregation_transfer_backend == "fake"
        self.rooms = KVRooms(_env_seconds("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0))
        self.receiver = KVReceiver(_env_seconds("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0))


STATE_KEY = web.AppKey("state", State)


def _error(status: int, message: str) -> web.Response:
    kind = "BadRequestError" if status == 400 else "ServiceUnavailableError"
    return web.json_response(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status},
        status=status,
    )


def _state(request: web.Request) -> State:
    return request.app[STATE_KEY]
