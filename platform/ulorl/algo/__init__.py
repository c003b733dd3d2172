"""UloRL algorithm math: pure tensor functions, no I/O, no model.

Shapes: N = samples (flat), B x T = samples x tokens (padded), V = vocabulary.

One update, in order (tests/test_algo_pipeline.py runs exactly this)::

    keep = dynamic_sampling_filter(rewards, group_ids)            # Bool[N]; drop no-signal groups
    adv = group_advantages(rewards[keep], group_ids[keep])        # Float[B]
    with torch.no_grad():                                          # before the first optimizer step
        cur, _ = logprobs_and_entropy(model_logits(), labels, temperature)
    old = select_old_logprobs(is_mode, cur, sais_logprobs)         # Float[B, T], detached
    logprobs, entropy = logprobs_and_entropy(model_logits(), labels, temperature)  # grad / no grad
    mask = mask_mode(mode).mask(MaskInputs(logprobs, rewards[keep], response_mask, entropy, tau=tau, sigma=sigma))
    # entropy control (algo.entropy_control): a mask ("clip_cov", "high_entropy_minority") adds to ``mask``;
    # "kl_cov" penalises its tokens in kl_cov_loss instead of policy_loss
    acted = entropy_control(control).select(ControlInputs(logprobs, old, adv, response_mask, entropy))
    loss, metrics = policy_loss(logprobs, old, adv, response_mask, mask, eps_low, eps_high, num_tokens=n_global)
    loss.backward()

``labels[b, t]`` is the token at position t + 1 (logits predict the next token); ``response_mask``
marks response positions in that shifted frame.
"""

from ulorl.algo.advantages import group_advantages
from ulorl.algo.entropy import token_entropy
from ulorl.algo.entropy_control import ENTROPY_CONTROLS, ControlInputs, EntropyControl, entropy_control, kl_cov_loss
from ulorl.algo.filters import dynamic_sampling_filter
from ulorl.algo.importance import IS_MODES, select_old_logprobs
from ulorl.algo.logprobs import logprobs_and_entropy, logprobs_from_logits
from ulorl.algo.loss import LOSS_AGG, policy_loss
from ulorl.algo.masks import (
    ENTROPY_SCOPES,
    MASK_MODES,
    MaskInputs,
    MaskMode,
    dmmpt_mask,
    mask_mode,
    mean_response_entropy,
    mpt_mask,
)

__all__ = [
    "ENTROPY_CONTROLS",
    "ENTROPY_SCOPES",
    "IS_MODES",
    "LOSS_AGG",
    "MASK_MODES",
    "ControlInputs",
    "EntropyControl",
    "MaskInputs",
    "MaskMode",
    "dmmpt_mask",
    "dynamic_sampling_filter",
    "entropy_control",
    "group_advantages",
    "kl_cov_loss",
    "logprobs_and_entropy",
    "logprobs_from_logits",
    "mask_mode",
    "mean_response_entropy",
    "mpt_mask",
    "policy_loss",
    "select_old_logprobs",
    "token_entropy",
]
