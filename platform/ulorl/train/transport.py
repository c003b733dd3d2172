"""Released samples as a few flat tensors (what trainer ranks need to train on them), and back.

    packed = pack_samples(samples)        # PackedSamples: 5 tensors, no Python objects
    samples = unpack_samples(packed)      # Sample objects with what ``policy_update`` reads

Rank 0 broadcasts these tensors once per update instead of a pickled list of ``Sample`` objects
(text, metadata): token ids travel as int32, everything a worker rank does not read stays on rank 0.
The engine's sampled-token log-probs travel (every rank computes the rollout correction's weights).

Tensors (n samples, P / R = total prompt / response tokens, S = total segments, O = total SAIS
log-probs):

    meta       Int64[n, 7]   sample_id, group_id, prompt_len, response_len, old_logprobs_len, n_segments,
                             has_reward (0: reward None)
    rewards    Float64[n]    the reward (NaN stays NaN: a bad reward must reach every rank as it is)
    tokens     Int32[P + R]  prompt ids then response ids of each sample, sample after sample
    old_lp     Float32[O + R] ``old_logprobs`` (SAIS) of each sample, sample after sample; then the
                             engine's ``sampling_logprobs`` of each response token, sample after sample
                             (NaN for a sample without one per response token: it gets none back)
    segments   Int64[S, 3]   (start, end, version) of each sample's segments, sample after sample
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan

META_COLUMNS = 7


@dataclass
class PackedSamples:
    meta: torch.Tensor
    rewards: torch.Tensor
    tokens: torch.Tensor
    old_lp: torch.Tensor
    segments: torch.Tensor

    def sizes(self) -> torch.Tensor:
        """Int64[4]: n, tokens, old_lp, segments (what a receiver allocates)."""
        return torch.tensor([self.meta.shape[0], self.tokens.numel(), self.old_lp.numel(), self.segments.shape[0]],
                            dtype=torch.int64)

    def tensors(self) -> list[torch.Tensor]:
        return [self.meta, self.rewards, self.tokens, self.old_lp, self.segments]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def empty_packed(sizes: torch.Tensor) -> PackedSamples:
    """Receive buffers for ``sizes`` (from ``PackedSamples.sizes``)."""
    n, tok, olp, seg = (int(x) for x in sizes.tolist())
    return PackedSamples(
        meta=torch.empty((n, META_COLUMNS), dtype=torch.int64), rewards=torch.empty(n, dtype=torch.float64),
        tokens=torch.empty(tok, dtype=torch.int32), old_lp=torch.empty(olp, dtype=torch.float32),
        segments=torch.empty((seg, 3), dtype=torch.int64),
    )


def pack_samples(samples: list[Sample]) -> PackedSamples:
    meta = torch.tensor(
        [[s.sample_id, s.group_id, len(s.prompt_ids), len(s.response_ids), len(s.old_logprobs), len(s.segments),
          int(s.reward is not None)]
         for s in samples], dtype=torch.int64,
    ).reshape(len(samples), META_COLUMNS)
    rewards = torch.tensor([0.0 if s.reward is None else float(s.reward) for s in samples], dtype=torch.float64)
    tokens = torch.tensor([t for s in samples for t in (*s.prompt_ids, *s.response_ids)], dtype=torch.int32)
    nan = float("nan")
    sampling = [x for s in samples for x in (s.sampling_logprobs if len(s.sampling_logprobs) == len(s.response_ids)
                                              else [nan] * len(s.response_ids))]
    old_lp = torch.tensor([x for s in samples for x in s.old_logprobs] + sampling, dtype=torch.float32)
    segments = torch.tensor([[g.start, g.end, g.version] for s in samples for g in s.segments],
                            dtype=torch.int64).reshape(-1, 3)
    return PackedSamples(meta, rewards, tokens, old_lp, segments)


def unpack_samples(p: PackedSamples) -> list[Sample]:
    out: list[Sample] = []
    tok = p.tokens.tolist()
    olp = p.old_lp.tolist()
    seg = p.segments.tolist()
    t = o = g = 0
    e = int(p.meta[:, 4].sum()) if len(p.meta) else 0   # the engine log-probs follow the SAIS ones
    for (sid, gid, plen, rlen, olen, nseg, has_reward), r in zip(p.meta.tolist(), p.rewards.tolist()):
        sampling = olp[e:e + rlen]
        out.append(Sample(
            sample_id=sid, group_id=gid, prompt_ids=tok[t:t + plen], response_ids=tok[t + plen:t + plen + rlen],
            old_logprobs=olp[o:o + olen], segments=[SegmentSpan(*x) for x in seg[g:g + nseg]],
            sampling_logprobs=[] if any(math.isnan(x) for x in sampling) else sampling,
            status=SampleStatus.FINISHED, reward=r if has_reward else None,
        ))
        t, o, g, e = t + plen + rlen, o + olen, g + nseg, e + rlen
    return out
