"""The simulated server's generation endpoints: completions, chat completions, /generate.

Parses a request body as SGLang does, builds a :class:`Req`, hands it to the engine (or,
on a PD decode server, first waits for the prefill's KV; on a prefill server, marks the
room's KV ready after the forward), and answers with SSE chunks or a JSON body, or with
SGLang's abort. Separate from ``server`` because this is the request path proper, the
largest of the server's HTTP code, and it needs none of the start-up.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import HttpVersion11, web

from autotune.sim._kv_transfer import FAKE_BOOTSTRAP_HOST, _KVTransferError
from autotune.sim._request import Req
from autotune.sim._state import State, _error, _state

CHAT_DEFAULT_MAX_TOKENS = 128
COMPLETION_DEFAULT_MAX_TOKENS = 16


def _as_int(value: Any, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer")
    return value


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    st = _state(request)
    if not st.ready:
        return _error(503, "The server is not ready yet.")
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError("request body must be a JSON object")
        ignore_eos = bool(body.get("ignore_eos", False))
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage", False)) if isinstance(opts, dict) else False
        prompt: str | list[int]
        if kind == "chat":
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ValueError("messages must be a non-empty list")
            parts = []
            for m in msgs:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list):
                    content = " ".join(
                        str(c.get("text", "")) for c in content if isinstance(c, dict)
                    )
                parts.append(
                    f"{m.get('role', 'user') if isinstance(m, dict) else 'user'}: {content or ''}"
                )
            prompt = "\n".join(parts)
            max_tokens = _as_int(
                body.get("max_completion_tokens", body.get("max_tokens")),
                "max_tokens",
                CHAT_DEFAULT_MAX_TOKENS,
            )
        elif kind == "completion":
            raw = body.get("prompt")
            if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
                raw = raw[0]
            if isinstance(raw, str):
                prompt = raw
            elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
                prompt = [int(t) for t in raw]
            else:
                raise ValueError("prompt must be a string or a list of token ids")
            max_tokens = _as_int(
                body.get("max_tokens"), "max_tokens", COMPLETION_DEFAULT_MAX_TOKENS
            )
        else:
            sp = body.get("sampling_params") or {}
            ignore_eos = bool(sp.get("ignore_eos", False))
            raw = body.get("input_ids", body.get("text"))
            if isinstance(raw, str):
                prompt = raw
            elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
                prompt = [int(t) for t in raw]
            else:
                raise ValueError("text or input_ids is required")
            max_tokens = _as_int(
                sp.get("max_new_tokens"), "max_new_tokens", CHAT_DEFAULT_MAX_TOKENS
            )
    except (ValueError, json.JSONDecodeError, AttributeError, TypeError) as exc:
        return _error(400, str(exc))
    model = str(body.get("model") or st.engine.model_name)
    req = Req(
        kind=kind,
        prompt=prompt,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        stream=stream,
        include_usage=include_usage,
        model=model,
        cache=st.engine.cache,
        report_cache=st.cfg.enable_cache_report,
    )
    room = body.get("bootstrap_room")
    if st.pd:
        if room is None and not st.fake_transfer:
            # srt/managers/scheduler.py: a PD server refuses a request without a room
            message = (
                "Invalid request: Disaggregated request received without bootstrap room id. "
                f"req.rid={req.rid!r}"
            )
            st.log.error_lines([message])
            return await _abort(request, req, message, 400)
        if room is not None and (isinstance(room, bool) or not isinstance(room, int)):
            return _error(400, "bootstrap_room must be an integer")
    room_id = room if isinstance(room, int) and not isinstance(room, bool) else None
    transfer = (
        st.pd
        and room_id is not None
        and not st.fake_transfer
        and body.get("bootstrap_host") != FAKE_BOOTSTRAP_HOST
    )
    if st.cfg.disaggregation_mode == "prefill":
        return await _serve_prefill(request, st, req, room_id if transfer else None)
    if stream:
        await _prepare_stream(request, req)
    if transfer and room_id is not None and st.cfg.disaggregation_mode == "decode":
        host = body.get("bootstrap_host")
        port = body.get("bootstrap_port") or st.cfg.disaggregation_bootstrap_port
        try:
            if not isinstance(host, str) or not host or not isinstance(port, int):
                raise _KVTransferError(
                    f"Decode handshake failed for request rank=0 decode_req.req.rid={req.rid!r} "
                    f"decode_req.req.bootstrap_room={room} with exception no bootstrap "
                    f"address (bootstrap_host={host!r}, bootstrap_port={port!r})"
                )
            handoff = await st.receiver.receive(host=host, port=port, room=room_id, rid=req.rid)
            req.seeded = bool(handoff.get("draft_seeded", False))
            # disaggregation/decode.py: the prefill's cached-token count rides with the KV
            cached = handoff.get("cached_tokens", 0)
            req.cached = cached if isinstance(cached, int) and cached > 0 else 0
        except _KVTransferError as exc:
            st.log.error_lines([str(exc)])
            return await _abort(request, req, str(exc), 500)
    await _run_to_completion(st, req)
    st.engine.finished(req)
    if stream:
        assert req.resp is not None
        try:
            await req.resp.write(req.final_chunks())
            await req.resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return req.resp
    return web.json_response(req.body())


async def _prepare_stream(request: web.Request, req: Req) -> None:
    """Send the SSE headers; on HTTP/1.1 the engine then writes chunks to the socket."""
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    fast = request.version == HttpVersion11
    if fast:
        resp.enable_chunked_encoding()
    await resp.prepare(request)
    req.resp = resp
    if fast:
        # headers must be on the wire before we write chunks to the socket ourselves
        writer = getattr(resp, "_payload_writer", None)
        send_headers = getattr(writer, "send_headers", None)
        if callable(send_headers):
            send_headers()
        req.transport = request.transport  # type: ignore[assignment]


async def _run_to_completion(st: State, req: Req) -> None:
    """Hand ``req`` to the engine and wait until it is done; a client that goes away
    (the handler is cancelled) aborts it and frees its slot."""
    if req.max_tokens == 0:
        req.done.set_result(None)
    else:
        st.engine.submit(req)
    try:
        await req.done
    except asyncio.CancelledError:
        req.finish = "abort"
        if not req.done.done():
            req.done.set_result(None)
        raise


async def _serve_prefill(
    request: web.Request, st: State, req: Req, room: int | None
) -> web.StreamResponse:
    """A prefill server's answer: the forward, then the room's KV is ready for the decode;
    the response (sent once the forward is done, like SGLang's) carries the first token
    and ``finish_reason: length``."""
    if room is not None:
        st.rooms.expect(room)
    delivered = False
    try:
        await _run_to_completion(st, req)
        if room is not None and req.finish != "abort":
            st.rooms.ready(
                room,
                {
                    "room": room,
                    "prompt_tokens": req.n_prompt,
                    "draft_seeded": st.engine.drafts,
                    "cached_tokens": req.cached,
                },
            )
            delivered = True
    finally:
        if room is not None and not delivered:
            st.rooms.fail(
                room,
                f"Prefill transfer failed for request rank=0 req.rid={req.rid!r} "
                f"req.bootstrap_room={room}: the request was aborted",
            )
    st.engine.finished(req)
    if not req.stream:
        return web.json_response(req.body())
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    text = "".join(req.parts)
    try:
        await resp.write((req.chunk(text) if text else b"") + req.final_chunks())
        await resp.write_eof()
    except (ConnectionError, RuntimeError):
        pass
    return resp


async def _abort(request: web.Request, req: Req, message: str, status: int) -> web.StreamResponse:
    """A request SGLang's scheduler aborts with an HTTP status (prepare_abort): a JSON error
    with that status, or, on a stream, HTTP 200 with an error event (then usage, [DONE])."""
    if not req.stream:
        if req.kind == "generate":
            key = "error" if status == 400 else "detail"
            payload: Any = {"message": message} if status == 400 else message
            return web.json_response({key: payload}, status=status)
        err_type = "BadRequestError" if status == 400 else str(status)
        return web.json_response(
            {"object": "error", "message": message, "type": err_type, "param": None,
             "code": status},
            status=status,
        )  # fmt: skip
    if req.resp is None:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        req.resp = resp
    name = "BAD_REQUEST" if status == 400 else "INTERNAL_SERVER_ERROR"
    events: list[Any] = []
    if req.kind == "generate":
        finish = {"type": "abort", "message": message, "status_code": status, "err_type": None}
        meta = {"id": req.rid, "finish_reason": finish, **req.meta_usage()}
        events.append({"text": "", "output_ids": [], "meta_info": meta})
    else:
        events.append(
            {"error": {"object": "error", "message": message, "type": name, "param": None,
                       "code": status}}
        )  # fmt: skip
        if req.include_usage:
            obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
            events.append(
                {"id": req.rid, "object": obj, "created": req.created, "model": req.model,
                 "choices": [], "usage": req.usage()}
            )  # fmt: skip
    data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    try:
        await req.resp.write(data + b"data: [DONE]\n\n")
        await req.resp.write_eof()
    except (ConnectionError, RuntimeError):
        pass
    return req.resp


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def generate(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "generate")
