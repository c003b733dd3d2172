"""Ray placement: 2 DeepSpeed trainer workers + 1 rollout engine in one placement group (real Ray,
real MLflow sqlite, fractional CPUs on one machine), and the pure layout / feasibility helpers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ulorl.config import config_from_dict, load_experiment
from ulorl.scale.layout import (
    PlacementError,
    check_fits,
    placement_bundles,
    placement_params,
    placement_strategy,
    validate_layout,
)

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"
SMALL = [
    "train.backend=deepspeed",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_response_len=32",
    "rollout.segments=2",
    "eval.every=0",
    "algo.dynamic_sampling=false",
    "train.max_steps=2",
    "train.checkpoint_every=1",
    "resources.trainer_workers=2",
    "resources.rollout_engines=1",
    "resources.cpus_per_trainer_worker=0.5",
    "resources.cpus_per_engine=0.5",
]


def _cfg(**res: object):
    return config_from_dict({"train": {"backend": "deepspeed"}, "resources": res})


def test_bundles_and_strategy_follow_the_resources_section():
    cfg = _cfg(trainer_workers=2, rollout_engines=1, cpus_per_trainer_worker=0.5, cpus_per_engine=0.25,
               gpus_per_engine=1)
    assert placement_bundles(cfg) == [{"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 0.25, "GPU": 1.0}]
    assert placement_strategy(cfg) == "STRICT_PACK"
    assert placement_strategy(_cfg(nodes=2)) == "PACK"


def test_check_fits_names_the_missing_resource():
    bundles = [{"CPU": 0.5}, {"CPU": 0.5, "GPU": 1.0}]
    assert check_fits(bundles, "PACK", {"CPU": 2.0, "GPU": 1.0}, [{"CPU": 2.0, "GPU": 1.0}]) is None
    why = check_fits(bundles, "PACK", {"CPU": 2.0}, [{"CPU": 2.0}])
    assert why and "1 GPU" in why and "has 0" in why
    # 2 nodes of 1 CPU: enough in total, but STRICT_PACK needs one node with 1.5
    why = check_fits([{"CPU": 1.0}, {"CPU": 0.5}], "STRICT_PACK", {"CPU": 2.0}, [{"CPU": 1.0}, {"CPU": 1.0}])
    assert why and "largest node has 1" in why


def test_several_trainer_workers_need_deepspeed():
    cfg = config_from_dict({"resources": {"trainer_workers": 2}})
    with pytest.raises(PlacementError, match="train.backend=deepspeed"):
        validate_layout(cfg)


def test_placement_params_list_bundles_and_node_ips():
    cfg = _cfg(trainer_workers=2, rollout_engines=1, cpus_per_trainer_worker=0.5, cpus_per_engine=0.5)
    info = [{"node_ip": "127.0.0.1", "node_id": "a"}, {"node_ip": "127.0.0.1", "node_id": "a"}]
    p = placement_params(cfg, "local", "STRICT_PACK", placement_bundles(cfg), info,
                         [{"node_ip": "10.0.0.2", "node_id": "b"}], {"CPU": 2.0})
    assert p["placement.trainer.1.node_ip"] == "127.0.0.1"
    assert p["placement.engine.0.node_ip"] == "10.0.0.2"
    assert p["placement.nodes_used"] == "2"
    assert json.loads(p["placement.bundles"]) == [{"CPU": 0.5}] * 3
    assert p["placement.cluster_gpus"] == "0"


@pytest.fixture(scope="module")
def model_arg() -> str:
    return "model.name_or_path=embedded"  # the shipped warm-started model, real rewards


def test_placement_run_two_trainer_workers_one_engine(tmp_path, model_arg):
    """The acceptance run: it completes on one machine and its placement is in the run's params."""
    from mlflow.tracking import MlflowClient

    from ulorl.scale.placement import run_placement

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_experiment(QUICK, SMALL + [model_arg, f"tracking.uri={uri}"])
    seen: list[int] = []
    t0 = time.perf_counter()
    res = run_placement(cfg, run_dir=tmp_path / "run", step_callback=lambda step, m, ck: seen.append(step))
    print(f"placement run: {time.perf_counter() - t0:.1f}s")
    assert res.steps == 2 and not res.interrupted
    assert seen == [1, 2], "step metrics must reach the caller's callback (Tune reports them)"
    client = MlflowClient(uri)
    run = client.get_run(res.run_id)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["placement.trainer_workers"] == "2"
    assert params["placement.rollout_engines"] == "1"
    assert params["placement.strategy"] == "STRICT_PACK"
    assert json.loads(params["placement.bundles"]) == [{"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 0.5}]
    assert json.loads(params["placement.trainer.1.resources"]) == {"CPU": 0.5}
    assert json.loads(params["placement.engine.0.resources"]) == {"CPU": 0.5}
    assert params["placement.trainer.0.node_ip"] == "127.0.0.1"  # a local Ray stays on loopback
    assert params["placement.nodes_used"] == "1"
    assert float(params["placement.cluster_cpus"]) >= 1.5
    assert params["train.backend"] == "deepspeed" and params["train.threads"] == "1"
    assert sorted(m.step for m in client.get_metric_history(res.run_id, "time/step_s")) == [1, 2]
    # only worker 0 tracks: one run in the store
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    # the trainer checkpoint holds both ranks' ZeRO shards beside model/ and the pools
    from ulorl.train.checkpoint import latest_checkpoint, read_trainer_state

    ckpt = latest_checkpoint(tmp_path / "run")
    assert read_trainer_state(ckpt)["step"] == 2
    shards = sorted(p.name for p in (ckpt / "deepspeed" / "state").glob("*optim_states.pt"))
    assert shards == ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert (ckpt / "model" / "model.safetensors").is_file()


@pytest.mark.slow
def test_cli_ray_refuses_a_gpu_placement_on_a_cpu_machine(tmp_path, model_arg):
    cmd = [sys.executable, "-m", "ulorl.cli.train", str(QUICK), *SMALL, model_arg,
           "resources.gpus_per_trainer_worker=1", f"tracking.uri=sqlite:///{tmp_path}/m.db", "--ray"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-3000:]
    assert "2 GPU needed" in out.stderr and "the largest node" in out.stderr


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 CPUs, 127.0.0.1) for the slow in-process tests below, started once."""
    import ray

    from ulorl.scale.local_ray import init_ray

    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_run_placement_inside_a_tune_trial(tmp_path, model_arg, local_ray):
    """A Tune trial with ``tune_resources(cfg)`` runs the placement in its own placement group and
    reports each step's metrics through ``step_callback``."""
    from mlflow.tracking import MlflowClient
    from ray import tune

    from ulorl.scale.placement import tune_resources

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_experiment(QUICK, SMALL + [model_arg, f"tracking.uri={uri}"])

    def trial(config: dict) -> None:
        from ray import tune as rt

        from ulorl.config import config_from_dict
        from ulorl.scale.placement import run_placement

        res = run_placement(config_from_dict(config["cfg"]), run_dir=config["run_dir"],
                            step_callback=lambda step, m, ck: rt.report({"step": step}))
        rt.report({"step": res.steps, "run_id": res.run_id})

    tuner = tune.Tuner(
        tune.with_resources(trial, tune_resources(cfg)),
        param_space={"cfg": cfg.model_dump(mode="json"), "run_dir": str(tmp_path / "run")},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), name="placement"),
    )
    results = tuner.fit()
    r = results[0]
    assert r.error is None, r.error
    assert r.metrics["step"] == 2
    params = MlflowClient(uri).get_run(r.metrics["run_id"]).data.params
    assert params["placement.trainer_workers"] == "2" and params["placement.address"] == "existing"


