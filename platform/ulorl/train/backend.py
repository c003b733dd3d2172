"""Training backends: who owns the parameters and the optimizer.

``TorchBackend`` is single-process torch (CPU or one GPU). ``ulorl.train.deepspeed_backend`` adds a
DeepSpeed ZeRO backend with the same interface.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from ulorl.config import TrainConfig


class TrainBackend(Protocol):
    model: torch.nn.Module
    is_main_process: bool

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


class TorchBackend:
    """Plain torch: AdamW with constant lr and grad-norm clipping (the paper's optimizer)."""

    is_main_process = True

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig) -> None:
        self.model = model
        self.cfg = cfg
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=tuple(cfg.betas),
            weight_decay=cfg.weight_decay,
        )

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def grads_finite(self) -> bool:
        return all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in self.model.parameters())

    def step(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # a non-finite norm: no step, parameters untouched
        return float(norm)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def save(self, directory: Path) -> None:
        torch.save(self.optimizer.state_dict(), Path(directory) / "optimizer.pt")

    def load(self, directory: Path) -> None:
        state: dict[str, Any] = torch.load(Path(directory) / "optimizer.pt", weights_only=False)
        self.optimizer.load_state_dict(state)

    def state_dict_for_rollout(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}
