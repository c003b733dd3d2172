"""vLLM at scale on CPU: tensor parallelism (TP=2 over gloo, threads bound by hand) and a YaRN
model whose engine context exceeds 40,960 tokens. Each test starts its own engines one after the
other (slow); run them apart from the session engine: ``.venv-vllm/bin/pytest tests/vllm/test_vllm_scale.py``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ulorl.rollout.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.85, greedy=True)


def _tiny(tmp_path, **cfg) -> tuple[str, Qwen3ForCausalLM]:
    torch.manual_seed(4321)
    base = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, intermediate_size=256, max_position_embeddings=1024, tie_word_embeddings=False,
                initializer_range=0.1, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    base.update(cfg)
    model = Qwen3ForCausalLM(Qwen3Config(**base)).eval()
    d = tmp_path / "model"
    model.save_pretrained(d)
    return str(d), model


@pytest.mark.slow
def test_tensor_parallel_2_equals_tp_1(tmp_path):
    from ulorl.rollout.engines.vllm import VLLMEngine

    d, _ = _tiny(tmp_path)
    g = torch.Generator().manual_seed(3)
    reqs = [GenerationRequest(i, torch.randint(3, 512, (5 + 7 * i,), generator=g).tolist(), [], 24, seed=i) for i in range(4)]
    outs = {}
    for tp in (1, 2):
        with VLLMEngine(d, eos_token_id=1, dtype="float32", max_model_len=256, tensor_parallel_size=tp) as eng:
            assert eng.llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size == tp
            outs[tp] = eng.generate(reqs, GREEDY)
            if tp == 2:   # the bucketed weight sync reaches both TP ranks
                new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in Qwen3ForCausalLM.from_pretrained(d).state_dict().items()}
                eng.bucket_bytes = 64 << 10
                eng.update_weights(new, 1)
                assert eng.last_update_messages > 3
                changed = eng.generate(reqs, GREEDY)
                assert [r.token_ids for r in changed] != [r.token_ids for r in outs[2]]
    assert [r.token_ids for r in outs[2]] == [r.token_ids for r in outs[1]]
    diff = max(abs(a - b) for x, y in zip(outs[1], outs[2]) for a, b in zip(x.logprobs, y.logprobs))
    print(f"TP=2 vs TP=1: {sum(len(r.token_ids) for r in outs[1])} greedy tokens equal, max |lp diff| {diff:.2e}")
    assert diff < 1e-3


@pytest.mark.slow
def test_yarn_context_beyond_40960_on_vllm_and_hf(tmp_path):
    """A tiny model with YaRN (factor 4.125 over 10,240 original positions = 42,240) continues a
    41,000-token context on both engines with the same greedy tokens."""
    from ulorl.models.loading import load_policy
    from ulorl.rollout.engines.hf import HFEngine
    from ulorl.rollout.engines.vllm import VLLMEngine, rope_overrides

    d, _ = _tiny(tmp_path, max_position_embeddings=10240)
    yarn = {"rope_type": "yarn", "factor": 4.125, "original_max_position_embeddings": 10240}
    model, _ = load_policy(d, rope_scaling=yarn)
    assert model.config.max_position_embeddings == 42240
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, 512, (41000,), generator=g).tolist()
    req = [GenerationRequest(0, prompt[:40990], prompt[40990:], 16, seed=0)]    # context 41,000 > 40,960
    hf = HFEngine(model, eos_token_id=1, pad_token_id=2).generate(req, GREEDY)[0]
    with VLLMEngine(d, eos_token_id=1, dtype="float32", max_model_len=41100,
                    hf_overrides=rope_overrides(model.config)) as eng:
        hfcfg = eng.llm.llm_engine.vllm_config.model_config.hf_config
        assert hfcfg.max_position_embeddings == 42240
        vl = eng.generate(req, GREEDY)[0]
    print(f"41,000-token context: hf {hf.token_ids[:8]}, vllm {vl.token_ids[:8]}")
    assert len(vl.token_ids) == 16 and vl.token_ids == hf.token_ids
