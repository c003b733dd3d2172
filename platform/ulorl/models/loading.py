"""Load a causal LM and its tokenizer: the shipped embedded model or any local path / HF id.

The embedded model is stored with ``save_pretrained``, so one code path serves both::

    model, tok = load_policy()                          # platform/ulorl/assets/embedded
    model, tok = load_policy("/models/Qwen3-4B", dtype="bfloat16", device="cuda",
                             rope_scaling={"rope_type": "yarn", "factor": 1.5,
                                           "original_max_position_embeddings": 95232})

Tokenizers are loaded with ``padding_side="left"`` (rollouts pad on the left).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from ulorl.config import scaled_max_positions
from ulorl.data.profiles import parse_embedded

EMBEDDED = "embedded"
_DTYPES = ("float32", "bfloat16", "float16")


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message names the path or id."""


def embedded_model_dir(profile: str = "default") -> Path:
    """Folder of a shipped warm-started embedded model (weights, config, tokenizer)."""
    spec = parse_embedded(f"{EMBEDDED}:{profile}")
    if spec is None:   # unreachable: an "embedded:" spec always names a profile (or get_profile raises)
        raise ModelLoadError(f"unknown embedded profile {profile!r}")
    return Path(__file__).resolve().parent.parent / "assets" / spec.asset_dir


def resolve_model_path(name_or_path: str) -> str:
    """``"embedded"`` / ``"embedded:<profile>"`` -> the shipped asset folder; anything else unchanged."""
    try:
        prof = parse_embedded(name_or_path)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    if prof is not None:
        d = embedded_model_dir(prof.name)
        if not (d / "config.json").is_file():
            raise ModelLoadError(
                f"the embedded model is missing from {d}; build it with "
                f"`ulorl-data warmstart --profile {prof.name} --out {d}`"
            )
        return str(d)
    return name_or_path


def missing_local_model(name_or_path: str) -> Optional[str]:
    """Why ``name_or_path`` names a local model folder that does not exist (None: it exists, or it is an
    embedded model or a hub id). A value is taken for a local path when it is absolute, starts with ``.``
    or ``~``, holds more than one separator, or its first folder exists here (``runs/narrow`` with a
    ``runs/``); an ``org/name`` whose ``org`` is no folder here is a hub id. The run (:func:`load_policy`)
    and ``ulorl-train --dry-run`` ask this same question."""
    if parse_embedded(name_or_path) is not None or os.path.sep not in name_or_path:
        return None
    path = Path(name_or_path).expanduser()
    if path.exists():
        return None
    first = Path(name_or_path).parts[0]
    local = (path.is_absolute() or name_or_path.startswith((".", "~")) or name_or_path.count(os.path.sep) > 1
             or Path(first).is_dir())
    if not local:
        return None
    return (f"model path does not exist: {name_or_path}" + ("" if path.is_absolute() else f" (from {Path.cwd()})")
            + "; give the folder that holds the model's config.json and weights (build or copy it there first), "
            "embedded, or a hub id")


def load_tokenizer(name_or_path: str = EMBEDDED, padding_side: str = "left", trust_remote_code: bool = False):
    """Tokenizer with ``padding_side`` set at load (it is not kept when set afterwards)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(path, padding_side=padding_side, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load tokenizer from {name_or_path!r} ({path}): {exc}") from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # many causal LMs ship without a pad token
    return tok


def load_policy(
    name_or_path: str = EMBEDDED,
    dtype: str = "float32",
    device: str = "cpu",
    rope_scaling: Optional[dict[str, Any]] = None,
    trust_remote_code: bool = False,
    attn_implementation: Optional[str] = None,
    gradient_checkpointing: bool = False,
):
    """Return ``(model, tokenizer)`` for a model name, local path or HF id (online only).

    ``rope_scaling`` (e.g. YaRN) is merged into the config's rope parameters before the weights
    load. ``attn_implementation`` ("sdpa", "eager", "flash_attention_2"; None = transformers'
    default) is fixed at load. ``gradient_checkpointing`` recomputes each decoder layer in
    backward (non-reentrant). The model is returned in eval mode on ``device``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise ModelLoadError(f"model.dtype must be one of {_DTYPES}, got {dtype!r}")
    path = resolve_model_path(name_or_path)
    missing = missing_local_model(name_or_path) if path == name_or_path else None
    if missing:
        raise ModelLoadError(missing)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model config from {name_or_path!r} ({path}): {exc}") from exc
    if rope_scaling:
        _apply_rope_scaling(config, rope_scaling)
    try:
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model = AutoModelForCausalLM.from_pretrained(
            path, config=config, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code, **extra
        )
    except (OSError, ValueError, ImportError) as exc:
        raise ModelLoadError(f"cannot load model weights from {name_or_path!r} ({path}): {exc}") from exc
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device).eval()  # type: ignore[arg-type]  # transformers types .to's wrapper as taking a model
    tok = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
    return model, tok


def _apply_rope_scaling(config: Any, rope_scaling: dict[str, Any]) -> None:
    """Merge a rope-scaling dict into ``config`` (transformers 5 ``rope_parameters`` or older ``rope_scaling``)."""
    rs = dict(rope_scaling)
    if "type" in rs and "rope_type" not in rs:
        rs["rope_type"] = rs.pop("type")
    if isinstance(getattr(config, "rope_parameters", None), dict):
        config.rope_parameters = {**config.rope_parameters, **rs}
    else:
        config.rope_scaling = rs
    scaled = scaled_max_positions(rs)
    if scaled is not None and scaled > int(getattr(config, "max_position_embeddings", 0) or 0):
        # vLLM does not multiply max_position_embeddings by the factor and sizes its rotary cache
        # from it: trainer and engine both read this value
        config.max_position_embeddings = scaled
