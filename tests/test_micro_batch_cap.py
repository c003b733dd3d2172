"""Token-capped micro-batches: sorted buckets, int32 tensors, rows over the cap counted and warned once,
and the Eq. 10 denominator (all response tokens of the mini-batch, masked MPTs included) unchanged by
how the rows are split."""

from __future__ import annotations

import logging

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ulorl.config import AlgoConfig, TrainConfig
from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
from ulorl.train.backend import TorchBackend
from ulorl.train.batch import build_train_batch, micro_batches, row_lengths, rows_over_cap
from ulorl.train.forward import token_stats
from ulorl.algo import group_advantages
from ulorl.train.update import UpdateContext, policy_update


def _sample(i: int, group: int, prompt: list[int], resp: list[int], reward: float) -> Sample:
    s = Sample(sample_id=i, group_id=group, prompt_ids=prompt, response_ids=resp,
               sampling_logprobs=[0.0] * len(resp), status=SampleStatus.FINISHED, reward=reward)
    s.segments = [SegmentSpan(0, len(resp), 0)]
    return s


def _samples() -> list[Sample]:
    g = torch.Generator().manual_seed(0)

    def toks(n: int) -> list[int]:
        return torch.randint(1, 40, (n,), generator=g).tolist()

    lens = [3, 17, 6, 30, 9, 4]
    return [_sample(i, i // 2, toks(2), toks(n), float(i % 2 == 0)) for i, n in enumerate(lens)]


def test_micro_batches_are_sorted_capped_and_int32():
    batch = build_train_batch(_samples(), pad_token_id=0)
    assert batch.input_ids.dtype == torch.int32 and batch.targets.dtype == torch.int32
    assert batch.targets.data_ptr() == batch.input_ids[:, 1:].data_ptr()  # a view, not a copy
    lengths = row_lengths(batch)
    mbs = micro_batches(batch, token_budget=20)
    assert sorted(i for mb in mbs for i in mb) == list(range(len(lengths)))
    flat = [lengths[i] for mb in mbs for i in mb]
    assert flat == sorted(flat)  # sorted length buckets
    for mb in mbs:
        padded = len(mb) * max(lengths[i] for i in mb)
        assert padded <= 20 or len(mb) == 1  # only a lone row may exceed the cap
    assert rows_over_cap(batch, 20) == [32]
    sub = batch.rows(mbs[0])
    assert sub.input_ids.dtype == torch.int32


def _tiny() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=41, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64)
    return Qwen3ForCausalLM(cfg)


class GradRecorder(TorchBackend):
    """TorchBackend that keeps the gradient of each step (the test reads it, no update is applied)."""

    def step(self) -> float:
        self.grads = [p.grad.detach().clone() for p in self.model.parameters()]
        self.optimizer.zero_grad(set_to_none=True)
        return 1.0


def _update(budget: int, caplog=None):
    model = _tiny()
    train = TrainConfig(micro_batch_tokens=budget)
    # static MPT with a low tau: many positive-advantage tokens are masked (Eq. 10's 1 - I_mask)
    algo = AlgoConfig(dynamic_sampling=False, mpt={"mode": "static", "tau": 0.02})
    backend = GradRecorder(model, train)
    res = policy_update(_samples(), UpdateContext(backend, algo, train, 0.9, 0, torch.device("cpu")))
    return model, backend, res


def test_eq10_denominator_counts_masked_tokens_for_any_split(caplog):
    with caplog.at_level(logging.WARNING, logger="ulorl.train.update"):
        model, small, res_small = _update(budget=20)
    _, big, res_big = _update(budget=10_000)
    assert res_small.updated and res_small.metrics["train/rows_over_cap"] == 1.0
    assert res_big.metrics["train/rows_over_cap"] == 0.0
    warned = [r for r in caplog.records if "exceeds train.micro_batch_tokens" in r.getMessage()]
    assert len(warned) == 1 and "32 tokens" in warned[0].getMessage() and "=20" in warned[0].getMessage()

    # hand-built loss of the first update (ratio 1, no clipping): -sum_kept A * logp / N_all
    batch = res_small.batch
    resp, masked = batch.response_mask, res_small.loss_mask
    assert masked.sum() > 0 and (resp & ~masked).sum() > 0
    model.zero_grad(set_to_none=True)
    model.train()
    lp, _ = token_stats(model, batch, 0.9, torch.device("cpu"))
    adv = group_advantages(batch.rewards, batch.group_ids)[:, None]
    kept = resp & ~masked
    n_all = resp.sum()
    (-(adv * lp * kept).sum() / n_all).backward()
    want = [p.grad for p in model.parameters()]
    for a, b, w in zip(small.grads, big.grads, want):
        torch.testing.assert_close(a, w, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(b, w, atol=1e-6, rtol=1e-5)
    # the wrong denominator (kept tokens only) gives gradients larger by N_all / N_kept: not what ran
    ratio = float(n_all) / float(kept.sum())
    assert ratio > 1.1
    assert not torch.allclose(small.grads[0] * ratio, want[0], atol=1e-6, rtol=1e-5)
