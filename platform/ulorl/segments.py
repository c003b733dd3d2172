"""Segment length of segment rollout (PAPER.md section 1): the one rule the config, the scheduler and
the rollout simulator share.

A response of at most ``L`` tokens is decoded in at most ``S`` segments, so a segment is
``ceil(L / S)`` tokens long and the last one is clipped at ``L`` (floor division would need an
``S + 1``-th segment whenever ``S`` does not divide ``L``). Experiment configs require ``S | L``,
where the two roundings agree. Imports nothing: the scheduler and the simulator stay free of torch.
"""

from __future__ import annotations


def segment_length(max_response_len: int, segments: int) -> int:
    """Tokens per segment, ``ceil(max_response_len / segments)`` (= ``max_response_len // segments``
    when ``segments`` divides it).

    Raises ValueError when either argument is below 1.
    """
    if max_response_len < 1 or segments < 1:
        raise ValueError(
            f"segment_length needs max_response_len >= 1 and segments >= 1, "
            f"got max_response_len={max_response_len}, segments={segments}"
        )
    return -(-max_response_len // segments)
