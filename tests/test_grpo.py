"""GRPO math against values worked out by hand."""
import math

import pytest
import torch

from core.grpo import assemble_trajectory, group_advantages, grpo_loss, token_logprobs
from tasks.reward import advantages_by_trajectory


def test_group_advantages_hand_computed():
    # group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(4*0.25/3) = 0.57735
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    assert torch.allclose(adv, torch.tensor([[0.866025, -0.866025, -0.866025, 0.866025]]), atol=1e-5)


def test_group_with_equal_rewards_has_zero_advantage():
    adv = group_advantages(torch.tensor([[0.3, 0.3, 0.3], [1.0, 0.0, 2.0]]))
    assert torch.equal(adv[0], torch.zeros(3))
    assert adv[1, 2] > 0 > adv[1, 1]


def test_group_advantages_rejects_bad_shape():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.tensor([[1.0], [0.0]]))


def test_assemble_trajectory_masks_only_generated_tokens():
    turns = [([1, 2, 3], [10, 11]), ([1, 2, 3, 10, 11, 4, 5], [12])]
    ids, mask = assemble_trajectory(turns)
    assert ids == [1, 2, 3, 10, 11, 4, 5, 12]
    assert mask == [0, 0, 0, 1, 1, 0, 0, 1]


def test_assemble_trajectory_rejects_inconsistent_history():
    with pytest.raises(ValueError, match="turn 1"):
        assemble_trajectory([([1, 2], [3]), ([1, 9, 3], [4])])


def test_token_logprobs_picks_next_token():
    logits = torch.zeros(1, 3, 2)
    logits[0, 0, 1] = math.log(3.0)  # p(token 1 | pos 0) = 3/4
    lp = token_logprobs(logits, torch.tensor([[0, 1, 0]]))
    assert lp.shape == (1, 2)
    assert lp[0, 0].item() == pytest.approx(math.log(0.75))
    assert lp[0, 1].item() == pytest.approx(math.log(0.5))


def test_grpo_loss_hand_computed_with_clipping():
    # two tokens of one sequence, advantage +1; ratios 1.5 (clipped to 1.2) and 0.5
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 0.5]]))
    loss, stats = grpo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), clip_eps=0.2)
    # per token: -min(1.5, 1.2) = -1.2 ; -min(0.5, 0.8) = -0.5 ; mean = -0.85
    assert loss.item() == pytest.approx(-0.85)
    assert stats.clip_fraction == pytest.approx(1.0)  # both ratios outside [0.8, 1.2]
    assert stats.tokens == 2


def test_grpo_loss_negative_advantage_and_mask():
    old = torch.zeros(2, 2)
    new = torch.log(torch.tensor([[0.5, 3.0], [1.0, 1.0]]))
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    loss, _ = grpo_loss(new, old, torch.tensor([-1.0, 2.0]), mask, clip_eps=0.2)
    # seq 0 (A=-1), token 0 ratio .5: -min(-.5, -.8) = .8 ; token 1 masked out
    # seq 1 (A=2), ratios 1: -2 per token -> -2 ; mean over sequences = (0.8 - 2)/2
    assert loss.item() == pytest.approx(-0.6)


def test_grpo_loss_kl_k3_term():
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    loss, stats = grpo_loss(logp, logp.clone(), torch.tensor([0.0]), torch.ones(1, 1),
                            ref_logp=ref, kl_coef=0.1)
    delta = math.log(0.25) - math.log(0.5)
    k3 = math.exp(delta) - delta - 1
    assert stats.kl == pytest.approx(k3)
    assert loss.item() == pytest.approx(0.1 * k3)


def test_grpo_loss_gradient_pushes_up_positive_advantage():
    logp = torch.tensor([[-1.0]], requires_grad=True)
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 1))
    loss.backward()
    assert logp.grad.item() < 0  # descending the loss raises log p


def test_advantages_by_trajectory_groups_and_rejects_ragged():
    rows = [{"trajectory": f"g{g}t{t}", "group": g, "trajectory_reward": r}
            for g, rs in enumerate([[1.0, 0.0], [0.0, 0.0]]) for t, r in enumerate(rs)]
    adv = advantages_by_trajectory(rows)
    # mean 0.5, unbiased std sqrt(0.5): advantage 0.5 / sqrt(0.5)
    assert adv["g0t0"] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6))
    assert adv["g1t0"] == 0.0
    with pytest.raises(ValueError, match="unequal"):
        advantages_by_trajectory(rows[:-1])
