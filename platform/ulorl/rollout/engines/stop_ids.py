"""Which token ids end a response: the tokenizer's EOS plus every end id of the model's generation config.

Qwen3's ``generation_config.json`` lists two end ids (``<|im_end|>`` and ``<|endoftext|>``) while
the tokenizer names one; an engine that stops on the tokenizer's id alone runs past the other to
the length budget. Both engines take the list built here::

    ids = stop_token_ids(model, tokenizer)      # [tokenizer EOS, other generation-config end ids]

Torch-free: reads attributes only.
"""

from __future__ import annotations

from typing import Any


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def stop_token_ids(model: Any, tokenizer: Any = None) -> list[int]:
    """End ids, deduplicated, in order: tokenizer EOS, ``model.generation_config.eos_token_id``
    (an id or a list), then ``model.config.eos_token_id``. The first is the engine's reported
    ``eos_token_id``. Raises ValueError when none of them names an id."""
    sources = (
        getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None,
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        getattr(getattr(model, "config", None), "eos_token_id", None),
    )
    out: list[int] = []
    for source in sources:
        for tok in _as_ids(source):
            if tok not in out:
                out.append(tok)
    if not out:
        raise ValueError("no end-of-sequence id: neither the tokenizer nor the model's generation config / "
                         "config names one")
    return out
