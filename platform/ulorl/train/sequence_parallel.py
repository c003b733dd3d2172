"""Sequence parallelism (``train.sequence_parallel``): the degree check.

Rows longer than one device are meant to be split over ``train.sequence_parallel`` ranks with
DeepSpeed's Ulysses integration for Hugging Face models
(``deepspeed.runtime.sequence_parallel.ulysses_sp``), on separate data-parallel and
sequence-parallel process groups. This version does not run it yet, so a degree above 1 is refused
before any model work rather than silently training without it. The dry-run plan already
estimates per-GPU memory for a given degree.
"""

from __future__ import annotations

from ulorl.config import TrainConfig


class SequenceParallelUnavailable(ValueError):
    """``train.sequence_parallel`` > 1 was asked for; this version trains with degree 1 only."""


def check_sequence_parallel(cfg: TrainConfig) -> None:
    """Raise ``SequenceParallelUnavailable`` for ``train.sequence_parallel`` > 1 (names the key)."""
    if cfg.sequence_parallel > 1:
        raise SequenceParallelUnavailable(
            f"train.sequence_parallel={cfg.sequence_parallel}: sequence parallelism is not available in this "
            "version; use 1 (rows over train.micro_batch_tokens are then trained alone, with chunked log-probs "
            "and train.gradient_checkpointing), or more trainer GPUs / larger ones (see --dry-run "
            "memory_estimate_gib.trainer_peak_per_gpu)"
        )
