"""Bucketed weight transfer (``rollout/weight_sync.py``) and the engine's scale options (pure; no vLLM).

The vLLM side of the transfer (greedy after a bucketed sync equals HF) is in tests/vllm."""

from __future__ import annotations

import pytest
import torch

from ulorl.rollout.engines.vllm import (
    default_cpu_thread_bind,
    engine_options,
    native_trainer_init_info,
    rope_overrides,
)
from ulorl.rollout.types import EngineBase
from ulorl.rollout.weight_sync import (
    SharedBucket,
    bucket_bytes_from_mb,
    bucketize,
    open_shared_bucket,
    pack_bucket,
    packed_size,
    plan_buckets,
    push_weights,
    unpack_bucket,
)


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(4, 8, generator=g),                       # 128 B
        "b": torch.randn(16, generator=g).to(torch.bfloat16),      # 32 B
        "c": torch.randn(64, generator=g),                         # 256 B: larger than a 200 B bucket
        "d": torch.arange(6, dtype=torch.int64).reshape(2, 3),     # 48 B
        "e": torch.randn(8, generator=g)[::2],                     # non-contiguous, 16 B
        "f": torch.zeros(0),                                       # empty
    }


def test_buckets_respect_the_bound_and_keep_order():
    w = _weights()
    buckets = list(bucketize(w, 200))
    assert [[n for n, _ in b] for b in buckets] == [["a", "b"], ["c"], ["d", "e", "f"]]
    assert [n for b in buckets for n, _ in b] == list(w)
    for b in buckets:
        size = sum(t.numel() * t.element_size() for _, t in b)
        assert size <= 200 or len(b) == 1              # an oversize tensor travels alone
    plan = plan_buckets([t.numel() * t.element_size() for t in w.values()], 200)
    assert (plan.num_buckets, plan.largest_bucket_bytes, plan.total_bytes) == (3, 256, 480)
    assert len(list(bucketize(w, 10**9))) == 1


def test_bucketize_is_lazy():
    pulled = []

    def stream():
        for i in range(6):
            pulled.append(i)
            yield f"p{i}", torch.zeros(25)               # 100 B each

    it = bucketize(stream(), 250)
    first = next(it)
    assert [n for n, _ in first] == ["p0", "p1"]
    assert pulled == [0, 1, 2]                           # only one tensor beyond the bucket was read


def test_pack_unpack_round_trip_exact():
    w = _weights()
    blob = pack_bucket(list(w.items()))
    assert len(blob) == packed_size(list(w.items()))
    for buf in (blob, bytes(blob), memoryview(blob)):
        got = unpack_bucket(buf)
        assert [n for n, _ in got] == list(w)
        for (n, t) in got:
            assert t.dtype == w[n].dtype and t.shape == w[n].shape
            assert torch.equal(t, w[n])


def test_shared_bucket_round_trip_and_cleanup(tmp_path):
    w = _weights()
    with SharedBucket(list(w.items()), directory=str(tmp_path)) as shared:
        got = open_shared_bucket(shared.path)
    assert not list(tmp_path.iterdir())                  # unlinked; the mapping lives on in the views
    for n, t in got:
        assert torch.equal(t, w[n])


def test_bucket_size_validation():
    assert bucket_bytes_from_mb(1) == 1 << 20
    with pytest.raises(ValueError, match="weight_sync_bucket_mb"):
        bucket_bytes_from_mb(0)
    with pytest.raises(TypeError, match="weight 'z'"):
        pack_bucket([("z", torch.zeros(2, dtype=torch.complex64))])


class _StreamEngine(EngineBase):
    streams_weights = True

    def __init__(self):
        self.got = None

    def update_weights_streamed(self, weights, version):
        self.got = (list(weights), version)

    def update_weights(self, state_dict, version):
        self.got = (dict(state_dict), version)


class _PlainEngine(EngineBase):
    def __init__(self):
        self.got = None
        self.streamed = False

    def update_weights(self, state_dict, version):
        self.got = (dict(state_dict), version)

    def update_weights_streamed(self, weights, version):   # present, but streams_weights is False
        self.streamed = True


class _Backend:
    def named_weights_for_rollout(self):
        yield "w", torch.ones(2)

    @property
    def rollout_weight_stream(self):
        return self.named_weights_for_rollout

    def state_dict_for_rollout(self):
        return {"w": torch.ones(2)}