# ----------------------------------------------------------------------------- multi-node layout (pure)


def test_node_layout_packs_roles_per_node_and_spreads_over_nodes():
    from ulorl.scale.layout import node_layout

    cfg = _cfg(trainer_workers=8, rollout_engines=8, gpus_per_trainer_worker=1, gpus_per_engine=1, nodes=2,
               gpus_per_node=8, cpus_per_node=32)
    lay = node_layout(cfg)
    assert lay["strategy"] == "PACK"
    assert lay["layout"][0]["roles"] == [f"trainer.{i}" for i in range(8)]
    assert lay["layout"][1]["roles"] == [f"engine.{j}" for j in range(8)]
    assert lay["layout"][1]["used"] == {"CPU": 8.0, "GPU": 8.0}
    # the same roles on one 8-GPU node cannot be placed: the message names the bundle that does not fit
    with pytest.raises(PlacementError, match=r"bundle engine\.0 .* resources.nodes=1"):
        node_layout(cfg.model_copy(update={"resources": cfg.resources.model_copy(update={"nodes": 1})}))


def test_check_nodes_hold_names_the_bundle_and_the_largest_node():
    from ulorl.scale.layout import check_nodes_hold

    nodes = [{"node_id": "aaaa" * 8, "ip": "10.0.0.1", "resources": {"CPU": 4.0, "GPU": 8.0}},
             {"node_id": "bbbb" * 8, "ip": "10.0.0.2", "resources": {"CPU": 4.0, "GPU": 2.0}}]
    ok = [{"CPU": 1.0, "GPU": 8.0}, {"CPU": 1.0, "GPU": 2.0}]
    assert check_nodes_hold(ok, ["trainer.0", "engine.0"], "PACK", nodes) is None
    why = check_nodes_hold([{"CPU": 1.0, "GPU": 16.0}], ["trainer.0"], "PACK", nodes)
    assert "bundle trainer.0" in why and "largest node (10.0.0.1" in why and "8 GPU" in why
    why = check_nodes_hold(ok, ["trainer.0", "engine.0"], "STRICT_PACK", nodes)
    assert "packs all bundles on one node" in why and "10 GPU needed" in why
    why = check_nodes_hold([{"CPU": 3.0}] * 3, ["trainer.0", "trainer.1", "engine.0"], "PACK", nodes)
    assert "9 CPU in total" in why


