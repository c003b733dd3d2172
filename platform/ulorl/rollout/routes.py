"""Recorded MoE routes of a response segment: compact integer arrays and their JSON form.

An engine that decodes an MoE model returns, per response token, the experts each layer routed it to:
Int[tokens, layers, top_k], stored as uint8 while the model has <= 256 experts (int16 beyond). A sample keeps
one such array per segment (``Sample.routed_experts``), beside the segment's policy version. Checkpoints
write samples as JSON: ``encode_routes`` / ``decode_routes`` turn an array into ``{"dtype", "shape",
"b64"}`` and back, bit for bit (exact resume). numpy only: the scheduler stays torch-free.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np


def compact_routes(indices: Any, num_experts: int) -> np.ndarray:
    """Int[tokens, layers, top_k] expert indices as uint8 (num_experts <= 256) or int16 (<= 32768)."""
    dtype = np.uint8 if num_experts <= 256 else np.int16
    if num_experts > 32768:
        raise ValueError(f"num_experts {num_experts} > 32768 has no compact route dtype")
    return np.ascontiguousarray(np.asarray(indices), dtype=dtype)


def encode_routes(routes: np.ndarray) -> dict[str, Any]:
    """JSON-safe form of a routes array."""
    a = np.ascontiguousarray(routes)
    return {"dtype": str(a.dtype), "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def decode_routes(d: Any) -> np.ndarray:
    """The array ``encode_routes`` wrote (an array passes through)."""
    if isinstance(d, np.ndarray):
        return d
    raw = base64.b64decode(d["b64"])
    return np.frombuffer(raw, dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


__all__ = ["compact_routes", "decode_routes", "encode_routes"]
