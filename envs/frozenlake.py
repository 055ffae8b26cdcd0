"""Multi-turn text FrozenLake on gymnasium's FrozenLake-v1 (4x4, random map, not slippery).

Each turn the model sees the grid as text, one token-friendly symbol per cell (`P` you,
`H` hole, `G` goal, `.` ice), and replies with a move. Gymnasium runs the dynamics; this
module only renders, parses and scores.
"""
from __future__ import annotations

import re
from collections import deque

import gymnasium as gym
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from envs.base import MultiTurnEnv, StepResult

# gymnasium's action ids
ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}
NAMES = {v: k.capitalize() for k, v in ACTIONS.items()}
_DELTA = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}
_WORD = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)
_LETTER = {"l": 0, "d": 1, "r": 2, "u": 3, "←": 0, "↓": 1, "→": 2, "↑": 3}

SIZE = 4
ASK = "Your move?"
INVALID = "Invalid. Reply Left, Down, Right or Up."


def parse_action(reply: str) -> int | None:
    """The move named in a reply: the first of Left/Down/Right/Up as a word (any case),
    or a lone letter/arrow (`d`, `→`). None if there is none."""
    m = _WORD.search(reply)
    if m:
        return ACTIONS[m.group(1).lower()]
    s = reply.strip().strip(".!").lower()
    return _LETTER.get(s) if len(s) == 1 else None


def read_move(env: MultiTurnEnv, reply: str, board: str) -> tuple[int | None, dict, StepResult | None]:
    """The opening of a grid env's step, shared with Sokoban: count the turn and parse the move;
    (action, info, None), or (None, info, the invalid reply's result) showing `board` again."""
    env._check_running()
    env.turn += 1
    action = parse_action(reply)
    info: dict = {"action": None if action is None else NAMES[action]}
    if action is None:
        return None, info, env._invalid(INVALID + "\n" + board, info)
    env._invalid_in_a_row = 0
    info.update(valid_action=True, turn=env.turn)
    return action, info, None


def next_turn(env: MultiTurnEnv, info: dict, board: str, blocked: str | None) -> StepResult:
    """The close of a grid env's step that ended nothing: out of turns, or the board again
    (after `blocked`, the note for a move that changed nothing)."""
    if env.turn >= env.max_turns:
        return env._finish("Out of turns.", 0.0, "max_turns", info)
    return StepResult((blocked + "\n" if blocked else "") + board + "\n" + ASK, 0.0, False, info)


def goal_distances(desc: list[str]) -> dict[int, int]:
    """BFS distances (in moves) to the goal from every reachable ice cell, avoiding holes."""
    goal = next(r * SIZE + c for r, row in enumerate(desc) for c, ch in enumerate(row) if ch == "G")
    dist = {goal: 0}
    todo = deque([goal])
    while todo:
        s = todo.popleft()
        r, c = divmod(s, SIZE)
        for dr, dc in _DELTA.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < SIZE and 0 <= nc < SIZE and desc[nr][nc] != "H" and nr * SIZE + nc not in dist:
                dist[nr * SIZE + nc] = dist[s] + 1
                todo.append(nr * SIZE + nc)
    return dist


class FrozenLakeEnv(MultiTurnEnv):
    name = "frozenlake"
    system_prompt = (
        "You are P on a frozen lake. H is a hole, G is the goal, . is ice. "
        "Reach G without falling into a hole. Reply with one move: Left, Down, Right or Up."
    )

    def __init__(self, max_turns: int | None = None, p_frozen: float = 0.8) -> None:
        super().__init__(max_turns)
        self.p_frozen = p_frozen
        self.desc: list[str] = []
        self.state = 0
        self._gym: gym.Env | None = None

    def reset(self, seed: int) -> str:
        self.desc = generate_random_map(SIZE, self.p_frozen, seed=seed)
        if self._gym is not None:
            self._gym.close()
        self._gym = gym.make("FrozenLake-v1", desc=self.desc, is_slippery=False)
        self.state, _ = self._gym.reset(seed=seed)
        self._begin()
        return self.render() + "\n" + ASK

    def render(self) -> str:
        rows = []
        for r, row in enumerate(self.desc):
            cells = ["P" if r * SIZE + c == self.state else ("." if ch in "SF" else ch) for c, ch in enumerate(row)]
            rows.append(" ".join(cells))
        return "\n".join(rows)

    def step(self, reply: str) -> StepResult:
        action, info, invalid = read_move(self, reply, self.render())
        if invalid is not None:
            return invalid
        before = self.state
        self.state, _, terminated, _, _ = self._gym.step(action)
        cell = self.desc[self.state // SIZE][self.state % SIZE]
        if cell == "G":
            info["success"] = True
            return self._finish("You reached the goal!", 1.0, "goal", info)
        info["success"] = False
        if cell == "H":
            return self._finish("You fell into a hole.", 0.0, "hole", info)
        return next_turn(self, info, self.render(), "Wall." if self.state == before else None)

    def expert_reply(self) -> str:
        """The first move of a shortest safe path (ties broken in Down, Right, Left, Up order)."""
        dist = goal_distances(self.desc)
        r, c = divmod(self.state, SIZE)
        best, best_d = 1, 10**9
        for a in (1, 2, 0, 3):
            dr, dc = _DELTA[a]
            nr, nc = r + dr, c + dc
            if 0 <= nr < SIZE and 0 <= nc < SIZE and dist.get(nr * SIZE + nc, 10**9) < best_d:
                best, best_d = a, dist[nr * SIZE + nc]
        return NAMES[best]
