"""Pruning in sweeps (``ulorl.sweep.prune``): the entropy-collapse rule on hand-made entropy curves,
the scheduler's decisions on scripted results, the ranking of pruned trials, and a real sweep (Ray
Tune, trainer trials, SQLite MLflow) whose search trial collapses and whose baseline is never pruned,
resumed afterwards."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from mlflow_store import StoreBase, migrated_empty_db

from ulorl.sweep import plan, prune, ranking, tuners
from ulorl.sweep.launch import SweepRunner
from ulorl.sweep.spec import SweepError, load_sweep

ROOT = Path(__file__).resolve().parents[1]
QUICK = (ROOT / "experiments" / "quickstart.yaml").as_posix()


@dataclass(frozen=True)
class _Trial:
    """What Tune's schedulers read of a trial: its id (and that it is hashable)."""

    trial_id: str


class _Controller:
    """What the median rule asks Tune's controller: the live trials (it would pause one while others wait)."""

    def get_live_trials(self) -> list:
        return []


# --------------------------------------------------------------------------- the rule, pure
def test_entropy_collapse_needs_consecutive_steps_below() -> None:
    # below 0.05 at steps 2, 3 (reset by 4), then 5, 6, 7: the third in a row is step 7
    hist = [(1, 0.09), (2, 0.04), (3, 0.03), (4, 0.06), (5, 0.01), (6, 0.02), (7, 0.04), (8, 0.01)]
    assert prune.entropy_collapse_step(hist, below=0.05, steps=3) == 7
    assert prune.entropy_collapse_step(hist, below=0.05, steps=2) == 3
    assert prune.entropy_collapse_step(hist, below=0.05, steps=4) == 8
    assert prune.entropy_collapse_step(hist, below=0.05, steps=5) is None
    # equal to the threshold is not below it; a step without entropy neither counts nor resets
    assert prune.entropy_collapse_step([(1, 0.05), (2, 0.01)], below=0.05, steps=2) is None
    assert prune.entropy_collapse_step([(1, 0.01), (2, None), (3, float("nan")), (4, 0.02)], 0.05, 2) == 4


def _result(step: int, entropy: float, obj: float = float("nan"), fresh: bool = False) -> dict:
    return {"step": step, "train/entropy": entropy, "eval/heldout/avg_at_k": obj, prune.FRESH_KEY: float(fresh)}


def test_scheduler_stops_at_the_collapse_step_and_records_it(tmp_path) -> None:
    sch = prune.PruningScheduler(str(tmp_path), max_steps=10, entropy_below=0.05, entropy_steps=2)
    sch.set_search_properties("eval/heldout/avg_at_k", "max")
    trial = _Trial("t1")
    decisions = [sch.on_trial_result(None, trial, _result(s, e)) for s, e in [(1, 0.04), (2, 0.09), (3, 0.04),
                                                                                (4, 0.01)]]
    assert decisions == ["CONTINUE", "CONTINUE", "CONTINUE", "STOP"]
    assert prune.read_pruned(tmp_path) == {"t1": {"reason": "entropy_collapse", "step": 4}}
    # a restarted pruned trial (--resume) is stopped again at its first result
    assert sch.on_trial_result(None, trial, _result(5, 0.5)) == "STOP"


def test_no_pruning_at_the_last_step(tmp_path) -> None:
    sch = prune.PruningScheduler(str(tmp_path), max_steps=2, entropy_below=0.05, entropy_steps=2)
    trial = _Trial("t1")
    assert [sch.on_trial_result(None, trial, _result(s, 0.01)) for s in (1, 2)] == ["CONTINUE", "CONTINUE"]
    assert prune.read_pruned(tmp_path) == {}


