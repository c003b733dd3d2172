"""A real training run of the tiny Qwen3-MoE profile (experiments/quickstart_moe.yaml): the HF engine records
every response token's experts, the trainer replays them (R3) and MLflow holds the routing mismatch at every
update step. ``ULORL_MOE_MODEL`` may point the run at another MoE folder (the test's default is the shipped one)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ulorl.config import load_experiment
from ulorl.tracking import schema
from ulorl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
MODEL = os.environ.get("ULORL_MOE_MODEL", str(ROOT / "platform" / "ulorl" / "assets" / "embedded_moe"))


@pytest.mark.slow
@pytest.mark.parametrize("replay", ["r3", "off"])
def test_moe_run_logs_routing_mismatch_every_update(tmp_path, replay):
    if not (Path(MODEL) / "config.json").is_file():
        pytest.fail(f"the tiny MoE model is missing at {MODEL}: build it with `ulorl-data warmstart --moe-experts 4 "
                    "--out platform/ulorl/assets/embedded_moe`")
    cfg = load_experiment(ROOT / "experiments" / "quickstart_moe.yaml", [
        f"model.name_or_path={MODEL}", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_response_len=32", "rollout.segments=1", "algo.dynamic_sampling=false",
        f"algo.routing_replay={replay}", "train.threads=1", "eval.every=0", "train.max_steps=2",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"])
    res = Trainer(cfg, run_dir=tmp_path / "run", progress=False).run()
    client = MlflowClient(res.tracking_uri)
    assert client.get_run(res.run_id).data.params["algo.routing_replay"] == replay

    def hist(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(res.run_id, key)}

    updated = [s for s, v in hist(schema.SKIPPED_METRIC).items() if v == 0.0]
    assert len(updated) == 2, "both steps should update (dynamic sampling off)"
    for key in ("tokens", "token_frac", "token_layer_frac", "differ_tokens"):
        h = hist("mismatch/routing/" + key)
        assert set(updated) <= set(h), key
        assert all(math.isfinite(h[s]) for s in updated)
    for s in updated:
        assert hist("mismatch/routing/tokens")[s] > 0
        assert 0.0 <= hist("mismatch/routing/token_layer_frac")[s] <= hist("mismatch/routing/token_frac")[s] <= 1.0
