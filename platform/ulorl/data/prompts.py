"""Prompt template: the text fed to the policy for one problem.

    text = build_prompt(item, tokenizer)      # then tokenizer.encode(text, add_special_tokens=False)
"""

from __future__ import annotations

from typing import Any

from ulorl.data.types import PromptItem

# The instruction used by Qwen3 / DeepSeek-R1 style math evaluation.
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PLAIN_TEMPLATE = "Problem: {problem}\n\n" + INSTRUCTION.replace("{}", "{{}}") + "\n\nSolution:"


def user_message(problem: str) -> str:
    """The user turn: the problem followed by the step-by-step / ``\\boxed{}`` instruction."""
    return f"{problem.strip()}\n\n{INSTRUCTION}"


def build_prompt(item: PromptItem, tokenizer: Any = None) -> str:
    """Prompt text for ``item``.

    ``item.prompt`` set (the embedded task defines its own format) -> returned unchanged. Else the
    problem plus an instruction to reason step by step and put the final answer in ``\\boxed{}``:
    through ``tokenizer.apply_chat_template(..., add_generation_prompt=True, tokenize=False)`` when
    the tokenizer has a chat template, else the plain-text ``PLAIN_TEMPLATE``.
    """
    if item.prompt:
        return item.prompt
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": user_message(item.problem)}],
            add_generation_prompt=True,
            tokenize=False,
        )
    return PLAIN_TEMPLATE.format(problem=item.problem.strip())
