"""MoE routing: the experts a top-k router picks, replaying recorded ones (R3), and how two routings differ.

Pure tensor functions over router logits. A top-k router (Qwen3-MoE's ``Qwen3MoeTopKRouter``) turns a
token's logits ``z`` Float[E] into ``p = softmax(z)``, picks the k largest ``p`` (``own_routes``) and weighs
expert e by ``p_e`` over the chosen set, renormalised to sum 1 when ``norm_topk_prob``.

Rollout routing replay (R3, "Stabilizing MoE Reinforcement Learning by Aligning Training and Inference
Routers", arXiv 2510.11370): the trainer routes each token to the experts the rollout engine chose
(``recorded``), and computes the gate weights of those experts from its own router logits, so the
router still gets a gradient and the weights follow the trainer's numerics (``replay_routes``).

Recorded routes are stored compactly (``route_dtype``): uint8 while E <= 256 (Qwen3-30B-A3B has 128
experts), int16 beyond; ``route_bytes_per_token`` is the cost. A token with no record carries -1 in a
signed tensor (``NO_ROUTE``); ``replay_routes`` routes it by the trainer's own choice.
"""

from __future__ import annotations

import torch
from torch import Tensor

NO_ROUTE = -1


def own_routes(router_logits: Tensor, top_k: int) -> Tensor:
    """Long[N, k]: the k experts of largest softmax probability per token, in descending order.

    router_logits: Float[N, E]. Softmax is monotone, so this is the top-k of the logits; it is taken on the
    float32 softmax as the model does, so ties broken there break the same way."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
    return torch.topk(probs, top_k, dim=-1).indices


def gate_weights(router_logits: Tensor, routes: Tensor, norm_topk_prob: bool) -> Tensor:
    """Float[N, k] (float32): each chosen expert's softmax probability under ``router_logits`` Float[N, E],
    renormalised over the k chosen when ``norm_topk_prob`` (then the softmax of the chosen logits alone).
    routes: Long[N, k], no entry < 0. Differentiable in ``router_logits``."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
    w = probs.gather(-1, routes.long())
    if norm_topk_prob:
        w = w / w.sum(dim=-1, keepdim=True)
    return w


def replay_routes(router_logits: Tensor, recorded: Tensor | None, top_k: int,
                  norm_topk_prob: bool) -> tuple[Tensor, Tensor, Tensor]:
    """R3 routing of N tokens: ``(routes Long[N, k], weights Float[N, k], own Long[N, k])``.

    router_logits: Float[N, E], the trainer's. recorded: Int[N, k] (any integer dtype; a row with a negative
    entry has no record) or None. A recorded row is routed to its recorded experts, the others to ``own``
    (the trainer's own top-k, returned as well for measuring disagreement). Weights: ``gate_weights`` of the
    trainer's logits over the routes taken.
    """
    own = own_routes(router_logits, top_k)
    if recorded is None:
        routes = own
    else:
        if recorded.shape != own.shape:
            raise ValueError(f"recorded routes shape {tuple(recorded.shape)} must be [tokens, top_k] = "
                             f"{tuple(own.shape)}")
        rec = recorded.to(device=own.device, dtype=torch.long)
        has = (rec >= 0).all(dim=-1, keepdim=True)
        routes = torch.where(has, rec, own)
    return routes, gate_weights(router_logits, routes, norm_topk_prob), own


def routes_differ(a: Tensor, b: Tensor) -> Tensor:
    """Bool[...]: whether two routings pick different expert SETS (order within the k ignored).
    a, b: Int[..., k]."""
    return (a.long().sort(dim=-1).values != b.long().sort(dim=-1).values).any(dim=-1)


def routing_mismatch(trainer: Tensor, engine: Tensor, measured: Tensor) -> dict[str, float]:
    """How often the trainer's own routing differs from the engine's on ``measured`` tokens.

    trainer, engine: Int[B, T, layers, k]; measured: Bool[B, T] (tokens with a record, same weights).
    Returns (empty when nothing is measured) ``tokens``, ``token_frac`` (share of tokens with a different
    expert set in at least one layer), ``token_layer_frac`` (share of token-layers with a different set).
    """
    if not bool(measured.any()):
        return {}
    diff = routes_differ(trainer, engine)[measured]          # [n, layers]
    return {"tokens": float(diff.shape[0]), "token_frac": float(diff.any(dim=-1).double().mean()),
            "token_layer_frac": float(diff.double().mean())}


def route_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer dtype that stores an expert index of ``num_experts``: uint8 (E <= 256), int16
    (E <= 32768)."""
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 32768:
        return torch.int16
    raise ValueError(f"num_experts {num_experts} > 32768 has no compact route dtype")


def route_bytes_per_token(num_layers: int, top_k: int, num_experts: int) -> int:
    """Bytes one token's recorded routes take: layers x k x the ``route_dtype`` size
    (Qwen3-30B-A3B: 48 x 8 x 1 = 384; 131,072 tokens: 50,331,648 bytes = 48 MiB)."""
    return num_layers * top_k * torch.empty((), dtype=route_dtype(num_experts)).element_size()


__all__ = ["NO_ROUTE", "gate_weights", "own_routes", "replay_routes", "route_bytes_per_token", "route_dtype",
           "routes_differ", "routing_mismatch"]
