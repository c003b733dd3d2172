"""Weights in the names and layout an engine loads: the model's *checkpoint* format.

A transformers model's parameters need not carry the names its checkpoints use. transformers 5
fuses the experts of mixture-of-experts models at load time (Qwen3-MoE:
``mlp.experts.gate_up_proj [E, 2I, H]`` and ``mlp.experts.down_proj [E, H, I]`` from the
checkpoint's per-expert ``mlp.experts.<e>.{gate,up,down}_proj.weight``), and ``save_pretrained``
reverts that. vLLM's loaders read the checkpoint format, so a weight update streamed from the
trainer's parameters must be reverted the same way, tensor by tensor, before it reaches the engine.
This module reuses transformers' own reverse conversion (``revert_weight_conversion``) rather than a
hand-written name map.

    model = conversion_model(model_dir)          # meta-device skeleton, None when names are unchanged
    for name, tensor in to_checkpoint_names(model, named_parameters):
        ...                                      # per-expert tensors for fused experts, else as given
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

import torch


def conversion_model(model_dir: str | Path) -> Optional[Any]:
    """A parameter-free (meta device) model of ``model_dir``'s architecture when its parameters need
    converting back to checkpoint names, else None (dense Qwen3 / Llama: names are unchanged).

    Its conversion list is computed once here and kept on the model (``_weight_conversions``, where
    ``revert_weight_conversion`` looks first), so a per-tensor revert does not walk the model's
    modules again for every tensor of every update."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # as revert_weight_conversion does for a model not built by from_pretrained: no prefix changes
    conversions = [c for c in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(c, PrefixChange)]
    if not conversions:
        return None
    model._weight_conversions = conversions
    return model


def to_checkpoint_names(model: Optional[Any], named: Iterable[tuple[str, torch.Tensor]]
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of the model's parameters -> the checkpoint's pairs, lazily, one source
    tensor at a time (a fused expert tensor ``[E, ...]`` becomes its E per-expert tensors, views of
    it, no copy of the whole model). ``model`` None passes the pairs through unchanged."""
    if model is None:
        yield from named
        return
    from transformers.core_model_loading import revert_weight_conversion

    for name, tensor in named:
        yield from revert_weight_conversion(model, {name: tensor}).items()
