"""Precision that trains: fp32 master weights for a bf16 model under the torch backend; DeepSpeed bf16
accumulates gradients in fp32."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ulorl.config import TrainConfig
from ulorl.train.backend import TorchBackend
from ulorl.train.deepspeed_backend import deepspeed_config


def _tiny(dtype: torch.dtype) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=41, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64)
    return Qwen3ForCausalLM(cfg).to(dtype)


IDS = torch.tensor([[3, 9, 27, 4, 11, 30, 2, 17]])


def _loss(model: torch.nn.Module) -> torch.Tensor:
    logits = model(input_ids=IDS, use_cache=False).logits[:, :-1].float()
    return -torch.log_softmax(logits, -1).gather(-1, IDS[:, 1:, None]).mean()


def _train(backend, steps: int = 10, micro: int = 1) -> None:
    for _ in range(steps):
        for _ in range(micro):  # gradient accumulation over micro-batches
            backend.backward(_loss(backend.model) / micro)
        backend.step()


def _flat(ts) -> torch.Tensor:
    return torch.cat([t.detach().float().reshape(-1) for t in ts])


def test_bf16_master_weights_move_like_fp32_training_and_plain_bf16_adamw_does_not():
    cfg = TrainConfig(lr=1e-6)
    ref = _tiny(torch.float32)
    init = _flat(ref.parameters())
    ref_backend = TorchBackend(ref, cfg)
    assert ref_backend.masters is None
    _train(ref_backend)
    d_fp32 = _flat(ref.parameters()) - init

    low = _tiny(torch.bfloat16)
    backend = TorchBackend(low, cfg)
    assert backend.masters is not None and all(m.dtype == torch.float32 for m in backend.masters)
    init_master = _flat(backend.masters)
    _train(backend)
    d_master = _flat(backend.masters) - init_master
    # Adam's steps are ~lr each: after 10 steps the masters moved ~1e-5, like fp32 training
    moved = d_fp32.abs() > 5e-6
    assert moved.float().mean() > 0.5  # (embedding rows of unused tokens get no gradient)
    rel = (d_master[moved] - d_fp32[moved]).abs() / d_fp32[moved].abs()
    assert rel.median() < 0.05
    assert (torch.sign(d_master[moved]) == torch.sign(d_fp32[moved])).float().mean() > 0.95

    plain = _tiny(torch.bfloat16)
    p_init = _flat(plain.parameters())
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-6, weight_decay=0.0)
    for _ in range(10):
        opt.zero_grad()
        _loss(plain).backward()
        opt.step()
    d_plain = _flat(plain.parameters()) - p_init
    # bf16 rounds a 1e-6 step back to the old value: most of the update is lost
    assert d_plain.abs().sum() < 0.2 * d_fp32.abs().sum()
    assert (d_plain == 0).float().mean() > 0.8


def test_deepspeed_bf16_accumulates_gradients_in_fp32():
    assert deepspeed_config(TrainConfig(bf16=True))["data_types"]["grad_accum_dtype"] == "fp32"
    assert "data_types" not in deepspeed_config(TrainConfig(bf16=False))


def test_sequence_parallel_above_one_is_refused_with_the_key():
    import pytest

    from ulorl.train.sequence_parallel import SequenceParallelUnavailable, check_sequence_parallel

    check_sequence_parallel(TrainConfig())
    with pytest.raises(SequenceParallelUnavailable, match="train.sequence_parallel=2"):
        check_sequence_parallel(TrainConfig(sequence_parallel=2))
