"""Success rate of a policy directory on an environment, with transformers generate.

Independent of vLLM on purpose: a quick check of a built or trained policy. Turns are laid
out with ChatTokens exactly as rollout lays them out.
"""
from __future__ import annotations

from pathlib import Path

import torch

from envs.registry import make_env
from core.chat import ChatTokens


def load_policy(policy_dir: Path | str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy_dir = Path(policy_dir)
    if not (policy_dir / "config.json").is_file():
        raise FileNotFoundError(f"no model in {policy_dir} (run `rose models build`)")
    tokenizer = AutoTokenizer.from_pretrained(str(policy_dir))
    model = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=torch.float32)
    return model.eval(), tokenizer


@torch.no_grad()
def run_episode(model, chat: ChatTokens, env_name: str, seed: int, temperature: float = 1.0,
                max_tokens_per_turn: int = 12, max_turns: int | None = None) -> dict:
    """One sampled episode; returns success, total reward, turns and the token list."""
    env = make_env(env_name, max_turns=max_turns)
    ids = chat.system(env.system_prompt)
    obs, total = env.reset(seed), 0.0
    while True:
        ids += chat.user_turn(obs)
        prompt = torch.tensor([ids])
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=temperature,
            top_k=0, top_p=1.0, max_new_tokens=max_tokens_per_turn,
            eos_token_id=chat.eos_id, pad_token_id=chat.pad_id,
        )
        reply = out[0, len(ids):].tolist()
        if chat.eos_id in reply:  # generate pads nothing for batch 1, but be safe
            reply = reply[: reply.index(chat.eos_id) + 1]
        result = env.step(chat.decode(reply))
        total += result.reward
        ids += reply + chat.close_reply(reply)
        if result.done:
            return {"success": bool(result.info["success"]), "reward": total, "turns": env.turn, "ids": ids}
        obs = result.observation


def evaluate(policy_dir: Path | str, env_name: str, episodes: int = 100, seed: int = 0,
             temperature: float = 1.0) -> float:
    """Fraction of `episodes` episodes (env seeds seed, seed+1, ...) that succeed."""
    model, tokenizer = load_policy(policy_dir)
    chat = ChatTokens(tokenizer)
    torch.manual_seed(seed)
    wins = sum(run_episode(model, chat, env_name, seed + i, temperature)["success"] for i in range(episodes))
    return wins / max(1, episodes)
