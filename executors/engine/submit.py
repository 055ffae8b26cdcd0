"""Token prompts into an in-process vLLM engine: sampling parameters and add_request in one place.

The co-serving executor's serving side, rollout side and profiler all submit token ids (never
text: detokenize off) and read outputs as deltas; only this package imports vLLM.
"""
from __future__ import annotations


def add_tokens(engine, request_id: str, prompt_ids: list[int], *, max_tokens: int,
               temperature: float, ignore_eos: bool = False, top_p: float = 1.0,
               seed: int | None = None, logprobs: int | None = None,
               stop_token_ids: list[int] | None = None) -> str:
    """Add one request whose outputs stream as deltas; returns the engine's request id.
    Whatever vLLM refuses (e.g. longer than max_model_len) raises from here."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                            seed=seed, logprobs=logprobs, ignore_eos=ignore_eos,
                            detokenize=False, stop_token_ids=stop_token_ids or None,
                            output_kind=RequestOutputKind.DELTA)
    return engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt_ids), params)
