"""Stop tokens: the engines stop on every end id of the model's generation config, not just the tokenizer's.

A random tiny Qwen3 whose generation config lists two end ids [E1, E2] (like Qwen3's
``<|im_end|>`` and ``<|endoftext|>``); the tokenizer names only E1. E2 is chosen as the third
greedy token of a prompt, so a greedy rollout must end there with ``finish_reason == "eos"``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers

from ulorl.config import RolloutConfig
from ulorl.rollout.engines import make_engine, stop_token_ids
from ulorl.rollout.engines.vllm import VLLMEngine
from ulorl.rollout.types import GenerationRequest, SamplingParams

PROMPT = [5, 9, 17, 33]


@pytest.fixture(scope="module")
def two_eos_model():
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=16, intermediate_size=64,
                                   max_position_embeddings=256)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        ids = list(PROMPT)
        for _ in range(12):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    greedy = ids[len(PROMPT):]
    e2 = greedy[2]
    first = greedy.index(e2)                       # E2 may already occur earlier: stop there
    e1 = next(t for t in range(2, 128) if t not in greedy)
    model.config.eos_token_id = e1
    model.generation_config.eos_token_id = [e1, e2]
    return model, e1, e2, greedy[: first + 1]


def test_stop_token_ids_merge_tokenizer_and_generation_config(two_eos_model):
    model, e1, e2, _ = two_eos_model
    assert stop_token_ids(model, SimpleNamespace(eos_token_id=e1)) == [e1, e2]
    assert stop_token_ids(model, None) == [e1, e2]
    with pytest.raises(ValueError, match="end-of-sequence"):
        stop_token_ids(SimpleNamespace(), SimpleNamespace(eos_token_id=None))


def test_hf_engine_stops_on_the_second_generation_config_end_id(two_eos_model):
    model, e1, e2, expected = two_eos_model
    tokenizer = SimpleNamespace(eos_token_id=e1, pad_token_id=0)
    engine = make_engine(RolloutConfig(engine="hf"), model, tokenizer)
    [res] = engine.generate([GenerationRequest(0, PROMPT, [], 12)], SamplingParams(greedy=True))
    assert res.token_ids == expected and res.token_ids[-1] == e2
    assert res.finish_reason == "eos"


def test_vllm_engine_from_config_gets_every_end_id(two_eos_model):
    """The vLLM engine's constructor needs vLLM; what ``from_config`` hands it is checked without it."""
    model, e1, e2, _ = two_eos_model

    class Captured(VLLMEngine):
        def __init__(self, model_path_or_model, **kwargs):  # record, start nothing
            self.kwargs = kwargs

    eng = Captured.from_config(RolloutConfig(engine="vllm"), model, SimpleNamespace(eos_token_id=e1))
    assert eng.kwargs["eos_token_id"] == [e1, e2]
