"""A stand-in serving executor (no engine) with CoServingExecutor's serving API, for fast
endpoint and replay tests. Token i of a request is (last prompt id + i + 1) mod 400 + 10, so
outputs are predictable; a prompt whose first id is FAIL_ID makes the "engine" fail."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

FAIL_ID = 7


@dataclass
class FakeResult:
    request_id: str
    output_ids: list[int]
    arrival: float
    first_token_at: float
    token_times: list[float] = field(default_factory=list)
    ttft_s: float = 0.0
    tpot_s: float | None = None
    finish_reason: str = "length"


def expected_ids(prompt_ids: list[int], n: int) -> list[int]:
    return [(prompt_ids[-1] + i + 1) % 400 + 10 for i in range(n)]


def _settle(fut: Future, result: FakeResult) -> None:
    try:
        fut.set_result(result)
    except InvalidStateError:  # the other side (abort or finish) got there first
        pass


class FakeServingExecutor:
    def __init__(self, token_s: float = 0.001) -> None:
        self.token_s = token_s
        self.submitted: list[tuple[list[int], int, bool, float]] = []
        self._lock = threading.Lock()
        self.futures: dict[str | None, Future] = {}
        self.aborted: list[str] = []

    def submit_serving(self, prompt_ids, max_tokens, *, ignore_eos=False, temperature=0.0,
                       on_token=None, request_id=None) -> Future:
        fut: Future = Future()
        self.futures[request_id] = fut
        with self._lock:
            self.submitted.append((list(prompt_ids), max_tokens, ignore_eos, temperature))
            rid = str(len(self.submitted))

        def run() -> None:
            arrival = time.monotonic()
            if prompt_ids[0] == FAIL_ID:
                fut.set_exception(RuntimeError("simulated engine failure"))
                return
            out, times = [], []
            for tok in expected_ids(prompt_ids, max_tokens):
                time.sleep(self.token_s)
                out.append(tok)
                times.append(time.monotonic())
                if fut.done():  # aborted
                    return
                if on_token is not None:
                    on_token(tok, times[-1])
            tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
            _settle(fut, FakeResult(rid, out, arrival, times[0], times, times[0] - arrival, tpot))

        threading.Thread(target=run, daemon=True).start()
        return fut

    def abort_serving(self, request_id: str) -> None:
        self.aborted.append(request_id)
        fut = self.futures.get(request_id)
        if fut is not None:
            _settle(fut, FakeResult(request_id, [], 0.0, None, finish_reason="abort"))

    def metrics(self) -> dict:
        return {"rollout_tokens": 123, "admission": {"admitted": 4, "refused": 2},
                "mode": "fake"}


def fake_model_dir(path, vocab_size: int = 300, context: int = 256):
    """A model directory with only what the endpoint reads: a tokenizer with the chat template
    and config.json (vocab, context). No weights: the fake executor needs none."""
    import json
    from pathlib import Path

    from rose.models.tokenizer import save_tokenizer, train_tokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    texts = ["hello world, the lake is frozen", "go left, go right, up and down"] * 20
    save_tokenizer(train_tokenizer(texts, vocab_size), path)
    (path / "config.json").write_text(json.dumps({"vocab_size": vocab_size,
                                                  "max_position_embeddings": context}))
    return path


def post_all(url: str, bodies: list[dict]) -> tuple[list, list]:
    """POST every body to `url` at once (one client, concurrent); the answers as (status,
    Retry-After, text), split into (served: 200, refused: 503). Anything else fails here."""
    import asyncio

    import httpx

    async def one(client, body):
        r = await client.post(url, json=body)
        return r.status_code, r.headers.get("retry-after"), r.text

    async def flood():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(one(client, b) for b in bodies))

    answers = asyncio.run(flood())
    served = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 503]
    assert len(served) + len(refused) == len(answers), [a[:2] for a in answers]
    return served, refused
