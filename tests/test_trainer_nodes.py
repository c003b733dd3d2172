"""Two nodes, PACK: the trainers must stay on the nodes they need (scale/layout.py); a split is found from
where the trainer actors landed, and recorded with the run's placement params."""

from __future__ import annotations

from pathlib import Path

from ulorl.config import load_experiment
from ulorl.scale.layout import placement_params, trainer_nodes_needed, trainer_split_problem

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "experiments/paper/qwen3_30b_a3b_128k.yaml")   # 8 trainer + 8 engine GPUs, 2 x 8-GPU nodes


def _info(nodes: list[str]) -> list[dict[str, str]]:
    return [{"node_id": n * 16, "node_ip": f"10.0.0.{ord(n[0]) % 250}"} for n in nodes]


def test_trainers_need_one_node_of_eight_gpus():
    cfg = load_experiment(PROFILE, [])
    assert trainer_nodes_needed(cfg) == 1
    assert trainer_nodes_needed(load_experiment(PROFILE, ["resources.gpus_per_node=4"])) == 2
    assert trainer_nodes_needed(load_experiment(PROFILE, ["resources.gpus_per_trainer_worker=0"])) == 1


def test_split_trainers_are_named():
    cfg = load_experiment(PROFILE, [])
    assert trainer_split_problem(cfg, _info(["a"] * 8)) is None
    why = trainer_split_problem(cfg, _info(["a"] * 5 + ["b"] * 3))
    assert why is not None and "landed on 2 nodes" in why and ": 5" in why and ": 3" in why
    engines = _info(["b"] * 8)
    split = placement_params(cfg, "addr", "PACK", [{"GPU": 1.0}] * 16, _info(["a"] * 5 + ["b"] * 3), engines, {})
    assert split["placement.trainer_nodes"] == "2" and "landed on 2 nodes" in split["placement.trainer_split"]
    packed = placement_params(cfg, "addr", "PACK", [{"GPU": 1.0}] * 16, _info(["a"] * 8), engines, {})
    assert packed["placement.trainer_nodes"] == "1" and "placement.trainer_split" not in packed