def test_push_weights_streams_to_streaming_engines_only():
    se, pe = _StreamEngine(), _PlainEngine()
    push_weights(se, _Backend(), 3)
    push_weights(pe, _Backend(), 4)
    assert [n for n, _ in se.got[0]] == ["w"] and se.got[1] == 3
    assert list(pe.got[0]) == ["w"] and pe.got[1] == 4 and not pe.streamed


def test_push_weights_hands_a_backend_without_a_stream_its_state_dict():
    from ulorl.config import TrainConfig
    from ulorl.train.backend import TorchBackend

    backend = TorchBackend(torch.nn.Linear(2, 1), TrainConfig())
    assert backend.rollout_weight_stream is None
    se = _StreamEngine()
    push_weights(se, backend, 5)   # a streaming engine, but nothing to stream: the state dict whole
    assert isinstance(se.got[0], dict) and sorted(se.got[0]) == ["bias", "weight"] and se.got[1] == 5
    assert se.got[0]["weight"].data_ptr() == backend.model.weight.data_ptr()   # the model's own tensors


def test_engine_options_reach_vllm_arguments():
    assert engine_options() == {"tensor_parallel_size": 1}
    opts = engine_options(tensor_parallel_size=2, colocate=True, weight_transfer="nccl",
                          hf_overrides={"max_position_embeddings": 135168})
    assert opts == {"tensor_parallel_size": 2, "distributed_executor_backend": "mp", "enable_sleep_mode": True,
                    "weight_transfer_config": {"backend": "nccl"},
                    "hf_overrides": {"max_position_embeddings": 135168}}
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        engine_options(tensor_parallel_size=0)


def test_native_transfer_init_info():
    nccl = native_trainer_init_info("nccl", tensor_parallel_size=4, bucket_bytes=1 << 28, master_port=1234)
    assert nccl["world_size"] == 5 and nccl["rank"] == 0 and nccl["packed"] is True
    assert nccl["packed_buffer_size_bytes"] == 1 << 28 and nccl["master_port"] == 1234
    ipc = native_trainer_init_info("ipc", tensor_parallel_size=1, bucket_bytes=1 << 20)
    assert ipc == {"rank": 0, "packed": True, "packed_buffer_size_bytes": 1 << 20}
    with pytest.raises(ValueError, match="'nccl' or 'ipc'"):
        native_trainer_init_info("gloo", tensor_parallel_size=1, bucket_bytes=1)


def test_cpu_thread_bind():
    assert default_cpu_thread_bind(2, cores=2) == "0|1"
    assert default_cpu_thread_bind(2, cores=4) == "0-1|2-3"
    assert default_cpu_thread_bind(1, cores=2) == "0-1"


def test_rope_overrides_carry_yarn_and_positions():
    from transformers import Qwen3Config

    yarn = {"rope_type": "yarn", "factor": 4.125, "original_max_position_embeddings": 32768}
    cfg = Qwen3Config(rope_scaling=yarn, max_position_embeddings=135168)
    ov = rope_overrides(cfg)
    assert ov["max_position_embeddings"] == 135168
    assert ov["rope_scaling"]["rope_type"] == "yarn" and ov["rope_scaling"]["factor"] == 4.125
    plain = rope_overrides(Qwen3Config(max_position_embeddings=40960))
    assert plain == {"max_position_embeddings": 40960}


SHM_SCRIPT = r"""
import sys, torch
from ulorl.rollout import weight_sync
bucket = [("w", torch.ones(1 << 19))]                     # 2 MiB of float32
try:
    with weight_sync.SharedBucket(bucket, directory=sys.argv[1]) as b:
        print("written")
except OSError as exc:
    print("refused:", type(exc).__name__, exc)
"""


def test_shared_bucket_on_a_full_tmpfs_raises_instead_of_dying_of_sigbus(tmp_path):
    """A 2 MiB bucket into a 1 MiB tmpfs (a container's small /dev/shm in miniature), in a private mount
    namespace: the sender gets ``SharedMemoryFull``; a sparse ftruncate + mapped write dies of SIGBUS."""
    import os
    import shutil
    import subprocess
    import sys

    assert shutil.which("unshare"), "this test mounts a tmpfs in a private mount namespace (util-linux unshare)"
    small = tmp_path / "small-shm"
    small.mkdir()
    script = tmp_path / "bucket.py"
    script.write_text(SHM_SCRIPT)
    cmd = ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {small} && exec {sys.executable} "
           f"{script} {small}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])     # -7 = SIGBUS
    assert proc.stdout.startswith("refused: SharedMemoryFull") and "No space left" in proc.stdout