def test_median_rule_sees_evaluated_objectives_only(tmp_path) -> None:
    """Median stopping (grace period 2 steps, 2 other trials needed). Two trials completed with
    evaluated objectives (0.5, 0.6) and (0.7, 0.8) at steps 2 and 4. At step 4 their running means over
    steps 2..4 are 0.55 and 0.75, median 0.65: a trial at 0.7 goes on. At step 2 they are 0.5 and 0.7,
    median 0.6: a trial at 0.3 is stopped. A result between evals (carried value, not fresh) never
    reaches the rule, however low."""
    inner = prune.objective_scheduler("median", max_steps=10, grace_period=2, reduction_factor=2, brackets=1,
                                      min_samples=2)
    sch = prune.PruningScheduler(str(tmp_path), max_steps=10, inner=inner, inner_reason="median")
    sch.set_search_properties("eval/heldout/avg_at_k", "max")
    ctl = _Controller()
    trials = [_Trial(f"t{i}") for i in range(4)]
    for t in trials:
        sch.on_trial_add(ctl, t)
    for t, vals in zip(trials[:2], [(0.5, 0.6), (0.7, 0.8)]):
        for step, v in zip((2, 4), vals):
            assert sch.on_trial_result(ctl, t, _result(step, 1.0, v, fresh=True)) == "CONTINUE"
        sch.on_trial_complete(ctl, t, _result(4, 1.0, vals[1], fresh=True))
    high, low = trials[2], trials[3]
    assert sch.on_trial_result(ctl, high, _result(2, 1.0, 0.3, fresh=False)) == "CONTINUE"
    assert sch.on_trial_result(ctl, high, _result(4, 1.0, 0.7, fresh=True)) == "CONTINUE"
    assert prune.read_pruned(tmp_path) == {}
    assert sch.on_trial_result(ctl, low, _result(2, 1.0, 0.3, fresh=True)) == "STOP"
    assert prune.read_pruned(tmp_path) == {"t3": {"reason": "median", "step": 2}}


def test_ranking_puts_pruned_search_trials_last_and_never_picks_one() -> None:
    def t(tid: str, obj: float, status: str = "FINISHED", role: str = "search") -> ranking.Trial:
        return ranking.Trial(run_id=tid, run_name=tid, trial_id=tid, role=role, seed_offset=0, status=status,
                             objective=obj, steps=4.0)
    trials = [t("a", 0.2), t("b", 0.9, ranking.PRUNED), t("c", 0.5), t("base", 0.4, role="baseline")]
    trials[1].pruned_reason, trials[1].pruned_step = "asha", 2
    rows = ranking.ranking_rows(trials, "max")
    assert [(r["run_id"], r["rank"], r["status"]) for r in rows] == [
        ("c", 1, "FINISHED"), ("a", 2, "FINISHED"), ("b", 3, "PRUNED"), ("base", None, "FINISHED")]
    assert (rows[2]["pruned_reason"], rows[2]["pruned_step"]) == ("asha", 2)


# --------------------------------------------------------------------------- spec
def _spec_text(scheduler: str, extra: str = "", eval_every: int = 2) -> str:
    return f"""name: tiny
base: {QUICK}
overrides:
  rollout.prompts_per_step: 2
  rollout.group_size: 4
  rollout.max_response_len: 64
  rollout.segments: 1             # every sample finishes in its step and
  algo.dynamic_sampling: false    # every step updates: train/entropy at every step
  train.checkpoint_every: 1
  eval.every: {eval_every}
  eval.num_problems: 4
  eval.k: 1
space:
  algo.mpt.tau: {{grid: [0.9]}}
search: {{algorithm: grid}}
metric: eval/heldout/avg_at_k
mode: max
num_samples: 1
max_concurrent: 1
resources: {{cpu: 2}}
stop: {{steps: 3}}
scheduler: {scheduler}
{extra}"""


