"""Pack released sample groups into padded training tensors.

Layout ("target-aligned"): ``input_ids[b]`` = prompt + response, right-padded to L. Position t of every
[B, L-1] tensor refers to the prediction of ``input_ids[b, t+1]`` from the logits at t, so a response
token j of sample b sits at t = len(prompt_b) - 1 + j.

Token tensors are int32 (``targets`` is a view of ``input_ids``): a step of 128k-token rows keeps
4 bytes per token; micro-batches (``TrainBatch.rows``) are sliced from them and cast to int64 on
the device only where a kernel needs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ulorl.rollout.types import Sample


@dataclass
class TrainBatch:
    input_ids: torch.Tensor        # [B, L] int32
    attention_mask: torch.Tensor   # [B, L] int32 (1 = real token)
    targets: torch.Tensor          # [B, L-1] int32, input_ids[:, 1:] (a view)
    response_mask: torch.Tensor    # [B, L-1] bool, True at response-token targets
    sais_logprobs: torch.Tensor    # [B, L-1] float, stored per-segment old log-probs (SAIS), 0 elsewhere
    token_versions: torch.Tensor   # [B, L-1] int32, policy version that generated each response token (-1 elsewhere)
    rewards: torch.Tensor          # [B] float
    group_ids: torch.Tensor        # [B] long
    prompt_lens: list[int]
    response_lens: list[int]

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    def rows(self, index: list[int]) -> TrainBatch:
        """Sub-batch of rows ``index`` trimmed to its own longest sequence."""
        idx = torch.tensor(index, dtype=torch.long)
        length = max(self.prompt_lens[i] + self.response_lens[i] for i in index)
        return TrainBatch(
            input_ids=self.input_ids[idx, :length],
            attention_mask=self.attention_mask[idx, :length],
            targets=self.targets[idx, : length - 1],
            response_mask=self.response_mask[idx, : length - 1],
            sais_logprobs=self.sais_logprobs[idx, : length - 1],
            token_versions=self.token_versions[idx, : length - 1],
            rewards=self.rewards[idx],
            group_ids=self.group_ids[idx],
            prompt_lens=[self.prompt_lens[i] for i in index],
            response_lens=[self.response_lens[i] for i in index],
        )


def build_train_batch(samples: list[Sample], pad_token_id: int) -> TrainBatch:
    """Samples (each with a reward) -> right-padded ``TrainBatch``."""
    if not samples:
        raise ValueError("build_train_batch needs at least one sample")
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    L = max(len(x) for x in seqs)
    B = len(samples)
    input_ids = torch.full((B, L), pad_token_id, dtype=torch.int32)
    attention_mask = torch.zeros((B, L), dtype=torch.int32)
    response_mask = torch.zeros((B, L - 1), dtype=torch.bool)
    sais = torch.zeros((B, L - 1), dtype=torch.float32)
    versions = torch.full((B, L - 1), -1, dtype=torch.int32)
    for b, (s, seq) in enumerate(zip(samples, seqs)):
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.int32)
        attention_mask[b, : len(seq)] = 1
        p, t = len(s.prompt_ids), len(s.response_ids)
        if t == 0:
            continue
        response_mask[b, p - 1 : p - 1 + t] = True
        if s.old_logprobs:  # may be shorter while a segment is being scored (SAIS)
            n = min(t, len(s.old_logprobs))
            sais[b, p - 1 : p - 1 + n] = torch.tensor(s.old_logprobs[:n], dtype=torch.float32)
        versions[b, p - 1 : p - 1 + t] = torch.tensor(s.token_versions()[:t], dtype=torch.int32)
    rewards = torch.tensor([float(s.reward or 0.0) for s in samples], dtype=torch.float32)
    group_ids = torch.tensor([s.group_id for s in samples], dtype=torch.long)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        targets=input_ids[:, 1:],
        response_mask=response_mask,
        sais_logprobs=sais,
        token_versions=versions,
        rewards=rewards,
        group_ids=group_ids,
        prompt_lens=[len(s.prompt_ids) for s in samples],
        response_lens=[len(s.response_ids) for s in samples],
    )


def scatter_rows(full: torch.Tensor, rows: list[int], part: torch.Tensor) -> None:
    """Write a sub-batch's values [b, l] into rows ``rows`` of a full-batch tensor [B, L] (l <= L)."""
    full[torch.tensor(rows, dtype=torch.long), : part.shape[1]] = part


def row_lengths(batch: TrainBatch) -> list[int]:
    """Tokens of each row (prompt + response)."""
    return [p + r for p, r in zip(batch.prompt_lens, batch.response_lens)]


#: what one more micro-batch costs besides its tokens, counted in padded tokens: the fixed overhead of
#: a forward + backward call (on a CPU about a hundred tokens of the tiny model's work; a GPU's larger
#: launch overhead is still small next to one long row)
MICRO_BATCH_OVERHEAD_TOKENS = 128


def micro_batches(batch: TrainBatch, token_budget: int,
                  overhead_tokens: int = MICRO_BATCH_OVERHEAD_TOKENS) -> list[list[int]]:
    """Split rows into micro-batches whose padded size (rows x longest row) stays within budget.

    Rows are taken in order of length (sorted length buckets) and cut where the padded tokens plus
    ``overhead_tokens`` per micro-batch are smallest (``padding_plan``): a batch of long-tailed
    responses is not padded to its long rows' length, where a first-fit split filled one
    micro-batch with short rows padded to the longest that still fit. A single row longer than the
    budget cannot be split here: it forms a micro-batch of its own (see ``rows_over_cap``; sequence
    parallelism is what splits such a row).
    """
    lengths = row_lengths(batch)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    plan = padding_plan([lengths[i] for i in order], token_budget, overhead_tokens)
    return [order[a:b] for a, b in plan]


def padding_plan(sorted_lengths: list[int], token_budget: int, overhead_tokens: int) -> list[tuple[int, int]]:
    """Cut ascending ``sorted_lengths`` into runs ``[a, b)`` minimising the sum over runs of
    ``(b - a) * sorted_lengths[b - 1] + overhead_tokens`` (padded tokens plus a per-run cost), each run
    within ``token_budget`` padded tokens unless it is one row. Exact (dynamic programming over the
    cut points; the runs of an optimal split of sorted lengths are contiguous)."""
    n = len(sorted_lengths)
    best = [0] + [-1] * n          # best[b]: least cost of rows [0, b)
    cut = [0] * (n + 1)            # cut[b]: start of the last run of that split
    for b in range(1, n + 1):
        longest = sorted_lengths[b - 1]
        for a in range(b - 1, -1, -1):
            rows = b - a
            if rows > 1 and rows * longest > token_budget:
                break
            cost = best[a] + rows * longest + overhead_tokens
            if best[b] < 0 or cost < best[b]:
                best[b], cut[b] = cost, a
    runs: list[tuple[int, int]] = []
    b = n
    while b > 0:
        runs.append((cut[b], b))
        b = cut[b]
    return runs[::-1]


def rows_over_cap(batch: TrainBatch, token_budget: int) -> list[int]:
    """Lengths of the rows longer than ``token_budget`` (each trained alone, over the cap)."""
    return [n for n in row_lengths(batch) if n > token_budget]
