"""Training prompt source: datasets resolved from config, shuffled per epoch, with a checkpointable position."""

from __future__ import annotations

import random
from typing import Any, Optional

from ulorl.config import DataConfig
from ulorl.data.profiles import parse_embedded
from ulorl.data.types import PromptItem
from ulorl.rollout.scheduler import PromptRequest
from ulorl.rollout.types import PROBLEM_META_KEY


def load_items(spec: str, data: DataConfig, split: str) -> list[PromptItem]:
    """``embedded[:<profile>]`` -> that synthetic task's split; anything else -> ``resolve_dataset``."""
    profile = parse_embedded(spec)
    if profile is not None:
        n = data.task.num_train if split == "train" else data.task.num_heldout
        return profile.split("train" if split == "train" else "heldout", n, seed=data.task.seed)
    from ulorl.data.jsonl import resolve_dataset

    return resolve_dataset(spec, data.data_dir)


def encode_prompt(item: PromptItem, tokenizer: Any) -> PromptRequest:
    from ulorl.data.prompts import build_prompt

    text = build_prompt(item, tokenizer)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return PromptRequest(prompt_ids=list(ids), answer=item.answer, prompt_text=text,
                         meta={"id": item.id, PROBLEM_META_KEY: item.problem})  # the reward reads the problem


class PromptStream:
    """Yields prompts in a seeded order, reshuffled each epoch; ``state_dict`` = (epoch, position).

    ``max_prompt_len``: prompts with more tokens (too long for the engine's context with the
    global max response) are dropped at load, counted in ``dropped_too_long``; every item is
    then encoded up front. None keeps every item and encodes lazily.
    """

    def __init__(self, items: list[PromptItem], tokenizer: Any, seed: int, shuffle: bool = True,
                 max_prompt_len: Optional[int] = None) -> None:
        self.dropped_too_long = 0
        self._cache: dict[int, PromptRequest] = {}
        if max_prompt_len is not None and items:
            encoded = [encode_prompt(it, tokenizer) for it in items]
            keep = [i for i, e in enumerate(encoded) if len(e.prompt_ids) <= max_prompt_len]
            self.dropped_too_long = len(items) - len(keep)
            items = [items[i] for i in keep]
            self._cache = {j: encoded[i] for j, i in enumerate(keep)}
            if not items:
                raise ValueError(f"every training prompt is longer than the engine's prompt budget of {max_prompt_len} "
                                 "tokens (rollout.engine_max_model_len - rollout.max_response_len)")
        if not items:
            raise ValueError("the training dataset is empty")
        self.items = items
        self.tokenizer = tokenizer
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[PromptRequest]:
        out: list[PromptRequest] = []
        for _ in range(n):
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._make_order()
            idx = self._order[self.position]
            self.position += 1
            if idx not in self._cache:
                self._cache[idx] = encode_prompt(self.items[idx], self.tokenizer)
            out.append(self._cache[idx])
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._make_order()
