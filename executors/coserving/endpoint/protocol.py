"""The OpenAI request shapes the serving endpoint accepts, their validation, and the response
shapes it sends back.

Kept apart from the HTTP server so the rules are testable without an engine: a request either
becomes a `Generation` (token ids + sampling) or raises `APIError` with an HTTP status and a
one-line message naming the problem, in OpenAI's error format.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      ValidationError)

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
Number = Union[StrictInt, StrictFloat]  # "0.5" (a string) is a wrong type, not a number


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


class _Sampling(BaseModel):
    # Clients send many optional fields (user, seed, ...): unknown ones are ignored, known
    # ones are type-checked strictly ("10" is not an integer).
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: Number = Field(1.0, ge=0.0, le=2.0)
    top_p: Number = Field(1.0, gt=0.0, le=1.0)
    stream: StrictBool = False
    ignore_eos: StrictBool = False  # vLLM extension: generate exactly max_tokens
    n: StrictInt = 1
    stream_options: dict | None = None


class CompletionBody(_Sampling):
    prompt: Union[StrictStr, list[StrictInt], list[StrictStr], list[list[StrictInt]]]
    echo: StrictBool = False
    suffix: StrictStr | None = None
    best_of: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    logprobs: StrictInt | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: StrictStr | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatBody(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None  # the newer name of max_tokens
    stop: StrictStr | list[StrictStr] | None = None
    logprobs: StrictBool | None = None
    tools: list | None = None
    response_format: dict | None = None


@dataclass
class Generation:
    """A validated request, ready for the executor."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    ignore_eos: bool
    stream: bool
    include_usage: bool


def parse_body(raw: bytes, shape: type[BaseModel]) -> BaseModel:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(data).__name__}")
    try:
        return shape.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        # Drop pydantic's union-branch tags ("int", "list[int]", "function-after[...]").
        parts = [str(p) for p in err["loc"] if isinstance(p, int) or not (
            p in ("int", "float", "str", "bool") or "[" in p or "-" in p)]
        loc = ".".join(parts) or "body"
        if err["type"] == "missing":
            raise APIError(400, f"missing required field '{loc}'", param=loc) from None
        raise APIError(400, f"invalid '{loc}': {err['msg']}", param=loc) from None


def _refuse_unsupported(body: BaseModel) -> None:
    # Silently ignoring these would return something other than what was asked for.
    unsupported = {"n": 1, "best_of": None, "echo": False, "suffix": None, "stop": None,
                   "logprobs": None, "tools": None, "response_format": None, "top_p": 1.0}
    for name, default in unsupported.items():
        value = getattr(body, name, default)
        if value not in (default, None) and not (name == "best_of" and value == 1):
            raise APIError(400, f"'{name}'={value!r} is not supported by this endpoint", param=name)


def check_model(requested: str, served: str) -> None:
    if requested != served:
        raise APIError(404, f"model '{requested}' does not exist; this endpoint serves '{served}'",
                       param="model", code="model_not_found")


def completion_prompt(body: CompletionBody, tokenizer, vocab_size: int) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise APIError(400, f"batched prompts ({len(prompt)}) are not supported; send one "
                           "prompt per request", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = list(tokenizer.encode(prompt, add_special_tokens=False))
    else:
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise APIError(400, f"prompt token id {bad[0]} is outside the vocabulary "
                           f"[0, {vocab_size})", param="prompt")
    if not ids:
        raise APIError(400, "prompt is empty", param="prompt")
    return ids


def chat_prompt(body: ChatBody, tokenizer) -> list[int]:
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # a template may reject role orders it does not know
        raise APIError(400, f"messages do not fit the model's chat template: {e}",
                       param="messages") from None
    return list(tokenizer.encode(text, add_special_tokens=False))


def to_generation(body: BaseModel, prompt_ids: list[int], max_model_len: int) -> Generation:
    """Checks lengths against the context and fills defaults (vLLM's rules)."""
    _refuse_unsupported(body)
    n_prompt = len(prompt_ids)
    if n_prompt >= max_model_len:
        raise APIError(400, f"prompt is too long: {n_prompt} tokens, but the context holds "
                       f"{max_model_len} (prompt + at least one generated token)", param="prompt")
    room = max_model_len - n_prompt
    max_tokens = body.max_tokens
    if max_tokens is None and isinstance(body, ChatBody):
        max_tokens = body.max_completion_tokens
    if max_tokens is None:
        default = COMPLETION_DEFAULT_MAX_TOKENS if isinstance(body, CompletionBody) else room
        max_tokens = min(default, room)
    elif max_tokens < 1:
        raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    elif max_tokens > room:
        raise APIError(400, f"max_tokens is too large: {n_prompt} prompt tokens + {max_tokens} "
                       f"exceed the context of {max_model_len} tokens (at most {room})",
                       param="max_tokens")
    include_usage = bool((body.stream_options or {}).get("include_usage", False))
    return Generation(prompt_ids, max_tokens, float(body.temperature), body.ignore_eos,
                      body.stream, include_usage)


# ---- responses ----

class Detokenizer:
    """Incremental text: decode all ids so far, emit the new suffix; hold back a trailing
    U+FFFD (half of a multi-byte character) until the next token completes it."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.sent = tokenizer, [], ""

    def push(self, ids: list[int], final: bool = False) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


def stream_chunk(kind: str, rid: str, created: int, model: str, text: str | None,
           finish: str | None, first: bool = False) -> dict:
    if kind == "chat":
        delta = ({"role": "assistant", "content": text or ""} if first
                 else ({"content": text} if text else {}))
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [choice]}
    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [choice]}


def usage(gen: Generation, n_out: int) -> dict:
    n_in = len(gen.prompt_ids)
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


def finish_reason(result) -> str:
    reason = getattr(result, "finish_reason", "length")
    if reason not in ("stop", "length"):  # aborted in the engine: not a normal completion
        raise APIError(503, f"request ended early in the engine ({reason}); retry",
                       kind="server_error")
    return reason


def full_response(kind: str, rid: str, created: int, model: str, text: str, finish: str,
                  used: dict) -> dict:
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created, "model": model, "choices": [choice], "usage": used}
