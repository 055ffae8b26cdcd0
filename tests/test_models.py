import dataclasses
import hashlib
import json

import pytest

from core.config import ModelsConfig
from rose.models import build as build_mod
from rose.models.build import BuildSpec, Dims, build_models
from core.chat import ChatTokens
from rose.models.demos import Demo, corpus, demonstrations
from rose.models.tokenizer import train_tokenizer
from rose.models.warmup import encode_demo
from tests.tiny_models import TINY


def test_spec_validation():
    with pytest.raises(ValueError, match="head_dim 16"):
        Dims(hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16, intermediate=64)
    with pytest.raises(ValueError, match="kv_heads"):
        Dims(hidden=96, layers=1, heads=3, kv_heads=2, head_dim=32, intermediate=64)
    with pytest.raises(ValueError, match="serving dims"):
        BuildSpec(serving=Dims(hidden=100, layers=1, heads=2, kv_heads=1, head_dim=32, intermediate=64))


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(corpus(demonstrations({"frozenlake": 30, "guess": 15}, 0.2, 0)), 400)


def _cfg(root, seed=0):
    return ModelsConfig(policy_dir=root / "policy", serving_dir=root / "serving", seed=seed)


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- tokenizer and chat format ----------------------------------------------------------------


def test_special_tokens_and_byte_level_roundtrip(tokenizer):
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert ids == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert 259 < len(tokenizer) <= 400
    for text in ["Down", "Ünïcødé ☃ 🙃\t\n", "P . H .\n. . . G"]:
        enc = tokenizer.encode(text, add_special_tokens=False)
        assert 0 not in enc and tokenizer.decode(enc) == text  # no unknowns, lossless


def test_chat_template_matches_chat_tokens(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    msgs = [{"role": "system", "content": "You are P."}, {"role": "user", "content": "P . H .\nYour move?"}]
    expected_text = ("<|im_start|>system\nYou are P.<|im_end|>\n<|im_start|>user\nP . H .\nYour move?"
                     "<|im_end|>\n<|im_start|>assistant\n")
    for tok in (tokenizer, loaded):
        chat = ChatTokens(tok)
        assert tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == expected_text
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert list(ids) == chat.system("You are P.") + chat.user_turn("P . H .\nYour move?")
        assert chat.decode(chat.system("x"), skip_special_tokens=False) == "<|im_start|>system\nx<|im_end|>\n"


def test_chat_tokens_reply_closing(tokenizer):
    chat = ChatTokens(tokenizer)
    assert chat.eos_id == 2 and chat.assistant_end_ids == tokenizer.encode("\n", add_special_tokens=False)
    reply = chat.reply("Down")
    assert reply[-1] == chat.eos_id and chat.decode(reply) == "Down"
    assert chat.close_reply(reply) == chat.assistant_end_ids  # ended with EOS: newline only
    assert chat.close_reply(reply[:-1]) == [chat.eos_id] + chat.assistant_end_ids  # cut at max tokens
    assert chat.user_turn("hi")[-len(chat.generation_prompt_ids):] == chat.generation_prompt_ids
    with pytest.raises(ValueError, match="special tokens"):

        class NoChat:  # unknown strings map to the unknown token, as in HF tokenizers
            def convert_tokens_to_ids(self, t):
                return 9

            def convert_ids_to_tokens(self, i):
                return "<unk>"

        ChatTokens(NoChat())


def test_warmup_loss_covers_replies_only(tokenizer):
    chat = ChatTokens(tokenizer)
    demo = Demo("frozenlake", "Rules.", [("P . . G", "Right"), ("Wall.\n. P . G", "Right")])
    ids, mask = encode_demo(chat, demo)
    assert len(ids) == len(mask)
    trained = [i for i, m in zip(ids, mask) if m]
    assert trained == chat.reply("Right") * 2  # the replies and their EOS, nothing else
    assert ids[: len(chat.system("Rules."))] == chat.system("Rules.")


# -- build ------------------------------------------------------------------------------------


def test_build_is_deterministic_and_loads(tmp_path):
    from transformers import AutoConfig

    a, b = build_models(_cfg(tmp_path / "a"), spec=TINY), build_models(_cfg(tmp_path / "b"), spec=TINY)
    c = build_models(_cfg(tmp_path / "c", seed=1), spec=TINY)
    for i in range(2):
        assert _sha(a[i] / "model.safetensors") == _sha(b[i] / "model.safetensors")
        assert _sha(a[i] / "tokenizer.json") == _sha(b[i] / "tokenizer.json")
        assert _sha(a[i] / "model.safetensors") != _sha(c[i] / "model.safetensors")
    policy, serving = a
    pc, sc = AutoConfig.from_pretrained(str(policy)), AutoConfig.from_pretrained(str(serving))
    assert pc.architectures == ["Qwen3ForCausalLM"] and sc.architectures == ["Qwen2ForCausalLM"]
    assert (pc.hidden_size, sc.hidden_size) == (32, 64)
    assert json.loads((policy / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert _sha(policy / "tokenizer.json") == _sha(serving / "tokenizer.json")
    # transformers picks the tokenizer class from the model type for qwen2 dirs: same tokens anyway
    from transformers import AutoTokenizer

    tp, ts = AutoTokenizer.from_pretrained(str(policy)), AutoTokenizer.from_pretrained(str(serving))
    for text in ["Higher than 32.", "P . H .\n. . . G", "Ünïcødé ☃ 🙃", "  x  "]:
        assert tp.encode(text, add_special_tokens=False) == ts.encode(text, add_special_tokens=False)
    meta = json.loads((policy / "rose_build.json").read_text())
    assert meta["warmup"]["steps"] == 3 and meta["kind"] == "policy"
    assert not [p for p in tmp_path.glob("*/.*")]  # no temp dirs left behind

    from rose.models.evaluate import load_policy, run_episode

    model, tok = load_policy(policy)
    assert model.config.vocab_size == len(tok)
    episode = run_episode(model, ChatTokens(tok), "frozenlake", seed=0)
    assert 0 < episode["turns"] <= 8 and isinstance(episode["success"], bool)


def test_build_skips_when_built_and_force_rebuilds(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    build_models(cfg, spec=TINY)
    calls = []
    real = build_mod._build_one
    monkeypatch.setattr(build_mod, "_build_one", lambda kind, *a: calls.append(kind) or real(kind, *a))
    build_models(cfg, spec=TINY)
    assert calls == []
    build_models(cfg, spec=TINY, force=True)
    assert calls == ["policy", "serving"]
    other = dataclasses.replace(TINY, noise=0.5)  # another spec: both are stale
    calls.clear()
    build_models(cfg, spec=other)
    assert calls == ["policy", "serving"]


def test_failed_build_keeps_previous_one(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    policy, _ = build_models(cfg, spec=TINY)
    before = _sha(policy / "model.safetensors")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(build_mod, "_publish", boom)
    with pytest.raises(OSError, match="disk full"):
        build_models(cfg, spec=TINY, force=True)
    assert _sha(policy / "model.safetensors") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy", "serving"]


def test_missing_policy_dir_is_a_clear_error(tmp_path):
    from rose.models.evaluate import load_policy

    with pytest.raises(FileNotFoundError, match="no model in"):
        load_policy(tmp_path / "nope")