def test_paper_profiles_fit_8_gpu_nodes():
    from ulorl.config import load_experiment
    from ulorl.scale.layout import node_layout

    for name in ("qwen3_4b_128k", "qwen3_8b_128k", "qwen3_30b_a3b_128k", "qwen3_30b_a3b_140k_yarn_eval"):
        cfg = load_experiment(str(Path(__file__).resolve().parents[1] / "experiments" / "paper" / f"{name}.yaml"), [])
        lay = node_layout(cfg)
        assert cfg.resources.gpus_per_node == 8, name
        assert all(n["used"]["GPU"] <= 8 for n in lay["layout"]), name


@pytest.mark.slow
def test_remote_engine_streams_weights_in_buckets_and_matches_a_local_engine(local_ray):
    """Weights reach an engine actor one bucket at a time (never the whole dict in Ray's store) and
    the actor's engine then decodes exactly as a local HF engine holding the same new weights."""
    import torch

    from ulorl.rollout.engines import make_engine
    from ulorl.rollout.types import GenerationRequest, SamplingParams
    from ulorl.scale.placement import EngineActor, RemoteEngine
    from ulorl.train.worker import load_model

    ray = local_ray
    cfg = load_experiment(QUICK, ["model.name_or_path=embedded"])
    actor = ray.remote(EngineActor).options(num_cpus=1).remote(cfg.model_dump(mode="json"), 1)
    try:
        model, tok = load_model(cfg, "cpu")
        remote = RemoteEngine([actor], tok.eos_token_id, bucket_mb=0.05)
        g = torch.Generator().manual_seed(3)
        new = {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
        remote.update_weights(new, 1)
        total = sum(v.numel() * v.element_size() for v in new.values())
        assert remote.last_update_bytes == total and remote.last_update_messages > 5
        model.load_state_dict(new)
        local = make_engine(cfg.rollout, model, tok)
        reqs = [GenerationRequest(i, tok(f"Add: {10 + i}+{20 + i}\n")["input_ids"], [], 24, seed=i) for i in range(3)]
        greedy = SamplingParams(temperature=0.85, greedy=True)
        got = [r.token_ids for r in remote.generate(reqs, greedy)]
        assert got == [r.token_ids for r in local.generate(reqs, greedy)]
        assert remote.policy_version == 1
    finally:
        ray.kill(actor)
