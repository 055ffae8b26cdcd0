"""A small byte-level BPE tokenizer trained on environment text, saved as a HF fast tokenizer.

Byte-level, so any reply (garbage, unicode) encodes without an unknown token. Special tokens
come first (ids 0, 1, 2) so they are the same in every build.
"""
from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rose.models.chat import IM_END, IM_START, PAD

SPECIAL_TOKENS = [PAD, IM_START, IM_END]

# Qwen-style template; every message, then the generation prompt. Must render exactly the
# pieces rose.models.chat.ChatTokens encodes.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int = 768):
    """A PreTrainedTokenizerFast trained on `texts` (deterministic for the same texts)."""
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must cover the 256 bytes and the special tokens, got {vocab_size}")
    # Single-threaded training: merge ties then resolve the same way on every run.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tokenizer, out_dir: Path) -> None:
    tokenizer.save_pretrained(str(out_dir))
