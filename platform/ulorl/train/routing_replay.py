"""Rollout routing replay (R3) in the trainer's forward, and capture of the trainer's own routing.

    table = RouteTable.of(kept_samples, replay=algo.routing_replay == "r3")   # None: no sample has routes
    with active_routes(table):
        lp, ent = token_stats(model, batch, ...)     # forward.token_stats applies ``moe_routing``

Each sample carries, per segment, the experts the engine chose for every response token and layer
(``Sample.routed_experts``: one Int[tokens, layers, k] array per segment, the segment's version in
``Sample.segments``). Response token j's logits come from input position ``p - 1 + j`` (p prompt tokens),
so its route sits there; prompt positions (and the last response token's, which predicts nothing) carry
``NO_ROUTE`` and are routed by the trainer itself.

``moe_routing`` replaces, for the duration, the ``forward`` of every top-k router of a Qwen3-MoE style
model (a module with ``weight`` [E, H], ``top_k``, ``norm_topk_prob``: transformers'
``Qwen3MoeTopKRouter``) by ``ulorl.algo.routing.replay_routes`` over its logits: recorded tokens go to
their recorded experts (with replay on), gate weights from the trainer's logits; the trainer's own top-k
of every token and layer is captured either way (``RoutingCapture``), for the routing mismatch metric.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ulorl.algo.routing import NO_ROUTE, replay_routes
from ulorl.rollout.types import Sample

ROUTING_REPLAY_MODES: tuple[str, ...] = ("off", "r3")
_LAYER = re.compile(r"layers\.(\d+)\.")


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The top-k routers of ``model`` in layer order (empty for a dense model)."""
    found: list[tuple[int, torch.nn.Module]] = []
    for name, mod in model.named_modules():
        if all(hasattr(mod, a) for a in ("top_k", "norm_topk_prob", "weight", "num_experts")) \
                and type(mod).__name__.endswith("Router"):
            m = _LAYER.search(name)
            found.append((int(m.group(1)) if m else len(found), mod))
    return [mod for _, mod in sorted(found, key=lambda x: x[0])]


def sample_routes(sample: Sample) -> Optional[np.ndarray]:
    """Int[T, layers, k] routes of the sample's T response tokens (its segments' arrays joined), or None
    when any segment has none or the lengths disagree."""
    arrays = getattr(sample, "routed_experts", None) or []
    if not arrays or len(arrays) != len(sample.segments) or any(a is None for a in arrays):
        return None
    out = np.concatenate([np.asarray(a) for a in arrays], axis=0)
    return out if out.shape[0] == len(sample.response_ids) else None


@dataclass
class RouteTable:
    """Recorded routes of a batch's samples, looked up by a row's token ids.

    routes: token-id bytes of prompt + response -> Int16[L, layers, k] over the row's input positions
    (NO_ROUTE where none). replay: route recorded tokens to their recorded experts (R3); False: only
    capture. captured: the same keys -> Long[L, layers, k], the trainer's own routes of the last forward
    that saw the row."""

    routes: dict[bytes, Tensor]
    replay: bool
    captured: dict[bytes, Tensor] = field(default_factory=dict)

    @staticmethod
    def of(samples: list[Sample], replay: bool) -> Optional[RouteTable]:
        """The table of ``samples``; None when none of them carries routes."""
        routes: dict[bytes, Tensor] = {}
        for s in samples:
            r = sample_routes(s)
            if r is None:
                continue
            ids = s.prompt_ids + s.response_ids
            p, t = len(s.prompt_ids), len(s.response_ids)
            full = torch.full((len(ids), r.shape[1], r.shape[2]), NO_ROUTE, dtype=torch.int16)
            full[p - 1:p - 1 + t] = torch.from_numpy(r.astype(np.int16))
            routes[row_key(ids)] = full
        return RouteTable(routes, replay) if routes else None


def row_key(ids: Any) -> bytes:
    """Lookup key of one row's real token ids (a list or an Int[L] tensor)."""
    return np.asarray(ids, dtype=np.int64).tobytes()


_ACTIVE: contextvars.ContextVar[Optional[RouteTable]] = contextvars.ContextVar("ulorl_route_table", default=None)


