"""Embedded profiles: a synthetic task and its shipped warm-started model, selected by name.

    embedded            -> profile "default" (running sums; the fast default, assets/embedded)
    embedded:default    -> the same
    embedded:choice     -> profile "choice" (many correct solutions, long tail; assets/embedded_choice)

A name resolves through ``parse_embedded`` wherever the config accepts ``embedded``
(``model.name_or_path``, ``data.train``, ``data.heldout``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ulorl.data import task, task_choice
from ulorl.data.types import PromptItem

EMBEDDED = "embedded"


@dataclass(frozen=True)
class TaskProfile:
    """One embedded profile: its task generator, the warm-start targets and its length buckets."""

    name: str
    description: str
    spec: Any                                                         # the generator's frozen spec
    iter_split: Callable[..., Iterator[PromptItem]]                   # (split, seed, spec)
    make_split: Callable[..., list[PromptItem]]                       # (split, n, seed, spec)
    training_solution: Callable[[PromptItem, random.Random], tuple[str, float]]  # target, its -log p (nats)
    asset_dir: str                                                    # folder under ulorl/assets
    max_response_len: int                                             # the profile's global max
    length_edges: Sequence[int] = task.LENGTH_EDGES

    def split(self, split: task.Split, n: int, seed: int = 0) -> list[PromptItem]:
        return self.make_split(split, n, seed=seed, spec=self.spec)


PROFILES: dict[str, TaskProfile] = {
    "default": TaskProfile(
        name="default",
        description="running sums of two-digit numbers, one fixed solution; the fast default",
        spec=task.DEFAULT_SPEC,
        iter_split=task.iter_split,
        make_split=task.make_split,
        training_solution=lambda item, rng: (task.reference_solution(item), 0.0),
        asset_dir="embedded",
        max_response_len=512,
    ),
    "choice": TaskProfile(
        name="choice",
        description="sums of distinct two-digit numbers with free grouping and line forms, or a short guess",
        spec=task_choice.CHOICE_SPEC,
        iter_split=task_choice.iter_split,
        make_split=task_choice.make_split,
        training_solution=lambda item, rng: task_choice.training_solution(item, rng),
        asset_dir="embedded_choice",
        max_response_len=192,          # references reach 128 tokens; spaced forms of them ~175
        length_edges=(32, 64, 128),
    ),
}


def profile_names() -> list[str]:
    return list(PROFILES)


def get_profile(name: str) -> TaskProfile:
    """Profile by bare name (``"choice"``); a clear error names the choices."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown embedded profile {name!r}; choose one of {profile_names()}") from None


def parse_embedded(spec: str) -> Optional[TaskProfile]:
    """``"embedded"`` / ``"embedded:<profile>"`` -> the profile; any other string -> None."""
    if spec == EMBEDDED:
        return PROFILES["default"]
    if spec.startswith(EMBEDDED + ":"):
        return get_profile(spec[len(EMBEDDED) + 1 :])
    return None