def test_spec_errors_name_the_scheduler_key(tmp_path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(_spec_text("{type: asha, patience: 3}"))
    with pytest.raises(SweepError, match="patience"):
        load_sweep(p)
    p.write_text(_spec_text("{type: none}"))
    with pytest.raises(SweepError, match="entropy_below"):
        load_sweep(p)
    p.write_text(_spec_text("{type: median, grace_period: 1}", eval_every=2))
    with pytest.raises(SweepError, match=r"scheduler\.grace_period \(1\) must be at least eval\.every \(2\)"):
        SweepRunner(p, tracking_uri=f"sqlite:///{tmp_path}/m.db", output_dir=tmp_path / "out")


def test_shipped_pruned_sweep_loads() -> None:
    spec, _, _ = load_sweep(ROOT / "sweeps" / "mpt_threshold_pruned.yaml")
    assert spec.scheduler is not None and spec.num_samples >= 8 and spec.search.algorithm == "optuna"


# --------------------------------------------------------------------------- a real sweep
@pytest.mark.slow
def test_collapsing_trial_is_pruned_baseline_never_and_resume_keeps_it(tmp_path) -> None:
    """Entropy below 1e6 nats/token at every step (always true): the search trial is pruned at its second
    step of three; the baseline, under the same rule, runs all three. A --resume of the sweep (its parent
    marked KILLED as a driver killed after the search phase leaves it) neither restarts the pruned trial
    nor changes its record."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    spec = tmp_path / "tiny.yaml"
    spec.write_text(_spec_text("{type: none, entropy_below: 1.0e6, entropy_steps: 2}",
                               "baseline: {name: masking_off, overrides: {algo.mpt.mode: 'off'}, seeds: 1}\n"))
    summary = SweepRunner(spec, tracking_uri=uri, output_dir=tmp_path / "out").run()
    assert summary["errors"] == []
    c = MlflowClient(uri)
    parent = summary["parent_run_id"]

    def kids() -> dict[str, object]:
        exp = c.get_run(parent).info.experiment_id
        runs = c.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
        return {r.data.tags["ulorl.trial_role"]: r for r in runs}

    runs = kids()
    assert sorted(runs) == ["baseline", "search"]
    s, b = runs["search"], runs["baseline"]
    assert s.info.status == "KILLED"
    assert (s.data.tags["ulorl.pruned"], s.data.tags["ulorl.pruned_reason"], s.data.tags["ulorl.pruned_step"]) == \
        ("true", "entropy_collapse", "2")
    assert sorted(m.step for m in c.get_metric_history(s.info.run_id, "train/entropy")) == [1, 2]
    assert b.info.status == "FINISHED" and "ulorl.pruned" not in b.data.tags
    assert sorted(m.step for m in c.get_metric_history(b.info.run_id, "train/entropy")) == [1, 2, 3]
    sweep_dir = Path(summary["sweep_dir"])
    assert json.loads((sweep_dir / prune.PRUNED_FILE).read_text()) == {
        s.data.tags["ulorl.trial_id"]: {"reason": "entropy_collapse", "step": 2}}
    row = next(r for r in summary["ranking"] if r["role"] == "search")
    assert (row["status"], row["pruned_reason"], row["pruned_step"]) == ("PRUNED", "entropy_collapse", 2)
    assert summary["best"] is None   # the only search trial was pruned

    c.set_terminated(parent, status="KILLED")
    again = SweepRunner(spec, tracking_uri=uri, output_dir=tmp_path / "out", resume=True).run()
    assert again["parent_run_id"] == parent and c.get_run(parent).info.status == "FINISHED"
    runs = kids()
    assert sorted(runs) == ["baseline", "search"]
    s2 = runs["search"]
    assert s2.info.run_id == s.info.run_id and s2.info.status == "KILLED" and s2.data.tags["ulorl.pruned_step"] == "2"
    assert sorted(m.step for m in c.get_metric_history(s2.info.run_id, "train/entropy")) == [1, 2]
    assert next(r for r in again["ranking"] if r["role"] == "search")["status"] == "PRUNED"


def test_sweep_page_status_says_pruned_with_rule_and_step() -> None:
    from ulorl.dashboard.pages.sweep import trial_status

    trials = pd.DataFrame({"status": ["FINISHED", "KILLED", "KILLED"],
                           "tags.ulorl.pruned": [None, "true", None],
                           "tags.ulorl.pruned_reason": [None, "asha", None],
                           "tags.ulorl.pruned_step": [None, "5", None]})
    assert list(trial_status(trials)) == ["FINISHED", "PRUNED (asha, step 5)", "KILLED"]
    assert list(trial_status(trials[["status"]])) == ["FINISHED", "KILLED", "KILLED"]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return migrated_empty_db(tmp_path_factory.mktemp("template"))


def test_marking_tags_search_runs_only_and_is_idempotent(tmp_path, template) -> None:
    store = StoreBase(tmp_path, template)
    c = store.client
    parent = c.create_run(store.exp, run_name="sweep-tiny").info.run_id
    ids = {}
    for tid, role in (("s1", "search"), ("s2", "search"), ("b1", "baseline")):
        ids[tid] = c.create_run(store.exp, run_name=tid, tags={"mlflow.parentRunId": parent, "ulorl.trial_id": tid,
                                                               "ulorl.trial_role": role}).info.run_id
    records = {"s1": {"reason": "asha", "step": 5}, "b1": {"reason": "entropy_collapse", "step": 3}}
    assert prune.mark_pruned_runs(c, parent, records) == 1
    s1, s2, b1 = (c.get_run(ids[t]) for t in ("s1", "s2", "b1"))
    assert s1.info.status == "KILLED" and (s1.data.tags["ulorl.pruned_reason"], s1.data.tags["ulorl.pruned_step"]) \
        == ("asha", "5")
    assert s2.info.status == "RUNNING" and "ulorl.pruned" not in s2.data.tags
    assert b1.info.status == "RUNNING" and "ulorl.pruned" not in b1.data.tags   # a baseline is never pruned
    assert prune.mark_pruned_runs(c, parent, records) == 0


def test_baseline_tuner_has_no_scheduler(tmp_path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(_spec_text("{type: asha, grace_period: 2, entropy_below: 1.0e6}",
                            "baseline: {name: masking_off, overrides: {algo.mpt.mode: 'off'}, seeds: 2}\n"))
    runner = SweepRunner(p, tracking_uri=f"sqlite:///{tmp_path}/m.db", output_dir=tmp_path / "out")
    runner.sweep_dir.mkdir(parents=True)
    kwargs = tuners.extra_tuner_kwargs(runner.spec, plan.extra_entries(runner.spec, None), runner.sweep_dir, [])
    assert kwargs["tune_config"].scheduler is None
    assert [e["role"] for e in kwargs["param_space"]["__extra__"]["grid_search"]] == ["baseline", "baseline"]


def test_an_eval_objective_is_fresh_only_at_eval_steps() -> None:
    # the trainer carries the last eval into every step; time/eval_s is there only when the step evaluated
    carried = {"eval/heldout/avg_at_k": 0.5, "train/entropy": 0.1}
    evaluated = {**carried, "time/eval_s": 3.0}
    assert not prune.objective_fresh("eval/heldout/avg_at_k", carried)
    assert prune.objective_fresh("eval/heldout/avg_at_k", evaluated)
    assert prune.objective_fresh("train/entropy", carried) and not prune.objective_fresh("time/step_s", carried)


def test_asha_prunes_below_the_rung_cutoff_at_evaluated_steps_only(tmp_path) -> None:
    """ASHA, 20 steps, grace period 5, reduction factor 2: rungs at steps 5, 10 and 20; the cutoff of a
    rung is the median (50th percentile) of the values recorded there before. A records 0.6 at the step-5
    rung; B's carried 0.1 at step 6 (not evaluated) is not judged; B's evaluated 0.4 at step 7 is below
    0.6 and stops B (recorded at step 7); C's 0.6 is above the new cutoff median(0.6, 0.4) = 0.5 and goes
    on. D, below A's 0.9 at the step-20 rung, is at its last step: no pruning there."""
    inner = prune.objective_scheduler("asha", max_steps=20, grace_period=5, reduction_factor=2, brackets=1,
                                      min_samples=1)
    sch = prune.PruningScheduler(str(tmp_path), max_steps=20, inner=inner, inner_reason="asha")
    sch.set_search_properties("eval/heldout/avg_at_k", "max")
    a, b, c, d = (_Trial(x) for x in "ABCD")
    for t in (a, b, c, d):
        sch.on_trial_add(None, t)
    assert sch.on_trial_result(None, a, _result(5, 1.0, 0.6, fresh=True)) == "CONTINUE"
    assert sch.on_trial_result(None, b, _result(6, 1.0, 0.1, fresh=False)) == "CONTINUE"
    assert sch.on_trial_result(None, b, _result(7, 1.0, 0.4, fresh=True)) == "STOP"
    assert sch.on_trial_result(None, c, _result(5, 1.0, 0.6, fresh=True)) == "CONTINUE"
    assert sch.on_trial_result(None, a, _result(20, 1.0, 0.9, fresh=True)) == "CONTINUE"
    assert sch.on_trial_result(None, d, _result(20, 1.0, 0.1, fresh=True)) == "CONTINUE"
    assert prune.read_pruned(tmp_path) == {"B": {"reason": "asha", "step": 7}}
