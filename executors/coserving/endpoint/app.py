"""OpenAI-compatible HTTP endpoint of one serving worker.

A thin layer: validate (executors/coserving/endpoint/protocol.py), map to `executor.submit_serving`, shape
the answer. Production clients talk to it; the trace replay measures TTFT/TPOT through it.
uvicorn runs in a background thread of the serving worker process, bound to 127.0.0.1 on a
free port; `endpoint_address()` tells the Dask plugin (or `client.run`) where it listens.
An engine error fails that one request with a 5xx: nothing a client sends reaches the engine
unvalidated, and no exception escapes into the engine's loop.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from executors.coserving.endpoint.protocol import (APIError, ChatBody, CompletionBody, Detokenizer, Generation,
                                       chat_prompt, check_model, completion_prompt, finish_reason,
                                       full_response, parse_body, stream_chunk, to_generation,
                                       usage)
from executors.coserving.endpoint.api_keys import OPEN_BY_DEFAULT, authorized, presented_key
from executors.coserving.endpoint.metrics import EndpointMetrics
from executors.coserving.endpoint.server import ServingEndpoint
from executors.coserving.endpoint.state import MAX_IN_FLIGHT, EndpointState, ServingExecutor

_DONE = object()


def _token_ids(args: tuple) -> list[int]:
    # on_token(token_id, time) per token; a list of ids (one engine step) is accepted too.
    if args and isinstance(args[0], (list, tuple)):
        return [int(t) for t in args[0]]
    return [int(args[0])] if args else []


async def _generate(state: EndpointState, rid: str, gen: Generation):
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def deliver(ids: list[int]) -> None:  # event loop: its prompt no longer waits (admission)
        state.first_token(rid)
        queue.put_nowait(ids)

    def on_token(*args) -> None:  # engine thread: hand over, never block or raise there
        loop.call_soon_threadsafe(deliver, _token_ids(args))

    def finish() -> None:  # event loop: the engine holds it no more (done, failed, aborted),
        state.release(rid)  # even where the response's own cleanup never runs
        queue.put_nowait(_DONE)

    def on_done(_fut) -> None:
        loop.call_soon_threadsafe(finish)

    try:  # on_token for a whole response too: its first token frees its waiting prompt tokens
        future = state.executor.submit_serving(
            gen.prompt_ids, gen.max_tokens, ignore_eos=gen.ignore_eos,
            temperature=gen.temperature, on_token=on_token, request_id=rid)
    except (ValueError, TypeError) as e:  # the executor refused these arguments
        raise APIError(400, f"request refused by the engine: {e}") from None
    except Exception as e:
        raise APIError(503, f"serving engine unavailable: {e}", kind="server_error") from None
    future.add_done_callback(on_done)
    return int(time.time()), future, queue


def _result_of(future):
    try:
        return future.result()
    except Exception as e:
        raise APIError(500, f"the engine failed this request: {type(e).__name__}: {e}",
                       kind="server_error") from None


async def _respond(state: EndpointState, kind: str, gen: Generation, route: str):
    rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    state.admit(rid, len(gen.prompt_ids))
    try:
        response = await _respond_admitted(state, kind, gen, route, rid)
    except BaseException:
        state.release(rid)
        raise
    if not isinstance(response, StreamingResponse):
        state.release(rid)  # a stream leaves when the engine is done with it (finish)
    return response


async def _respond_admitted(state: EndpointState, kind: str, gen: Generation, route: str,
                            rid: str):
    created, future, queue = await _generate(state, rid, gen)
    model = state.model_name
    if not gen.stream:
        while await queue.get() is not _DONE:
            pass
        result = _result_of(future)
        ids = list(result.output_ids)
        text = state.tokenizer.decode(ids, skip_special_tokens=True)
        finish = finish_reason(result)
        state.metrics.observe(route, 200, result, len(gen.prompt_ids), len(ids))
        return JSONResponse(full_response(kind, rid, created, model, text, finish,
                                          usage(gen, len(ids))))

    async def events():
        try:
            async for chunk in _events():
                yield chunk
        finally:
            state.release(rid)

    async def _events():
        detok, n_out, first = Detokenizer(state.tokenizer), 0, True
        # One SSE chunk per engine token (text may be empty mid-character), so a client's
        # chunk timestamps are token timestamps: the replay measures TTFT/TPOT from them.
        try:
            while (item := await queue.get()) is not _DONE:
                n_out += len(item)
                chunk = stream_chunk(kind, rid, created, model, detok.push(item), None, first)
                first = False
                yield f"data: {json.dumps(chunk)}\n\n"
        finally:
            if not future.done():  # the client went away: free the engine's slot
                abort = getattr(state.executor, "abort_serving", None)
                if abort is not None:
                    abort(rid)
        try:
            result = _result_of(future)
            finish = finish_reason(result)
        except APIError as e:
            state.metrics.observe(route, e.status, None, len(gen.prompt_ids), n_out)
            yield f"data: {json.dumps(e.body())}\n\n"
            yield "data: [DONE]\n\n"
            return
        tail = detok.push([], final=True)
        yield f"data: {json.dumps(stream_chunk(kind, rid, created, model, tail, finish, first))}\n\n"
        if gen.include_usage:
            last = {"id": rid, "object": "chat.completion.chunk" if kind == "chat"
                    else "text_completion", "created": created, "model": model, "choices": [],
                    "usage": usage(gen, n_out)}
            yield f"data: {json.dumps(last)}\n\n"
        state.metrics.observe(route, 200, result, len(gen.prompt_ids), n_out)
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def build_app(state: EndpointState, api_keys: tuple[str, ...] = (),
              open_paths: tuple[str, ...] = OPEN_BY_DEFAULT) -> FastAPI:
    """The endpoint's routes; with `api_keys`, every path but `open_paths` needs one of them
    (executors/coserving/endpoint/api_keys.py): 401 with OpenAI's error body otherwise."""
    app = FastAPI(title="ROSE serving endpoint", docs_url=None, redoc_url=None)
    app.state.endpoint = state  # what it admitted, for tests and probes

    @app.middleware("http")
    async def _api_key(request: Request, call_next):
        if api_keys and request.url.path not in open_paths and \
                not authorized(request.headers.get("authorization"), api_keys):
            state.metrics.count(request.url.path, 401)
            missing = presented_key(request.headers.get("authorization")) is None
            err = APIError(401, "missing API key: send `Authorization: Bearer <key>`" if missing
                           else "incorrect API key provided", code="invalid_api_key")
            return JSONResponse(err.body(), status_code=401)
        return await call_next(request)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        state.metrics.count(request.url.path, e.status)
        retry = {"Retry-After": "1"} if e.status in (429, 503) else None
        return JSONResponse(e.body(), status_code=e.status, headers=retry)

    @app.exception_handler(HTTPException)  # unknown route, wrong method: same error shape
    async def _http_error(request: Request, e: HTTPException):
        return JSONResponse(APIError(e.status_code, f"{request.method} {request.url.path}: "
                                     f"{e.detail}").body(), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        state.metrics.count(request.url.path, 500)
        err = APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")
        return JSONResponse(err.body(), status_code=500)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = parse_body(await request.body(), CompletionBody)
        check_model(body.model, state.model_name)
        ids = completion_prompt(body, state.tokenizer, state.vocab_size)
        return await _respond(state, "completion", to_generation(body, ids, state.max_model_len),
                              "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = parse_body(await request.body(), ChatBody)
        check_model(body.model, state.model_name)
        ids = chat_prompt(body, state.tokenizer)
        return await _respond(state, "chat", to_generation(body, ids, state.max_model_len),
                              "/v1/chat/completions")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model",
                                            "owned_by": "rose", "max_model_len": state.max_model_len,
                                            "vocab_size": state.vocab_size}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": state.model_name}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(state.metrics.render(), media_type=state.metrics.content_type)

    return app


_ENDPOINTS: dict[str, ServingEndpoint] = {}  # worker name -> its endpoint, in this process


def _model_facts(model_dir: Path) -> tuple[int, int]:
    cfg = json.loads((model_dir / "config.json").read_text())
    return int(cfg["vocab_size"]), int(cfg.get("max_position_embeddings", 2048))


def start_endpoint(executor: ServingExecutor, serving_model_dir: str | Path,
                   worker: str = "serving-0", model_name: str | None = None,
                   max_model_len: int | None = None, port: int = 0,
                   max_in_flight: int = MAX_IN_FLIGHT, api_keys: tuple[str, ...] = (),
                   open_paths: tuple[str, ...] = OPEN_BY_DEFAULT) -> ServingEndpoint:
    """Start (or return) this worker's endpoint; the served model name defaults to the model
    directory's name; max_model_len defaults to the executor's (cfg.max_model_len), else the
    model's; `api_keys`/`open_paths`: see build_app."""
    if worker in _ENDPOINTS:
        return _ENDPOINTS[worker]
    from transformers import AutoTokenizer

    model_dir = Path(serving_model_dir)
    vocab, context = _model_facts(model_dir)
    # The engine's context (CoServingConfig.max_model_len) bounds requests, not the model's.
    engine_context = getattr(getattr(executor, "cfg", None), "max_model_len", None)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    state = EndpointState(executor, tokenizer, model_name or model_dir.name,
                          int(max_model_len or engine_context or context), vocab,
                          EndpointMetrics(executor), max_in_flight)
    _ENDPOINTS[worker] = endpoint = ServingEndpoint(build_app(state, tuple(api_keys), tuple(open_paths)),
                                                    port=port)
    return endpoint


def endpoint_address(worker: str | None = None) -> str | None:
    """URL of the endpoint in this process (any, or the named worker's); None if none runs.
    From a Dask client: `client.run(endpoint_address)` maps worker address -> URL."""
    if worker is not None:
        ep = _ENDPOINTS.get(worker)
        return ep.url if ep else None
    return next((ep.url for ep in _ENDPOINTS.values()), None)


def stop_endpoint(worker: str) -> None:
    endpoint = _ENDPOINTS.pop(worker, None)
    if endpoint is not None:
        endpoint.close()
