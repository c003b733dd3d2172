"""The per-step entropy proxies: the update's first-order entropy change estimated from the no-grad pass.

``prepare_update`` calls :func:`proxy_metrics` on tensors it already holds (current log-probs,
advantages, response mask, entropy, the loss mask), so every update step logs, per token class
(``ulorl.algo.entropy_decomp.token_classes`` at ``algo.mpt.tau``), the terms of two proxies:
``entropy/proxy/cov/*`` (Clip-Cov's batch-centred covariance) and ``entropy/proxy/state/*``
(centred per position). Cost: a few element-wise ops on [B, T] tensors. The exact form is
``ulorl.train.entropy_probe`` (opt-in, ``train.entropy_probe_every``).
"""

from __future__ import annotations

from torch import Tensor

from ulorl.algo.entropy_decomp import cov_proxy, decompose, state_cov_proxy, token_classes
from ulorl.tracking.schema import ENTROPY_PROXY_PREFIXES

__all__ = ["proxy_metrics"]


def proxy_metrics(token_logprobs: Tensor, advantages: Tensor, response_mask: Tensor, token_entropy: Tensor,
                  loss_mask: Tensor, tau: float) -> dict[str, float]:
    """``entropy/proxy/{cov,state}/<part>`` of one batch (``ulorl.tracking.schema``).

    Args:
        token_logprobs, token_entropy: Float[B, T] of the no-grad pass (rollout temperature).
        advantages: Float[B]; response_mask: Bool[B, T]; loss_mask: Bool[B, T] (True = not trained).
        tau: the MPT threshold (algo.mpt.tau) that splits the probability buckets.
    """
    classes = token_classes(token_logprobs, advantages, response_mask, tau)
    cov_prefix, state_prefix = ENTROPY_PROXY_PREFIXES
    out = decompose(cov_proxy(token_logprobs, advantages, response_mask), classes, loss_mask).metrics(cov_prefix)
    out.update(decompose(state_cov_proxy(token_logprobs, advantages, response_mask, token_entropy), classes,
                         loss_mask).metrics(state_prefix))
    return out
