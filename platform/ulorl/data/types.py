"""Prompt records shared by every dataset source (embedded task, JSONL files, HF datasets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PromptItem:
    """One problem with a verifiable reference answer.

    ``problem`` is the raw problem text (no template); ``prompt`` is the text actually fed to the
    model when the source defines its own format (the embedded task), else empty and a template
    is applied by ``ulorl.data.prompts``.
    """

    id: str
    problem: str
    answer: str
    source: str = ""
    prompt: str = ""
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
