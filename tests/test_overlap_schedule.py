"""rollout.schedule=overlap in the trainer, on a deterministic scripted engine (tests/fakes.py) and the
real tiny model's updates: at overlap_staleness 0 it is the synchronous run bit for bit; at 1 every
segment trains exactly one version after the one that decoded it, no sample is trained twice or lost,
and the in-flight groups survive a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fakes import ScriptedEngine
from mlflow.tracking import MlflowClient

from ulorl.config import load_experiment
from ulorl.rollout.types import Sample
from ulorl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
NOT_COMPARED = ("time/", "sys/", "overlap/", "rollout/tokens_per_s", "rollout/finished_per_s")


class _Scripted(Trainer):
    """A scripted reward (even response length -> 1) so groups have mixed rewards and train."""

    def _score(self, finished: list[Sample]) -> list[float]:
        return [float(s.response_len % 2 == 0) for s in finished]


def _engine(rollout_cfg, model, tokenizer):  # noqa: ANN001, ANN202
    return ScriptedEngine(vocab_size=300, eos_token_id=tokenizer.eos_token_id, max_len=24)


def _cfg(tmp_path: Path, name: str, *over: str):
    return load_experiment(ROOT / "experiments" / "quickstart.yaml", [
        "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_response_len=32", "rollout.segments=1",
        "data.task.num_train=60", "train.threads=1", "train.max_steps=4", "train.checkpoint_every=100",
        "eval.every=0", "tracking.sample_every=100", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        f"train.output_dir={tmp_path}/{name}", f"name={name}", *over])


def _run(tmp_path: Path, name: str, *over: str) -> tuple[_Scripted, list[dict[str, float]]]:
    t = _Scripted(_cfg(tmp_path, name, *over), progress=False, engine_factory=_engine)
    t.setup()
    metrics = []
    for _ in range(t.cfg.train.max_steps):
        out = t.train_step()
        metrics.append({k: v for k, v in out.metrics.items() if not k.startswith(NOT_COMPARED)})
    t.close()
    return t, metrics


def test_overlap_at_staleness_zero_is_the_synchronous_run_bit_for_bit(tmp_path):
    sync, m_sync = _run(tmp_path, "sync")
    over, m_over = _run(tmp_path, "over0", "rollout.schedule=overlap", "rollout.overlap_staleness=0")
    assert any(m.get("train/samples", 0) > 0 for m in m_sync)        # the run trained
    assert m_sync == m_over                                            # every logged number, every step
    for (k, a), (_, b) in zip(sync.model.state_dict().items(), over.model.state_dict().items()):
        assert torch.equal(a, b), k
    assert over.engine_model is not over.model                         # the engine decoded on its own copy


def test_overlap_trains_each_segment_one_version_late_and_loses_nothing(tmp_path):
    t = _Scripted(_cfg(tmp_path, "over1", "rollout.schedule=overlap", "train.max_steps=5",
                       "train.checkpoint_every=5"), progress=False, engine_factory=_engine)
    released: list[int] = []
    trained: list[int] = []
    t.setup()
    held_version, updated_before = 0, 0.0
    lags = []
    for _ in range(5):
        before = t.policy_version
        held_ids = [s.sample_id for g in t.held_groups for s in g]
        out = t.train_step()
        released += [s.sample_id for g in out.rollout.groups for s in g]
        trained += held_ids
        assert out.rollout.policy_version == before                    # the round decoded at the pushed version
        for g in t.held_groups:                                        # held: decoded at `before`, trained next
            assert all(sp.version == before for s in g for sp in s.segments)
        if held_ids:   # decoded at the version before this step's; one version late iff that step updated
            lag = float(before - held_version)
            assert lag == updated_before and lag in (0.0, 1.0)
            lags.append(lag)
            assert out.metrics["staleness/token_lag_max"] == lag and out.metrics["staleness/stale_token_frac"] == lag
        held_version, updated_before = before, float(out.update is not None and out.update.updated)
        assert out.metrics["overlap/held_groups"] == len(t.held_groups)
    t.save_checkpoint()
    t.close()
    assert 1.0 in lags                                                 # some update trained stale segments
    assert trained and len(trained) == len(set(trained))               # none trained twice
    assert sorted(trained + [s.sample_id for g in t.held_groups for s in g]) == sorted(released)   # none lost
    assert t.held_groups                                                # in flight at the checkpoint ...
    resumed = _Scripted(_cfg(tmp_path, "over1", "rollout.schedule=overlap", "train.max_steps=6",
                             "train.checkpoint_every=5"), progress=False, engine_factory=_engine,
                        resume=str(t.run_dir), allow_config_change=True)
    resumed.setup()
    assert [[s.sample_id for s in g] for g in resumed.held_groups] == \
        [[s.sample_id for s in g] for g in t.held_groups]               # ... and back after the resume
    resumed.close()
    client = MlflowClient(t.tracking_uri)
    assert {m.step for m in client.get_metric_history(t.run_id, "overlap/both_s")} == set(range(1, 6))


def test_overlap_refuses_tois_at_staleness_one(tmp_path):
    with pytest.raises(Exception, match="algo.is_mode=tois.*rollout.schedule=overlap"):
        _cfg(tmp_path, "x", "rollout.schedule=overlap", "algo.is_mode=tois")


def test_sais_old_logprobs_are_the_decoding_version_under_overlap(tmp_path):
    # SAIS at staleness 1: the stored old log-probs of a held segment are pi_{v_k} (the engine's copy at the
    # version that decoded it), not the trainer's weights, which moved on during the same step
    import copy

    from ulorl.train.update import segment_logprobs

    t = _Scripted(_cfg(tmp_path, "sais", "rollout.schedule=overlap", "algo.is_mode=sais", "train.max_steps=4"),
                  progress=False, engine_factory=_engine)
    t.setup()
    checked = 0
    for _ in range(4):
        decoding = copy.deepcopy(t.model)                 # the weights the engine holds for this round
        out = t.train_step()
        if not (out.update is not None and out.update.updated and t.held_groups):
            continue
        held = [s for g in t.held_groups for s in g]
        stored = [list(s.old_logprobs) for s in held]
        for model, want_equal in ((decoding, True), (t.model, False)):
            fresh = [copy.deepcopy(s) for s in held]
            for s in fresh:
                s.old_logprobs = []
            segment_logprobs(model, fresh, t.cfg.rollout.temperature, t.pad_id, t.cfg.train.micro_batch_tokens,
                             t.device, t.cfg.train.bf16)
            same = all(torch.allclose(torch.tensor(a), torch.tensor(f.old_logprobs), atol=1e-6)
                       for a, f in zip(stored, fresh))
            assert same is want_equal
        checked += 1
    t.close()
    assert checked
