"""Deterministic scripted engine for scheduler / trainer tests (no torch, no model).

``ScriptedEngine`` satisfies ``ulorl.rollout.types.Engine``. For one request:

* the response's first token is drawn from ``(prompt_ids, request seed)`` — the only random draw,
  so the G samples of a prompt differ — unless ``seeded_first_token=False``;
* every later token and every log-prob is a pure function of the full context (prompt ids +
  response ids so far), through a rolling hash;
* the response's natural length ``L`` (EOS is its L-th token) is ``lengths[request_id]`` when
  scripted, else ``length_fn(prompt_ids, first_token)``, else drawn from a hash of
  ``(prompt_ids, first_token)`` in ``1..max_len``.

Because the first response token is part of the prefix of every later segment, continuing from a
prefix gives exactly the tokens and log-probs one-shot decoding gives.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ulorl.rollout.types import EngineBase, EngineStats, GenerationRequest, GenerationResult, SamplingParams

_MOD = (1 << 61) - 1
_MUL = 1_000_003


def _roll(h: int, tok: int) -> int:
    return (h * _MUL + tok + 7) % _MOD


def _mix(x: int) -> int:
    """splitmix64 finaliser: spreads a hash over all bits."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class ScriptedEngine(EngineBase):
    """Fake rollout engine; see the module docstring. ``calls`` records every request batch. No context
    limit unless a test sets ``max_model_len``."""

    def __init__(
        self,
        *,
        vocab_size: int = 64,
        eos_token_id: int = 0,
        max_len: int = 32,
        lengths: Optional[dict[int, int]] = None,
        length_fn: Optional[Callable[[tuple[int, ...], int], int]] = None,
        seeded_first_token: bool = True,
    ) -> None:
        if vocab_size < 3:
            raise ValueError("vocab_size must be >= 3")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.max_len = max_len
        self.lengths = dict(lengths or {})
        self.length_fn = length_fn
        self.seeded_first_token = seeded_first_token
        self.policy_version = 0
        self.calls: list[list[GenerationRequest]] = []
        self.last_stats: Optional[EngineStats] = None

    # -- pure token functions -----------------------------------------------------------------
    def _token_from(self, h: int) -> int:
        """A non-EOS token id from a hash."""
        tok = _mix(h) % (self.vocab_size - 1)
        return tok if tok < self.eos_token_id else tok + 1

    def logprob(self, context_hash: int, token: int) -> float:
        return -(1 + _mix(context_hash ^ (token * 0x2545F4914F6CDD1D)) % 4000) / 1000.0

    def first_token(self, prompt_ids: list[int], seed: int) -> int:
        h = 0
        for t in prompt_ids:
            h = _roll(h, t)
        return self._token_from(_roll(h, seed if self.seeded_first_token else 0) ^ 0x5A5A)

    def natural_length(self, request_id: int, prompt_ids: list[int], first_token: int) -> int:
        if request_id in self.lengths:
            return self.lengths[request_id]
        if self.length_fn is not None:
            return self.length_fn(tuple(prompt_ids), first_token)
        h = 0
        for t in list(prompt_ids) + [first_token]:
            h = _roll(h, t)
        return 1 + _mix(h ^ 0xA5A5) % self.max_len

    # -- Engine protocol ----------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationResult]:
        self.calls.append([GenerationRequest(**q.__dict__) for q in requests])
        results = []
        for q in requests:
            results.append(self._one(q))
        iters = max((len(r.token_ids) for r in results), default=0)
        useful = sum(len(r.token_ids) for r in results)
        self.last_stats = EngineStats(
            decode_iterations=iters, row_slots=iters * len(requests), useful_tokens=useful,
            prefill_tokens=sum(len(q.prompt_ids) + len(q.prefix_ids) for q in requests),
            batch_rows=len(requests))
        return results

    def _one(self, q: GenerationRequest) -> GenerationResult:
        h = 0
        for t in q.prompt_ids:
            h = _roll(h, t)
        resp = list(q.prefix_ids)
        for t in resp:
            h = _roll(h, t)
        first = resp[0] if resp else self.first_token(q.prompt_ids, q.seed)
        length = self.natural_length(q.request_id, q.prompt_ids, first)
        if resp and len(resp) >= length:
            raise AssertionError(f"request {q.request_id}: prefix of {len(resp)} tokens is past its EOS at {length}")
        toks: list[int] = []
        lps: list[float] = []
        reason = "length"
        while len(toks) < q.max_new_tokens:
            pos = len(resp)
            if pos == length - 1:
                tok = self.eos_token_id
            elif pos == 0:
                tok = first
            else:
                tok = self._token_from(h)
            toks.append(tok)
            lps.append(self.logprob(h, tok))
            resp.append(tok)
            h = _roll(h, tok)
            if tok == self.eos_token_id:
                reason = "eos"
                break
        return GenerationResult(request_id=q.request_id, token_ids=toks, logprobs=lps, finish_reason=reason)

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.policy_version = version
