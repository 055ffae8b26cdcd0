"""Token-level chat format shared by rollout and warm-up (Qwen style).

    <|im_start|>role\\n{text}<|im_end|>\\n

A trajectory is one growing token list: system, then per turn `user_turn(observation)`
(which ends with the generation prompt `<|im_start|>assistant\\n`), the generated reply ids
(ending with `<|im_end|>`), then `assistant_end_ids`. Nothing is ever re-tokenized, so the
ids the trainer scores are exactly the ids the engine sampled.

Each piece between special tokens is encoded on its own, exactly as a tokenizer splits a
rendered chat-template string at special tokens, so `system(s) + user_turn(u)` equals
`apply_chat_template([system, user], add_generation_prompt=True)`.
"""
from __future__ import annotations

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|endoftext|>"


class ChatTokens:
    def __init__(self, tokenizer) -> None:
        """`tokenizer`: a Hugging Face tokenizer (transformers or vLLM's wrapper of one)."""
        self.tokenizer = tokenizer
        ids = [tokenizer.convert_tokens_to_ids(t) for t in (IM_START, IM_END, PAD)]
        if any(i is None or tokenizer.convert_ids_to_tokens(i) != t for i, t in zip(ids, (IM_START, IM_END, PAD))):
            raise ValueError(f"tokenizer lacks the chat special tokens {IM_START}, {IM_END}, {PAD}")
        self.im_start_id, self.eos_id, self.pad_id = ids
        self._newline = self._encode("\n")
        self._gen_prompt = [self.im_start_id] + self._encode("assistant\n")

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def message(self, role: str, text: str) -> list[int]:
        """One closed message: <|im_start|>role\\n{text}<|im_end|>\\n."""
        return [self.im_start_id] + self._encode(f"{role}\n{text}") + [self.eos_id] + self._newline

    def system(self, text: str) -> list[int]:
        return self.message("system", text)

    def user_turn(self, text: str) -> list[int]:
        """The user message followed by the generation prompt <|im_start|>assistant\\n."""
        return self.message("user", text) + self._gen_prompt

    def reply(self, text: str) -> list[int]:
        """A reply as the model should produce it after the generation prompt (ends with EOS).
        Used for demonstrations; at rollout the sampled ids are kept as they are."""
        return self._encode(text) + [self.eos_id]

    @property
    def generation_prompt_ids(self) -> list[int]:
        return list(self._gen_prompt)

    @property
    def assistant_end_ids(self) -> list[int]:
        """What follows a generated reply that ended with EOS (the newline after <|im_end|>)."""
        return list(self._newline)

    def close_reply(self, reply_ids: list[int]) -> list[int]:
        """Ids that complete a generated reply: EOS if generation stopped at the token limit,
        then the newline. Append these before the next user_turn."""
        return ([] if reply_ids and reply_ids[-1] == self.eos_id else [self.eos_id]) + self._newline

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
