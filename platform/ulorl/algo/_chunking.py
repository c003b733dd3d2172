"""Row-chunk sizing for [tokens x vocab] computations."""

from __future__ import annotations

import torch

#: Auto chunk size target: rows per chunk such that one float32 [rows x V] temporary holds at
#: most this many elements (2**24 elements = 64 MiB in float32).
DEFAULT_CHUNK_ELEMENTS = 2**24


def resolve_chunk_rows(num_rows: int, vocab: int, chunk_size: int | None) -> int:
    """Rows per chunk: ``chunk_size`` if given, else max(1, DEFAULT_CHUNK_ELEMENTS // vocab)."""
    if chunk_size is None:
        rows = max(1, DEFAULT_CHUNK_ELEMENTS // max(vocab, 1))
    else:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        rows = int(chunk_size)
    return max(1, min(rows, max(num_rows, 1)))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half/bf16/fp32 inputs, float64 kept (used by gradcheck in tests)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_labels(labels: torch.Tensor, lead: torch.Size, tensor: str, last_dim: str) -> None:
    """``labels`` must be an integer tensor shaped ``lead``: ``tensor``'s shape without its ``last_dim``."""
    if labels.shape != lead:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal {tensor} shape without the {last_dim} "
                         f"dim {tuple(lead)}")
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise TypeError(f"labels must be an integer tensor, got {labels.dtype}")


def check_temperature(temperature: float) -> float:
    t = float(temperature)
    if not t > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return t
