"""What one serving endpoint holds: its executor, tokenizer, model facts, metrics, and the bound
on requests in flight (a flood is answered 503 with Retry-After at once, never queued)."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from executors.coserving.endpoint.metrics import EndpointMetrics
from executors.coserving.endpoint.protocol import APIError


class ServingExecutor(Protocol):
    """What the endpoint needs from executors/coserving/executor.py's CoServingExecutor."""

    def submit_serving(self, prompt_ids: list[int], max_tokens: int, *, ignore_eos: bool = False,
                       temperature: float = 0.0, on_token: Callable | None = None,
                       request_id: str | None = None) -> Any: ...

    def abort_serving(self, request_id: str) -> None: ...

    def metrics(self) -> dict: ...


MAX_IN_FLIGHT = 256  # requests at once per endpoint; beyond it 503 + Retry-After, not a queue


class EndpointState:
    def __init__(self, executor: ServingExecutor, tokenizer, model_name: str, max_model_len: int,
                 vocab_size: int, metrics: EndpointMetrics, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.executor, self.tokenizer, self.model_name = executor, tokenizer, model_name
        self.max_model_len, self.vocab_size, self.metrics = max_model_len, vocab_size, metrics
        self.max_in_flight, self.in_flight = max_in_flight, 0  # touched on the event loop only

    def admit(self) -> None:
        """A flood is answered at once (503, Retry-After), never queued without bound: the
        requests admitted keep their latency and the worker its memory."""
        if self.in_flight >= self.max_in_flight:
            raise APIError(503, f"the serving endpoint is at its limit of {self.max_in_flight} "
                           "requests in flight; retry later", kind="server_error",
                           code="overloaded")
        self.in_flight += 1
