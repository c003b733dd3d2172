"""Training backends: who owns the parameters and the optimizer.

``TorchBackend`` is single-process torch (CPU or one GPU). ``ulorl.train.deepspeed_backend`` adds a
DeepSpeed ZeRO backend with the same interface.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional, Protocol

import torch

from ulorl.config import TrainConfig
from ulorl.rollout.types import WeightStream
from ulorl.train.parallel import ParallelOps


class TrainBackend(Protocol):
    """What callers use of a backend (the trainer, the update, weight sync, the worker loop).

    Optional capabilities are typed members every backend has (None or False where it lacks them):
    code reads them, never probes for them.
    """

    model: torch.nn.Module
    is_main_process: bool
    @property
    def data_parallel(self) -> Optional[ParallelOps]:
        """Several processes: their data-parallel operations (``DataParallel``); None in one process."""
        ...

    @property
    def rollout_model(self) -> torch.nn.Module:
        """The plain (unpartitioned) transformers module rollouts, SAIS log-probs and checkpoints use."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...
    def step(self) -> float:
        """Clip gradients, take one optimizer step, zero gradients; return the pre-clip grad norm."""
        ...
    def zero_grad(self) -> None: ...
    def save(self, directory: Path) -> None:
        """Save optimizer (and engine) state into ``directory`` (the model is saved by the trainer)."""
        ...
    def load(self, directory: Path) -> None: ...
    def state_dict_for_rollout(self) -> dict[str, torch.Tensor]:
        """Full (gathered) model weights for the rollout engine."""
        ...

    @property
    def rollout_weight_stream(self) -> Optional[Callable[[], WeightStream]]:
        """A factory of lazy ``(name, tensor)`` streams of the full weights (gathered bucket by bucket
        under ZeRO-3) for engines that stream weights; None: weights leave only as
        ``state_dict_for_rollout()``."""
        ...
    def save_model(self, directory: Path) -> None:
        """Write the full policy weights (+ config) to ``directory`` for ``from_pretrained``."""
        ...
    def close(self, **info: Any) -> None:
        """Release the backend (multi-process: stop the worker ranks, handing them ``info``)."""
        ...


def adamw(params: Iterable[torch.Tensor], cfg: TrainConfig) -> torch.optim.AdamW:
    """The paper's optimizer over ``params``: torch AdamW at the constant ``train.lr``, ``train.betas``
    and ``train.weight_decay`` (both backends build it here; DeepSpeed is handed it)."""
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]), weight_decay=cfg.weight_decay)


class TorchBackend:
    """Plain torch: AdamW with constant lr and grad-norm clipping (the paper's optimizer).

    Low-precision parameters (``model.dtype: bfloat16`` / ``float16``) get float32 master copies:
    gradients are accumulated into the masters in float32 after each backward, AdamW steps the
    masters, and the model's weights are the masters rounded back. AdamW directly on bf16 weights
    would lose updates below bf16 resolution (lr 1e-6 on a weight of 0.02 is ~100x below it).
    """

    is_main_process = True
    data_parallel: Optional[ParallelOps] = None  # one process
    #: no stream: ``state_dict_for_rollout`` hands over the model's own tensors, nothing to gather
    rollout_weight_stream: Optional[Callable[[], WeightStream]] = None

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig) -> None:
        self.model = model
        self.cfg = cfg
        self.params = [p for p in model.parameters() if p.requires_grad]
        low = any(p.dtype in (torch.bfloat16, torch.float16) for p in self.params)
        #: float32 master copies (None when the model already trains in float32)
        self.masters: list[torch.Tensor] | None = (
            [p.detach().float().clone() for p in self.params] if low else None
        )
        self.optimizer = adamw(self.masters if self.masters is not None else self.params, cfg)

    def _accumulate_to_masters(self) -> None:
        assert self.masters is not None
        for p, m in zip(self.params, self.masters):
            if p.grad is None:
                continue
            g = p.grad.float()
            m.grad = g if m.grad is None else m.grad.add_(g)
            p.grad = None

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        if self.masters is not None:
            self._accumulate_to_masters()

    def step(self) -> float:
        trained = self.masters if self.masters is not None else self.params
        norm = torch.nn.utils.clip_grad_norm_(trained, self.cfg.grad_clip)
        if torch.isfinite(norm):
            self.optimizer.step()
            if self.masters is not None:
                with torch.no_grad():
                    for p, m in zip(self.params, self.masters):
                        p.copy_(m)
        self.zero_grad()  # a non-finite norm: no step, parameters untouched
        return float(norm)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.masters is not None:
            for p in self.params:
                p.grad = None

    def save(self, directory: Path) -> None:
        torch.save(self.optimizer.state_dict(), Path(directory) / "optimizer.pt")
        if self.masters is not None:
            torch.save(self.masters, Path(directory) / "master_weights.pt")

    def load(self, directory: Path) -> None:
        state: dict[str, Any] = torch.load(Path(directory) / "optimizer.pt", weights_only=False)
        self.optimizer.load_state_dict(state)
        if self.masters is not None:
            path = Path(directory) / "master_weights.pt"
            if path.is_file():
                saved: list[torch.Tensor] = torch.load(path, weights_only=True)
                with torch.no_grad():
                    for m, v in zip(self.masters, saved):
                        m.copy_(v)
            else:  # a checkpoint from before master weights: start them from the saved model
                with torch.no_grad():
                    for p, m in zip(self.params, self.masters):
                        m.copy_(p.float())

    @property
    def rollout_model(self) -> torch.nn.Module:
        return self.model  # one plain module trains and rolls out

    def state_dict_for_rollout(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def save_model(self, directory: Path) -> None:
        self.model.save_pretrained(directory, safe_serialization=True)  # type: ignore[operator]

    def close(self, **info: Any) -> None:
        return None
