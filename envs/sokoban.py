"""Multi-turn text Sokoban on levels generated here, from the seed, by reverse play.

A level starts solved (every box on a target) and the generator walks the player backwards,
pulling boxes now and then; replaying the walk's moves reversed and inverted solves the level,
so every level is solvable by construction. Levels whose shortest solution is under
`min_steps` moves are drawn again, so an episode takes 10-40 turns (RollArt's long horizons).

Cells, one token-friendly symbol each: `P` you, `p` you on a target, `B` box, `*` box on a
target, `T` target, `#` wall, `.` floor. Outside the grid is wall.

Why not TextWorld (ALFWorld's engine): its wheel (1.7.0, Inform7 bundled) installs and makes
games here, but compiling one takes ~8 s, its commands run 5-15 words and its observations
10-320 words, so a 20-step quest overflows the tiny policy's 2048 positions and 12-token
replies, and the warm-up's thousands of episodes would need hours of compiling.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from envs.base import MultiTurnEnv, StepResult
from envs.frozenlake import ASK, NAMES, next_turn, read_move

DELTA = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}  # frozenlake's action ids: left, down, right, up
OPPOSITE = {0: 2, 1: 3, 2: 0, 3: 1}
ORDER = (1, 2, 0, 3)  # expert tie-break, as FrozenLake's
MAX_ATTEMPTS = 500  # draws per seed before giving up (~20 on average at the defaults)

PULL_WEIGHT = 6.0  # reverse play: odds of a box-pulling move against any other legal move
UNDO_WEIGHT = 0.1

Cell = tuple[int, int]
State = tuple[Cell, tuple[Cell, ...]]  # (player, sorted boxes)


def _add(cell: Cell, d: tuple[int, int], k: int = 1) -> Cell:
    return cell[0] + k * d[0], cell[1] + k * d[1]


@dataclass(frozen=True)
class Level:
    size: int
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    start: State
    solution: tuple[int, ...]  # the generator's (reversed walk): solves the level, not always shortest

    def free(self, cell: Cell) -> bool:
        r, c = cell
        return 0 <= r < self.size and 0 <= c < self.size and cell not in self.walls

    def move(self, state: State, action: int) -> State:
        """The state after `action` (unchanged when blocked by a wall or an unpushable box)."""
        (r, c), boxes = state
        dr, dc = DELTA[action]
        nxt = (r + dr, c + dc)
        if not self.free(nxt):
            return state
        if nxt in boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if not self.free(beyond) or beyond in boxes:
                return state
            boxes = tuple(sorted(beyond if b == nxt else b for b in boxes))
        return nxt, boxes

    def solved(self, state: State) -> bool:
        return all(b in self.targets for b in state[1])

    def shortest(self, state: State) -> list[int] | None:
        """A shortest solution from `state` (BFS; moves tried in ORDER), None if there is none."""
        if self.solved(state):
            return []
        parent: dict[State, tuple[State, int]] = {state: (state, -1)}
        todo = deque([state])
        while todo:
            s = todo.popleft()
            for a in ORDER:
                n = self.move(s, a)
                if n in parent:
                    continue
                parent[n] = (s, a)
                if self.solved(n):
                    path = []
                    while n != state:
                        n, a = parent[n]
                        path.append(a)
                    return path[::-1]
                todo.append(n)
        return None


def generate(seed: int, size: int = 5, boxes: int = 1, min_steps: int = 10, max_walk: int = 40) -> Level:
    """A solvable level from `seed` whose shortest solution takes at least `min_steps` moves."""
    if not 1 <= boxes <= size * size // 4 or size < 3 or not 1 <= min_steps <= max_walk:
        raise ValueError(f"bad level spec: size={size} boxes={boxes} min_steps={min_steps} max_walk={max_walk}")
    rng = np.random.default_rng(seed)
    cells = [(r, c) for r in range(size) for c in range(size)]
    for _ in range(MAX_ATTEMPTS):
        pick = rng.permutation(len(cells))
        n_walls = int(rng.integers(0, size))
        walls = frozenset(cells[i] for i in pick[:n_walls])
        targets = tuple(sorted(cells[i] for i in pick[n_walls:n_walls + boxes]))
        player = cells[pick[n_walls + boxes]]
        level = Level(size, walls, frozenset(targets), (player, targets), ())
        box_set, walk = set(targets), []
        for _ in range(int(rng.integers(min_steps, max_walk + 1))):
            legal = [a for a in range(4) if level.free(nxt := _add(player, DELTA[a])) and nxt not in box_set]
            if not legal:
                break
            # moves that can pull a box weigh more: a uniform walk seldom moves one at all
            pulls = [_add(player, DELTA[a], -1) in box_set for a in legal]
            # and undoing the last move seldom: it would only lengthen the walk, not the solution
            weights = np.array([(PULL_WEIGHT if p else 1.0) * (UNDO_WEIGHT if walk and a == walk[-1] else 1.0)
                                for a, p in zip(legal, pulls)])
            i = int(rng.choice(len(legal), p=weights / weights.sum()))
            a = legal[i]
            if pulls[i]:  # forward, the inverse move pushes the box back
                box_set.remove(_add(player, DELTA[a], -1))
                box_set.add(player)
            player = _add(player, DELTA[a])
            walk.append(OPPOSITE[a])
        start = (player, tuple(sorted(box_set)))
        shortest = level.shortest(start)
        if shortest is not None and len(shortest) >= min_steps:
            return Level(size, walls, frozenset(targets), start, tuple(reversed(walk)))
    raise RuntimeError(f"no level with a {min_steps}-move solution after {MAX_ATTEMPTS} draws (seed {seed})")


class SokobanEnv(MultiTurnEnv):
    name = "sokoban"
    max_turns = 40  # the longest solutions are ~25 moves; more turns would overflow 2048 positions

    def __init__(self, max_turns: int | None = None, size: int = 5, boxes: int = 1, min_steps: int = 10,
                 max_walk: int = 40) -> None:
        super().__init__(max_turns)
        self.spec = dict(size=size, boxes=boxes, min_steps=min_steps, max_walk=max_walk)
        generate(0, **self.spec)  # a bad spec fails here, not at the first reset
        self.system_prompt = (
            "You are P in a warehouse. Push every box B onto a target T; * is a box on a target, "
            "# is a wall, . is floor. You push a box by walking into it; you cannot pull. "
            "Reply with one move: Left, Down, Right or Up."
        )
        self.level: Level | None = None
        self.state: State = ((0, 0), ())

    def reset(self, seed: int) -> str:
        self.level = generate(seed, **self.spec)
        self.state = self.level.start
        self._begin()
        return self.render() + "\n" + ASK

    def render(self) -> str:
        n = self.level.size
        return "\n".join(" ".join(self._symbol((r, c)) for c in range(n)) for r in range(n))

    def _symbol(self, cell: Cell) -> str:
        (player, boxes), on_target = self.state, cell in self.level.targets
        if cell == player:
            return "p" if on_target else "P"
        if cell in boxes:
            return "*" if on_target else "B"
        return "#" if cell in self.level.walls else "T" if on_target else "."

    def step(self, reply: str) -> StepResult:
        action, info, invalid = read_move(self, reply, self.render())
        if invalid is not None:
            return invalid
        before = self.state
        self.state = self.level.move(before, action)
        if self.level.solved(self.state):
            info["success"] = True
            return self._finish("Every box is on a target!", 1.0, "solved", info)
        info["success"] = False
        pushed = self.state[1] != before[1]
        if pushed and self.level.shortest(self.state) is None:  # a box in a corner: no way back
            return self._finish("A box is stuck; the level cannot be solved now.", 0.0, "stuck", info)
        return next_turn(self, info, self.render(), "Blocked." if self.state == before else None)

    def expert_reply(self) -> str:
        """The first move of a shortest solution from here (ties in Down, Right, Left, Up order)."""
        path = self.level.shortest(self.state)
        return NAMES[path[0] if path else ORDER[0]]


class EasySokobanEnv(SokobanEnv):
    """4x4 rooms with short solutions (2-11 moves): the warmed-up tiny policy solves some (a
    uniformly random mover ~15%), so RL has a signal here before the long levels."""

    name = "sokoban_easy"
    max_turns = 20

    def __init__(self, max_turns: int | None = None, size: int = 4, boxes: int = 1, min_steps: int = 2,
                 max_walk: int = 12) -> None:
        super().__init__(max_turns, size=size, boxes=boxes, min_steps=min_steps, max_walk=max_walk)
