"""A 3-step training run with ``rollout.engine=vllm`` (issue 8 acceptance): completes, logs to
MLflow, and pushes the trainer's weights into vLLM after every optimizer step.

The policy is a random tiny Qwen3 with the embedded tokenizer (rewards are 0; dynamic sampling
is off so the zero-advantage groups still make optimizer steps and weight updates). Two
segments per response, so continuations are re-prefilled under updated weights.
"""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from ulorl.config import load_experiment
from ulorl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def test_three_step_run_with_vllm_engine(tmp_path):
    from ulorl.models.tiny import build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer
    from ulorl.rollout.engines.vllm import VLLMEngine

    model_dir = tmp_path / "policy"
    tok = build_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cfg = load_experiment(ROOT / "experiments" / "quickstart.yaml", [
        f"model.name_or_path={model_dir}", "rollout.engine=vllm", "rollout.prompts_per_step=2",
        "rollout.group_size=4", "rollout.max_response_len=96", "rollout.segments=2", "train.threads=1",
        "eval.every=0", "algo.dynamic_sampling=false", "train.max_steps=3", "train.lr=1e-4",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
    ])
    trainer = Trainer(cfg, run_dir=tmp_path / "run", progress=False)
    try:
        res = trainer.run()
        engine = trainer.engine
        assert isinstance(engine, VLLMEngine)
        client = MlflowClient(res.tracking_uri)
        run = client.get_run(res.run_id)
        assert run.info.status == "FINISHED"
        assert run.data.params["rollout.engine"] == "vllm"
        versions = {m.step: m.value for m in client.get_metric_history(res.run_id, "train/policy_version")}
        assert sorted(versions) == [1, 2, 3]
        assert versions[3] >= 1 and engine.policy_version == int(versions[3])
        tokens = {m.step: m.value for m in client.get_metric_history(res.run_id, "rollout/tokens")}
        assert all(v > 0 for v in tokens.values())
        print(f"vLLM start-up {engine.startup_s:.1f} s, last weight update {engine.last_update_s * 1000:.0f} ms, "
              f"policy versions {versions}")
    finally:
        engine = getattr(trainer, "engine", None)
        if engine is not None and hasattr(engine, "close"):
            engine.close()
