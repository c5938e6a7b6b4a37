"""``autotune init`` as a user runs it: what it writes where, what it refuses, what it says,
and the release a running server reports (``--url``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from init_helpers import Init


@pytest.fixture
def fake_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """An HTTP server answering the paths of ``routes`` (path -> JSON) with 200, else 404."""
    routes: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path in routes:
                body = json.dumps(routes[self.path]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_error(404)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", routes
    finally:
        server.shutdown()
        server.server_close()


def test_it_writes_three_files_and_says_what_to_run_next(init: Init) -> None:
    result = init("--from-command", "vllm serve /models/m --port 8000 --max-num-seqs 8")
    dep, space, study = init.files()
    assert dep.is_file() and space.is_file() and study.is_file()
    output = result.output
    assert "service server: vllm 0.32.0 (server, gpu) at 127.0.0.1:8000, health /health" in output
    assert f"wrote {dep}" in output and f"wrote {space}" in output
    assert "space check: ok" in output
    assert f"autotune run --study imported --study-file {study} --trials" in output
    assert "autotune best --study imported --export systemd" in output


def test_existing_files_are_refused_unless_forced(init: Init) -> None:
    init("--from-command", "vllm serve /m --max-num-seqs 8")
    dep = init.files()[0]
    first = dep.read_text()
    again = init("--from-command", "vllm serve /m --max-num-seqs 16", ok=False)
    assert again.exit_code == 2 and "give --force to overwrite" in again.output
    assert dep.read_text() == first  # untouched, the space and study too
    init("--from-command", "vllm serve /m --max-num-seqs 16", "--force")
    assert "'16'" in dep.read_text()


def test_nothing_is_written_when_the_import_fails(init: Init) -> None:
    result = init("--from-command", "vllm serve /m --max-num-seqz 8", ok=False)
    assert result.exit_code == 2
    assert "unknown option --max-num-seqz in vllm 0.32.0" in result.output
    assert "--max-num-seqs" in result.output  # the closest real option
    assert not any(p.exists() for p in init.files())


def test_several_servers_without_a_router_need_an_endpoint(init: Init) -> None:
    a = "vllm serve /m --port 8001"
    b = "vllm serve /m --port 8002"
    result = init("--from-command", a, "--from-command", b, ok=False)
    assert "which one takes the load? give --endpoint NAME" in result.output
    assert "server, server-2" in result.output
    init("--from-command", a, "--from-command", b, "--endpoint", "server-2")
    dep, _, _ = init.load()
    assert dep["endpoint"] == "http://${server-2.host}:${server-2.port}"


def test_a_running_vllm_names_the_release_its_options_are_read_with(
    init: Init, fake_server: tuple[str, dict[str, Any]]
) -> None:
    url, routes = fake_server
    routes["/version"] = {"version": "0.26.0"}
    result = init("--from-command", "vllm serve /m --max-num-seqs 8", "--url", url)
    assert f"vllm 0.26.0 (reported by {url})" in result.output
    _, space, _ = init.load()
    assert space["engine"] == {"name": "vllm", "version": "0.26.0"}
    routes["/version"] = {"version": "0.31.0"}
    refused = init("--from-command", "vllm serve /m", "--url", url, "--force", ok=False)
    assert "vllm 0.31.0 (reported by" in refused.output and "has no manifest" in refused.output
    assert "0.26.0, 0.32.0, 0.33.0" in refused.output  # the releases autotune can read


def test_a_running_sglang_says_its_release_in_server_info(
    init: Init, fake_server: tuple[str, dict[str, Any]]
) -> None:
    url, routes = fake_server
    routes["/server_info"] = {"version": "0.5.23", "model_path": "/m", "tp_size": 1}
    result = init("--from-command", "python -m sglang.launch_server --model-path /m", "--url", url)
    assert f"sglang 0.5.23 (reported by {url})" in result.output
    routes.clear()
    unreachable = init("--from-command", "vllm serve /m", "--url", url, "--force", ok=False)
    assert "answers neither SGLang's /server_info nor vLLM's /version" in unreachable.output


def test_names_must_name_files(init: Init) -> None:
    result = init("--from-command", "vllm serve /m", name="../x", ok=False)
    assert "cannot name a deployment" in result.output


def test_a_program_autotune_does_not_know_is_read_as_the_engine_its_server_says(
    init: Init, fake_server: tuple[str, dict[str, Any]]
) -> None:
    """A wrapper script that starts vLLM: its flags are vLLM's, which the running server tells."""
    url, routes = fake_server
    routes["/version"] = {"version": "0.32.0"}
    port = url.rsplit(":", 1)[1]
    result = init("--from-command", f"./start-vllm.sh --port {port} --max-num-seqs 8", "--url", url)
    assert f"vllm 0.32.0 (reported by {url})" in result.output
    dep, space, _ = init.load()
    assert dep["services"]["server"]["command"][0] == "./start-vllm.sh"
    assert space["baseline"]["max_num_seqs"] == 8  # read with vLLM's parser
    refused = init(
        "--from-command", f"./start-vllm.sh --port {port} --max-num-seqz 8", "--url", url,
        "--force", ok=False,
    )  # fmt: skip
    assert "unknown option --max-num-seqz in vllm 0.32.0" in refused.output
