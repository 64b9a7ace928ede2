"""Group state tracking (MAD's group-S / group-A / group-Z tasks): the label at every position is
the running product of the group elements read so far.

Groups: ``S<m>`` (symmetric, e.g. S5 with 120 elements, the non-solvable case a constant-depth
linear recurrence with positive coefficients cannot track), ``A<m>`` (alternating), ``Z<m>`` or
``cyclic:<m>`` (cyclic), ``parity`` (= Z2). Element ids are 0 .. |G| − 1 and double as input and
label tokens; id 0 is the identity.

Generator, per example (``numpy.random.default_rng(seed)``):
    g_1 .. g_T uniform over G;   labels[t] = id of  p_t = g_t ∘ g_{t-1} ∘ ... ∘ g_1
(permutations act on the left: p_t applies g_1 first). Every position is an answer position.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from tokenmix.core.errors import InputError
from tokenmix.tasks.base import TaskConfig, TaskData, positive, register_task, require


def _parity(p: tuple[int, ...]) -> int:
    inv = sum(1 for i in range(len(p)) for j in range(i + 1, len(p)) if p[i] > p[j])
    return inv % 2


def _parse_group(group: str) -> tuple[str, int]:
    """'S5' -> ('S', 5); 'parity' -> ('Z', 2); 'cyclic:7' -> ('Z', 7)."""
    spec = group.strip() if isinstance(group, str) else ""
    if spec == "parity":
        spec = "Z2"
    if spec.startswith("cyclic:"):
        spec = "Z" + spec.split(":", 1)[1]
    kind, digits = spec[:1], spec[1:]
    if kind not in ("S", "A", "Z") or not digits.isdigit() or int(digits) < 1:
        raise InputError(f"state_tracking: unknown group {group!r} (use S<m>, A<m>, Z<m>, cyclic:<m> or parity)")
    m = int(digits)
    if kind == "Z" and m > 4096:
        raise InputError(f"state_tracking: group Z{m} too large (order must be <= 4096)")
    if kind != "Z" and m > 7:
        raise InputError(f"state_tracking: group {kind}{m} too large (m must be <= 7)")
    return kind, m


def group_elements(group: str) -> list[tuple[int, ...]] | None:
    """The permutations behind the ids of a permutation group, in id order (None for cyclic groups)."""
    kind, m = _parse_group(group)
    if kind == "Z":
        return None
    return [p for p in itertools.permutations(range(m)) if kind == "S" or _parity(p) == 0]


@lru_cache(maxsize=None)
def group_table(group: str) -> np.ndarray:
    """Multiplication table M [|G|, |G|] with M[a, b] = id of a ∘ b (apply b first, then a).

    Permutation groups list their elements in lexicographic order (identity first); the cyclic
    group Z_m is addition mod m.
    """
    kind, m = _parse_group(group)
    if kind == "Z":
        a = np.arange(m)
        return (a[:, None] + a[None, :]) % m
    perms = group_elements(group)
    index = {p: i for i, p in enumerate(perms)}
    table = np.empty((len(perms), len(perms)), dtype=np.int64)
    for i, a in enumerate(perms):
        for j, b in enumerate(perms):
            table[i, j] = index[tuple(a[b[x]] for x in range(m))]  # (a ∘ b)(x) = a(b(x))
    return table


@register_task
@dataclass(frozen=True)
class StateTrackingConfig(TaskConfig):
    name = "state_tracking"

    group: str = "S5"
    seq_len: int = 64

    def __post_init__(self) -> None:
        positive(self.name, seq_len=self.seq_len)
        order = group_table(self.group).shape[0]  # validates the group name
        require(order >= 2, self.name, "'group order >= 2'", f"group {self.group} is trivial")

    @property
    def vocab_size(self) -> int:
        return int(group_table(self.group).shape[0])

    def baselines(self) -> dict[str, float]:
        # the first label is the first input itself: a model that copies it and guesses the rest
        first = 1 / self.seq_len + (1 - 1 / self.seq_len) / self.vocab_size
        return {"uniform element": 1 / self.vocab_size, "the first position copied, uniform elsewhere": first}

    def _generate(self, num_examples: int, seed: int) -> TaskData:
        rng = np.random.default_rng(seed)
        table = group_table(self.group)
        g = rng.integers(0, table.shape[0], size=(num_examples, self.seq_len))
        prod = np.empty_like(g)
        acc = np.zeros(num_examples, dtype=np.int64)  # identity
        for t in range(self.seq_len):
            acc = table[g[:, t], acc]  # p_t = g_t ∘ p_{t-1}
            prod[:, t] = acc
        return TaskData(torch.from_numpy(g), torch.from_numpy(prod))
