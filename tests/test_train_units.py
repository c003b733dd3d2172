"""Trainer building blocks: batch packing, micro-batching, mini-batches, atomic checkpoints, tracker URIs."""

from __future__ import annotations

import os

import pytest
import torch

from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
from ulorl.train.batch import build_train_batch, micro_batches
from ulorl.train.checkpoint import latest_checkpoint, read_trainer_state, write_checkpoint
from ulorl.train.update import split_minibatches
from ulorl.tracking.uri import absolutize_uri, resolve_tracking_uri


def _sample(i: int, prompt: list[int], resp: list[int], reward: float, group: int = 0) -> Sample:
    s = Sample(sample_id=i, group_id=group, prompt_ids=prompt, response_ids=resp,
               sampling_logprobs=[-0.1] * len(resp), status=SampleStatus.FINISHED, reward=reward)
    half = len(resp) // 2
    s.segments = [SegmentSpan(0, half, 3), SegmentSpan(half, len(resp), 4)]
    s.old_logprobs = [-0.5 - 0.1 * j for j in range(len(resp))]
    return s


def test_build_train_batch_target_alignment():
    a = _sample(0, [5, 6, 7], [8, 9], 1.0)
    b = _sample(1, [5], [10, 11, 12, 13], 0.0)
    batch = build_train_batch([a, b], pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 10, 11, 12, 13]]
    # logits at t predict input_ids[t+1]: response of a starts at t = 3 - 1 = 2
    assert batch.response_mask.tolist() == [[False, False, True, True], [True, True, True, True]]
    assert batch.targets[0, 2:].tolist() == [8, 9]
    assert batch.token_versions[0].tolist() == [-1, -1, 3, 4]
    assert batch.token_versions[1].tolist() == [3, 3, 4, 4]
    assert torch.allclose(batch.sais_logprobs[0, 2:], torch.tensor([-0.5, -0.6]))
    assert batch.num_response_tokens == 6
    assert batch.rewards.tolist() == [1.0, 0.0]


def test_rows_trims_to_own_length():
    a = _sample(0, [5, 6, 7], [8, 9], 1.0)
    b = _sample(1, [5], [10, 11, 12, 13, 14, 15, 16], 0.0)
    batch = build_train_batch([a, b], pad_token_id=0)
    sub = batch.rows([0])
    assert sub.input_ids.shape == (1, 5) and sub.targets.shape == (1, 4)


def test_micro_batches_respect_budget_and_cover_rows():
    samples = [_sample(i, [1] * 4, [2] * n, 1.0) for i, n in enumerate([2, 10, 3, 20, 5])]
    batch = build_train_batch(samples, 0)
    mbs = micro_batches(batch, token_budget=30)
    assert sorted(i for mb in mbs for i in mb) == list(range(5))
    lengths = [4 + n for n in [2, 10, 3, 20, 5]]
    for mb in mbs:
        assert len(mb) == 1 or max(lengths[i] for i in mb) * len(mb) <= 30


def test_split_minibatches_keeps_groups_whole():
    gids = [0, 0, 1, 1, 2, 2, 3, 3]
    parts = split_minibatches(gids, 2)
    assert len(parts) == 2
    for part in parts:
        assert len({gids[i] for i in part}) * 2 == len(part)
    assert split_minibatches(gids, 10) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_checkpoint_atomic_latest_and_pruning(tmp_path):
    def payload(d):
        (d / "weights.bin").write_bytes(b"x" * 10)

    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step, {"step": step}, payload, keep=2)
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step_000003"
    assert read_trainer_state(latest)["step"] == 3
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]

    def crashing(d):
        (d / "half.bin").write_bytes(b"y")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_checkpoint(tmp_path, 4, {"step": 4}, crashing, keep=2)
    assert latest_checkpoint(tmp_path).name == "step_000003"  # a crash mid-write never moves "latest"


def test_tracking_uri_resolution(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///rel.db")
    assert resolve_tracking_uri() == f"sqlite:///{tmp_path / 'rel.db'}"
    assert resolve_tracking_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert absolutize_uri("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert os.path.isabs(absolutize_uri("x.db")[len("sqlite:///"):])
