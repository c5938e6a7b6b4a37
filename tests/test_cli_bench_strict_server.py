"""`autotune bench` against a server shaped like transformers serve: it refuses unknown request
fields (HTTP 422 for ``ignore_eos``) and ends its streams after the finish_reason chunk without
``data: [DONE]``. The defaults suit SGLang and vLLM, so they fail here; the two switches make it
measurable, with a prompt in words."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from e2e_helpers import autotune_cli


class _StrictHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    bodies: list[dict[str, object]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        unknown = set(body) - {"model", "prompt", "max_tokens", "temperature", "stream",
                               "stream_options"}  # fmt: skip
        if unknown:
            detail = {"detail": f"Unexpected fields in the request: {sorted(unknown)}"}
            self._send(422, json.dumps(detail).encode(), "application/json")
            return
        n = int(body["max_tokens"])
        events = []
        for i in range(n):
            last = i == n - 1
            chunk: dict[str, object] = {
                "object": "text_completion",
                "choices": [
                    {"index": 0, "text": " w", "finish_reason": "length" if last else None}
                ],
            }
            if last:
                chunk["usage"] = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
            events.append(f"data: {json.dumps(chunk)}\n\n")
        self._send(200, "".join(events).encode(), "text/event-stream")  # no "data: [DONE]"


@pytest.fixture
def strict_url() -> Iterator[str]:
    _StrictHandler.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StrictHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _bench(url: str, tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    return autotune_cli(
        "bench", "--url", url, "--model", "m", "--concurrency", "2", "--output-len", "4",
        "--requests", "4", "--warmup", "0", "--json", *extra, cwd=tmp_path, check=False,
    )  # fmt: skip


def test_defaults_fail_against_a_server_refusing_ignore_eos(
    strict_url: str, tmp_path: Path
) -> None:
    out = _bench(strict_url, tmp_path)
    assert out.returncode != 0
    assert "422" in out.stderr + out.stdout
    assert "Traceback" not in out.stderr


def test_leaving_out_ignore_eos_is_not_enough_without_done(strict_url: str, tmp_path: Path) -> None:
    out = _bench(strict_url, tmp_path, "--no-ignore-eos")
    assert out.returncode != 0
    assert "[DONE]" in out.stderr + out.stdout


def test_both_switches_measure_it(strict_url: str, tmp_path: Path) -> None:
    out = _bench(strict_url, tmp_path, "--no-ignore-eos", "--no-require-done", "--prompt", "text")
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout)
    assert metrics["completed"] == 4
    assert metrics["failed"] == 0
    assert metrics["output_throughput"] > 0
    sent = _StrictHandler.bodies
    assert len(sent) == 4
    assert all("ignore_eos" not in b for b in sent)
    assert all(isinstance(b["prompt"], str) and len(b["prompt"].split()) == 256 for b in sent)
