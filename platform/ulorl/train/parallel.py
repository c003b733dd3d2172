"""What the policy update asks of data parallelism, and its world-size-1 form.

``ParallelOps`` is the interface ``ulorl.train.update`` uses: ``DataParallel``
(``ulorl.train.distributed``, several processes over torch.distributed) implements it, and
``LocalParallel`` is the one-process case, so the update has no "multi-process or not" branches::

    dp = backend.data_parallel or LocalParallel(train.logprob_path, train.logprob_chunk_tokens)
    dp.begin_update(samples)                        # no-op here
    for rows, weight in dp.micro_batches(batch, cap):  # every micro-batch, weight 1.0
        ...
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from ulorl.rollout.types import Sample
from ulorl.train.batch import TrainBatch, micro_batches
from ulorl.train.forward import current_token_stats


class ParallelOps(Protocol):
    """The data-parallel operations of one policy update (see ``DataParallel`` for the sharded form)."""

    @property
    def sp(self) -> int:
        """Sequence-parallel degree (1: rows are never split along the sequence)."""
        ...

    def begin_update(self, samples: list[Sample]) -> None:
        """Start an update on ``samples`` (the driver ships them to the other ranks)."""
        ...

    def micro_batches(self, batch: TrainBatch, token_budget: int) -> list[tuple[list[int], float]]:
        """(rows, weight) passes of this rank over ``batch``; weight 0 = a padding pass."""
        ...

    def sharded(self, sub: TrainBatch, weight: float, token_budget: int) -> bool:
        """True when the pass over ``sub`` is split along the sequence over the SP group."""
        ...

    def sharded_stats(
        self, model: torch.nn.Module, sub: TrainBatch, temperature: float, device: torch.device,
        chunk_tokens: int | None = None, with_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """This rank's shard of ``sub``'s one row: (log-probs, entropy) Float[1, n] and its first position."""
        ...

    def token_stats(
        self, model: torch.nn.Module, batch: TrainBatch, temperature: float, token_budget: int,
        device: torch.device, bf16: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """No-grad (log-probs, entropy) of the whole batch, each Float[B, L-1] on cpu, on every rank."""
        ...

    def all_finite(self, loss: torch.Tensor) -> bool:
        """True when the loss is finite on every rank."""
        ...

    def reduce_loss_metrics(self, pg_loss_total: float, acc: dict[str, float]) -> tuple[float, dict[str, float]]:
        """The loss and token-weighted metrics summed over ranks (identity in one process)."""
        ...


class LocalParallel:
    """``ParallelOps`` for one process: every micro-batch is this rank's, nothing is reduced.

    ``path`` / ``chunk_tokens``: ``train.logprob_path`` and ``train.logprob_chunk_tokens`` for the
    no-grad pass (the multi-process form always takes the chunked path).
    """

    def __init__(self, path: str = "chunked", chunk_tokens: Optional[int] = None) -> None:
        self.path = path
        self.chunk_tokens = chunk_tokens

    @property
    def sp(self) -> int:
        return 1

    def begin_update(self, samples: list[Sample]) -> None:
        return None

    def micro_batches(self, batch: TrainBatch, token_budget: int) -> list[tuple[list[int], float]]:
        return [(rows, 1.0) for rows in micro_batches(batch, token_budget)]

    def sharded(self, sub: TrainBatch, weight: float, token_budget: int) -> bool:
        return False

    def sharded_stats(
        self, model: torch.nn.Module, sub: TrainBatch, temperature: float, device: torch.device,
        chunk_tokens: int | None = None, with_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        raise RuntimeError("sequence-sharded passes need train.sequence_parallel > 1 over several processes")

    def token_stats(
        self, model: torch.nn.Module, batch: TrainBatch, temperature: float, token_budget: int,
        device: torch.device, bf16: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return current_token_stats(model, batch, temperature, token_budget, device, bf16,
                                   path=self.path, chunk_tokens=self.chunk_tokens)

    def all_finite(self, loss: torch.Tensor) -> bool:
        return bool(torch.isfinite(loss))

    def reduce_loss_metrics(self, pg_loss_total: float, acc: dict[str, float]) -> tuple[float, dict[str, float]]:
        return pg_loss_total, acc
