"""Hypothesis strategies for fuzzing an OpenAI-compatible endpoint: from arbitrary bytes and JSON
to near-valid completions and chat requests (wrong types, out-of-range numbers, unknown fields,
token ids outside the vocabulary, streaming on and off). Shared by tests/test_endpoint_fuzz.py
and bench/coserving/endpoint_fuzz.py."""
from __future__ import annotations

import json

from hypothesis import strategies as st

scalars = st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=20)
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                                max_size=4),
                        max_leaves=12)


def requests(model_name: str, vocab: int, context: int, max_out: int | None = None) -> st.SearchStrategy:
    """(path, body) pairs for a served model of `vocab` token ids and `context` tokens;
    `max_out` bounds the valid max_tokens drawn (default 2 x context: many out of range)."""
    top = max_out if max_out is not None else 2 * context
    numbers = st.integers(-5, top) | st.floats(-1, 3, allow_nan=False) | anything
    prompts = (st.text(max_size=60) | st.lists(st.integers(-3, vocab + 3), max_size=40)
               | st.lists(st.text(max_size=10), max_size=3) | anything)
    sampling = {"max_tokens": numbers, "temperature": numbers, "top_p": numbers,
                "stream": st.booleans() | anything, "ignore_eos": st.booleans() | anything, "n": numbers,
                "stop": anything, "user": anything,
                "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | anything})}
    model = st.sampled_from([model_name, "", "other"]) | anything
    completions = st.fixed_dictionaries({"model": model, "prompt": prompts}, optional=sampling)
    messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "bot"])
                                               | anything, "content": st.text(max_size=40) | anything}),
                        max_size=4) | anything
    chats = st.fixed_dictionaries({"model": model, "messages": messages}, optional=sampling)
    return st.one_of(
        st.tuples(st.just("/v1/completions"), completions.map(json.dumps)),
        st.tuples(st.just("/v1/chat/completions"), chats.map(json.dumps)),
        st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
                  st.binary(max_size=120) | anything.map(json.dumps)))
