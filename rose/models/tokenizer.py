"""A small byte-level BPE tokenizer trained on environment text, saved as a HF fast tokenizer.

Byte-level, so any reply (garbage, unicode) encodes without an unknown token. Special tokens
come first (ids 0, 1, 2) so they are the same in every build. It uses Qwen2's pipeline (NFC,
Qwen's split regex, byte level) and is saved as a `Qwen2Tokenizer`: transformers loads every
qwen2-type model directory with that class whatever tokenizer_config.json says, rebuilding
the pipeline from vocab and merges, so any other pipeline would tokenize differently there.
"""
from __future__ import annotations

import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from core.chat import IM_END, IM_START, PAD

SPECIAL_TOKENS = [PAD, IM_START, IM_END]

# Qwen-style template; every message, then the generation prompt. Must render exactly the
# pieces core.chat.ChatTokens encodes.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int = 768):
    """A Qwen2Tokenizer trained on `texts` (deterministic for the same texts)."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must cover the 256 bytes and the special tokens, got {vocab_size}")
    # Single-threaded training: merge ties then resolve the same way on every run.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
              for m in json.loads(tok.to_str())["model"]["merges"]]
    fast = Qwen2Tokenizer(
        vocab=tok.get_vocab(), merges=merges, eos_token=IM_END, pad_token=PAD, unk_token=None,
        model_max_length=2048, clean_up_tokenization_spaces=False,
    )
    fast.add_special_tokens({"additional_special_tokens": [AddedToken(IM_START, special=True)]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tokenizer, out_dir) -> None:
    tokenizer.save_pretrained(str(out_dir))