@contextlib.contextmanager
def active_routes(table: Optional[RouteTable]) -> Iterator[None]:
    """Make ``table`` the one ``forward.token_stats`` reads (None: nothing changes)."""
    token = _ACTIVE.set(table)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def current_table() -> Optional[RouteTable]:
    return _ACTIVE.get()


def _row_keys(input_ids: Tensor, attention_mask: Tensor) -> list[bytes]:
    ids = input_ids.detach().cpu().long()
    lens = attention_mask.detach().cpu().long().sum(dim=1).tolist()
    return [row_key(ids[b, :n]) for b, n in enumerate(lens)]


def batch_routes(table: RouteTable, input_ids: Tensor, attention_mask: Tensor, layers: int,
                 top_k: int) -> Tensor:
    """Int16[B, L, layers, k]: the table's routes of each row (right-padded rows), NO_ROUTE elsewhere."""
    b, length = input_ids.shape
    out = torch.full((b, length, layers, top_k), NO_ROUTE, dtype=torch.int16)
    for i, key in enumerate(_row_keys(input_ids, attention_mask)):
        r = table.routes.get(key)
        if r is not None and r.shape[1:] == (layers, top_k):
            n = min(length, r.shape[0])
            out[i, :n] = r[:n]
    return out


@dataclass
class RoutingCapture:
    """The trainer's own routes of one forward, per router: Long[B * L, k] each (None until it ran)."""

    own: list[Optional[Tensor]]


@contextlib.contextmanager
def moe_routing(model: torch.nn.Module, recorded: Optional[Tensor]) -> Iterator[RoutingCapture]:
    """Within the block, every router of ``model`` routes by ``replay_routes``: tokens of ``recorded``
    (Int[B, L, layers, k] aligned with the forward's input ids, NO_ROUTE where none; None: replay
    nothing) go to their recorded experts, the rest to the trainer's own top-k. The trainer's own top-k
    of every token lands in the yielded ``RoutingCapture``. The routers' own forwards come back after."""
    routers = moe_routers(model)
    capture = RoutingCapture([None] * len(routers))
    if recorded is not None and recorded.shape[2] != len(routers):
        raise ValueError(f"recorded routes have {recorded.shape[2]} layers, the model {len(routers)} routers")
    for i, router in enumerate(routers):
        def forward(hidden_states: Tensor, _r: Any = router, _i: int = i) -> tuple[Tensor, Tensor, Tensor]:
            hs = hidden_states.reshape(-1, int(_r.hidden_dim))
            logits = F.linear(hs, _r.weight)
            rec = None if recorded is None else recorded[:, :, _i].reshape(-1, int(_r.top_k))
            routes, weights, own = replay_routes(logits, rec, int(_r.top_k), bool(_r.norm_topk_prob))
            capture.own[_i] = own.detach()
            return logits, weights.to(logits.dtype), routes
        router.forward = forward
    try:
        yield capture
    finally:
        for router in routers:
            if "forward" in router.__dict__:
                del router.forward


@contextlib.contextmanager
def routed_forward(model: torch.nn.Module, input_ids: Tensor, attention_mask: Optional[Tensor]) -> Iterator[None]:
    """``moe_routing`` for one forward of the trainer on ``input_ids`` Int[B, L] under the active table
    (``active_routes``): replays its routes when the table says so, stores the trainer's own routes of
    each row back into it. Nothing happens without an active table or on a dense model."""
    table = current_table()
    routers = moe_routers(model) if table is not None else []
    if table is None or not routers:
        yield
        return
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    layers, top_k = len(routers), int(cast(Any, routers[0]).top_k)
    recorded = batch_routes(table, input_ids, mask, layers, top_k).to(input_ids.device) if table.replay else None
    with moe_routing(model, recorded) as cap:
        yield
    if any(o is None for o in cap.own):
        return
    b, length = input_ids.shape
    own = torch.stack([o.reshape(b, length, top_k) for o in cap.own if o is not None], dim=2).cpu()
    for i, key in enumerate(_row_keys(input_ids, mask)):
        if key in table.routes:
            table.captured[key] = own[i]


__all__ = ["ROUTING_REPLAY_MODES", "RouteTable", "RoutingCapture", "active_routes", "batch_routes", "current_table",
           "moe_routers", "moe_routing", "routed_forward", "row_key", "sample_routes"]
