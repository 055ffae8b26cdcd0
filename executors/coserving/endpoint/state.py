"""What one serving endpoint holds: its executor, tokenizer, model facts, metrics, and what it
has admitted. A request beyond what the engine can serve within its SLO (the serving profile's
prediction, executors/policies/endpoint_admission.py) is answered 503 with Retry-After at once,
never queued; an executor with no profile (a stand-in) gets the fixed bound alone.

Serving first at the door: the refusal is judged at serving's own slowdown (measured on serving
steps). Where the device's contended slowdown (the rollout steps' too) would refuse a user that
serving alone could serve, and rollout turns hold the device, the rollout side yields instead
(no rollout step for the TTFT SLO, a KV cut where serving lacks room) and the user is admitted."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from executors.coserving.endpoint.metrics import EndpointMetrics
from executors.coserving.endpoint.protocol import APIError
from executors.policies.endpoint_admission import EndpointAdmission


class ServingExecutor(Protocol):
    """What the endpoint needs from executors/coserving/executor.py's CoServingExecutor."""

    def submit_serving(self, prompt_ids: list[int], max_tokens: int, *, ignore_eos: bool = False,
                       temperature: float = 0.0, on_token: Callable | None = None,
                       request_id: str | None = None) -> Any: ...

    def abort_serving(self, request_id: str) -> None: ...

    def metrics(self) -> dict: ...


MAX_IN_FLIGHT = 256  # hard cap per endpoint whatever the profile says: the worker's memory


def endpoint_admission(executor: Any, hard_cap: int) -> EndpointAdmission | None:
    """The SLO admission for this executor's serving profile and SLO; None without them."""
    profile, slo = getattr(executor, "serving_profile", None), getattr(executor, "slo", None)
    if profile is None or slo is None:
        return None
    # the engine's decode batch (max_num_seqs); the profile's largest batch where none is known
    max_batch = getattr(getattr(executor, "cfg", None), "max_num_seqs", None)
    return EndpointAdmission(profile, slo, hard_cap, max_batch)


class EndpointState:
    """Touched on the event loop only (the engine thread hands tokens over with
    call_soon_threadsafe), so the counts need no lock."""

    def __init__(self, executor: ServingExecutor, tokenizer, model_name: str, max_model_len: int,
                 vocab_size: int, metrics: EndpointMetrics, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.executor, self.tokenizer, self.model_name = executor, tokenizer, model_name
        self.max_model_len, self.vocab_size, self.metrics = max_model_len, vocab_size, metrics
        self.max_in_flight, self.admission = max_in_flight, endpoint_admission(executor, max_in_flight)
        self.admitted: set[str] = set()  # request ids admitted and not yet released
        self.waiting: dict[str, int] = {}  # admitted, before their first token: prompt tokens
        self.waiting_tokens = 0

    @property
    def in_flight(self) -> int:
        return len(self.admitted)

    def slowdown(self) -> float:
        """Serving's own measured / profiled step time (1.0 where the executor measures none)."""
        return float(getattr(self.executor, "serving_slowdown", 1.0))

    def shared_slowdown(self) -> float:
        """The device's slowdown with the rollout steps' counted in (the larger of the two)."""
        rollout = float(getattr(self.executor, "rollout_slowdown", 1.0))
        return max(self.slowdown(), rollout)

    def _rollout_busy(self) -> bool:
        busy = getattr(self.executor, "rollout_busy", None)
        return bool(busy()) if busy is not None else False

    def admit(self, rid: str, prompt_len: int) -> None:
        """Admit request `rid` or refuse it at once (503, Retry-After): the requests admitted
        keep their SLO and the worker its memory. Every admit is paired with a release."""
        if self.admission is None:
            if self.in_flight >= self.max_in_flight:
                self._refuse(f"at its limit of {self.max_in_flight} requests in flight")
        else:
            if self.admission.slo is not getattr(self.executor, "slo", self.admission.slo):
                self.admission = endpoint_admission(self.executor, self.max_in_flight)  # SLO set anew
            d = self.admission.decide(prompt_len, self.waiting_tokens, self.in_flight,
                                      self.slowdown())
            if d.admitted and self._rollout_busy() and not self.admission.decide(
                    prompt_len, self.waiting_tokens, self.in_flight, self.shared_slowdown()).admitted:
                self.executor.yield_to_user(prompt_len)  # serving first: rollout steps back off
                self.metrics.yielded_to_users.inc()
            if d.reason == "hard_cap":
                self._refuse(f"at its limit of {self.max_in_flight} requests in flight")
            if d.reason == "decode_batch":
                self._refuse(f"at the largest decode batch meeting its TPOT SLO "
                             f"({self.in_flight} requests in flight)")
            if d.reason == "ttft":
                self._refuse(f"predicting a TTFT of {d.predicted_ttft_s:.3f} s against its "
                             f"SLO of {self.admission.slo.ttft_s:.3f} s")
            if not d.admitted:
                self._refuse(d.reason)
        self.admitted.add(rid)
        self.waiting[rid] = prompt_len
        self.waiting_tokens += prompt_len

    @staticmethod
    def _refuse(why: str) -> None:
        raise APIError(503, f"the serving endpoint is {why}; retry later", kind="server_error",
                       code="overloaded")

    def first_token(self, rid: str) -> None:
        """Its prompt is prefilled: no longer ahead of a new request's first token."""
        self.waiting_tokens -= self.waiting.pop(rid, 0)

    def release(self, rid: str) -> None:
        """Finished, failed or its client went away; idempotent."""
        self.first_token(rid)
        self.admitted.discard(rid)
