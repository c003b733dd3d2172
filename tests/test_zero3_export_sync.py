"""ZeRO-3 export: each gathered bucket is synchronised before its gather is left (vLLM's packed NCCL
broadcast reads it from side streams; DeepSpeed frees it for its allocation stream only)."""

from __future__ import annotations

import contextlib

import torch

from ulorl.train.deepspeed_backend import hold_while_consumed, synchronize_device_of


def test_each_bucket_is_synchronised_before_its_gather_is_left():
    events: list[str] = []

    @contextlib.contextmanager
    def gather(bucket):
        events.append(f"gather {bucket[0][0]}")
        yield
        events.append(f"release {bucket[0][0]}")

    buckets = iter([[("a", None)], [("b", None)]])
    for bucket in hold_while_consumed(buckets, gather, lambda b: events.append(f"sync {b[0][0]}")):
        events.append(f"read {bucket[0][0]}")
    assert events == ["gather a", "read a", "sync a", "release a", "gather b", "read b", "sync b", "release b"]


def test_synchronize_is_a_no_op_for_cpu_tensors(monkeypatch):
    called: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: called.append(dev))
    synchronize_device_of([("w", torch.nn.Parameter(torch.zeros(2)))])
    assert called == []
