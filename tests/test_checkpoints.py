"""Checkpoints: atomic save, keep-last-K, tied weights, resume state, clear errors."""
from __future__ import annotations

import pytest
import torch

from storage.checkpoints import (CorruptCheckpoint, checkpoint_steps, load_latest_checkpoint,
                                 save_checkpoint)


def tiny_training(steps: int = 2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    model[1].weight = model[0].weight  # tied, like lm_head and embeddings
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(torch.tensor([1, 2, 3])).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def test_save_and_load_round_trip(tmp_path):
    model, opt = tiny_training()
    state = model.state_dict()  # "0.weight" and "1.weight" share storage
    path = save_checkpoint(tmp_path, 5, state, opt.state_dict(), {"run": "demo", "version": 5})
    assert path == tmp_path / "step-00000005"
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "model.safetensors",
                                                      "optimizer.pt"]
    ckpt = load_latest_checkpoint(tmp_path)
    assert ckpt.step == 5 and ckpt.path == path and ckpt.meta == {"run": "demo", "version": 5}
    for name, t in state.items():
        assert torch.equal(ckpt.model_state[name], t), name
    # the optimizer resumes exactly: the next step matches an uninterrupted run
    model2, opt2 = tiny_training(steps=0)
    model2.load_state_dict(ckpt.model_state)
    opt2.load_state_dict(ckpt.optimizer_state)
    ref_model, _ = tiny_training(steps=3)
    loss = model2(torch.tensor([1, 2, 3])).pow(2).mean()
    opt2.zero_grad()
    loss.backward()
    opt2.step()
    for a, b in zip(model2.state_dict().values(), ref_model.state_dict().values()):
        assert torch.equal(a, b)


def test_keeps_last_k_and_latest_wins(tmp_path):
    model, opt = tiny_training(steps=0)
    for step in (1, 2, 10, 3):
        save_checkpoint(tmp_path, step, model.state_dict(), opt.state_dict(), {"s": step}, keep=2)
    assert checkpoint_steps(tmp_path) == [3, 10]  # numeric order, not name order
    assert load_latest_checkpoint(tmp_path).meta == {"s": 10}


def test_resave_same_step_replaces(tmp_path):
    model, opt = tiny_training(steps=0)
    save_checkpoint(tmp_path, 4, model.state_dict(), opt.state_dict(), {"try": 1})
    save_checkpoint(tmp_path, 4, model.state_dict(), opt.state_dict(), {"try": 2})
    assert checkpoint_steps(tmp_path) == [4]
    assert load_latest_checkpoint(tmp_path).meta == {"try": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000004"]


def test_failed_save_leaves_previous_intact(tmp_path):
    model, opt = tiny_training(steps=0)
    save_checkpoint(tmp_path, 1, model.state_dict(), opt.state_dict(), {})
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, 2, {"w": "not a tensor"}, opt.state_dict(), {})
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, 2, model.state_dict(), opt.state_dict(), {"bad": object()})
    assert checkpoint_steps(tmp_path) == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000001"]  # no temp dir left


def test_none_when_empty_and_clear_error_when_corrupt(tmp_path):
    assert load_latest_checkpoint(tmp_path / "absent") is None
    assert load_latest_checkpoint(tmp_path) is None
    model, opt = tiny_training(steps=0)
    path = save_checkpoint(tmp_path, 1, model.state_dict(), opt.state_dict(), {})
    (path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CorruptCheckpoint, match=f"checkpoint {path} unreadable"):
        load_latest_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="step"):
        save_checkpoint(tmp_path, -1, model.state_dict(), opt.state_dict(), {})
