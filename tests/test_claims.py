"""Claims over seeds (ulorl.report.claims): hand-derived statistics on tiny numbers, and the loader
on real sqlite MLflow stores filled with the tracking schema's tags, params, metrics and per-problem
eval CSVs, as sweeps write them."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow_store import StoreBase, migrated_empty_db, store_uri_from_template

from ulorl.report import claims as C
from ulorl.report.store import RunStore
from ulorl.tracking import schema

T975_2 = 4.302652729911275  # t_{0.975, 2}


# ----------------------------------------------------------------------------- pure statistics


@pytest.mark.parametrize("df, q", [(1, 12.7062047), (2, T975_2), (3, 3.1824463), (4, 2.7764451), (30, 2.0422725)])
def test_t_quantile_matches_the_table(df: int, q: float) -> None:
    assert C.t_quantile(0.975, df) == pytest.approx(q, rel=1e-6)


def test_t_cdf_closed_forms() -> None:
    # df = 2: P(|T| < t) = t / sqrt(2 + t^2); df = 1 (Cauchy): 2 atan(t) / pi
    assert C.t_cdf_two_sided(1.5, 2) == pytest.approx(1.5 / math.sqrt(2 + 1.5**2))
    assert C.t_cdf_two_sided(1.0, 1) == pytest.approx(0.5)


def test_t_interval_hand_derived() -> None:
    mean, lo, hi = C.t_interval([0.1, 0.2, 0.3])
    half = T975_2 * 0.1 / math.sqrt(3)         # sd = 0.1 (n - 1 denominator)
    assert mean == pytest.approx(0.2)
    assert (lo, hi) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))
    with pytest.raises(ValueError, match="2 seeds"):
        C.t_interval([0.1])


def test_verdicts() -> None:
    v = C.verdict
    assert v(+1, [(0.01, 0.3)], 3) == C.HOLDS
    assert v(+1, [(-0.3, -0.01)], 3) == C.NOT_HOLD
    assert v(+1, [(-0.1, 0.2)], 3) == C.INCONCLUSIVE
    assert v(-1, [(-0.3, -0.01)], 3) == C.HOLDS and v(-1, [(0.01, 0.3)], 3) == C.NOT_HOLD
    assert v(+1, [(0.01, 0.3), (-0.02, 0.4)], 3) == C.INCONCLUSIVE   # every interval must agree
    assert v(+1, [(0.01, 0.3)], 1) == C.FEW_SEEDS and v(+1, [], 0) == C.FEW_SEEDS
    assert v(0, [(-0.02, 0.03)], 3, margin=0.05) == C.HOLDS
    assert v(0, [(-0.02, 0.08)], 3, margin=0.05) == C.INCONCLUSIVE
    assert v(0, [(0.06, 0.08)], 3, margin=0.05) == C.NOT_HOLD


def test_pooled_problem_interval_averages_seeds_per_problem_first() -> None:
    a = [{"p1": 1.0, "p2": 0.5, "p3": 1.0}, {"p1": 1.0, "p2": 1.0}]
    b = [{"p1": 0.5, "p2": 0.5}, {"p1": 0.5, "p2": 0.5, "p3": 0.0}]
    d, lo, hi, n = C.pooled_problem_interval(a, b)
    # p3 is not in every run: out. p1: 1 - 0.5 = 0.5; p2: 0.75 - 0.5 = 0.25 -> mean 0.375
    assert n == 2 and d == pytest.approx(0.375)
    assert 0.25 <= lo <= d <= hi <= 0.5
    assert C.pooled_problem_interval([{"p1": 1.0}], [{"p2": 1.0}]) is None


def test_registry_names_every_claim_once_with_a_direction() -> None:
    names = [c.name for c in C.CLAIMS]
    assert len(names) == len(set(names))
    assert {"fig4_entropy", "fig4_heldout", "fig5_entropy", "fig5_heldout", "table3_heldout",
            "fig2_pois_vs_tois", "fig2_sais_vs_tois", "headline"} <= set(names)
    assert all(c.direction in (-1, 0, 1) and c.paper_says and c.metric in C.METRIC_TEXT for c in C.CLAIMS)
    assert all(c.margin is not None for c in C.CLAIMS if c.direction == 0)


# ----------------------------------------------------------------------------- a real store


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return migrated_empty_db(tmp_path_factory.mktemp("template"))


class Store(StoreBase):
    def parent(self, sweep: str) -> str:
        return self.client.create_run(self.exp, run_name=sweep, tags={schema.KIND_TAG: "sweep"}).info.run_id

    def run(self, paper_ref: str, params: dict, seed: int, *, sweep: str = "", parent: str = "", role: str = "search",
            entropy: list[float] | None = None, heldout: dict[int, float] | None = None,
            per_problem: dict[int, dict[str, float]] | None = None, samples: list[float] | None = None,
            status: str = "FINISHED") -> str:
        tags = {schema.KIND_TAG: "train", schema.PAPER_REF_TAG: paper_ref, schema.ROLE_TAG: role,
                schema.SEED_TAG: str(seed)}
        if sweep:
            tags[schema.SWEEP_TAG] = sweep
        if parent:
            tags[schema.PARENT_TAG] = parent
        rid = self.client.create_run(self.exp, run_name=f"{sweep}-{role}-{seed}", tags=tags).info.run_id
        all_params = {"data.seed": seed, "rollout.seed": seed, "train.seed": seed, "data.task.seed": 0,
                      "algo.mpt.mode": "off", "algo.mpt.sigma": 0.2, "algo.mpt.tau": 0.99, **params}
        self.client.log_batch(rid, params=[Param(k, str(v)) for k, v in all_params.items()])
        ts = int(time.time() * 1000)
        ms = [Metric("train/entropy", v, ts, st) for st, v in enumerate(entropy or [], start=1)]
        ms += [Metric(C.HELDOUT, v, ts, st) for st, v in (heldout or {}).items()]
        ms += [Metric("train/samples", v, ts, st) for st, v in enumerate(samples or [], start=1)]
        if ms:
            self.client.log_batch(rid, metrics=ms)
        for st, scores in (per_problem or {}).items():
            rows = "".join(f"{p},{int(round(v * 4))},4\n" for p, v in scores.items())
            path = f"eval/heldout_per_problem_step_{st:06d}.csv"
            self.client.log_text(rid, "problem_id,num_correct,k\n" + rows, path)
        self.client.set_terminated(rid, status=status)
        return rid


def _one(results: list[C.ClaimResult], name: str) -> C.ClaimResult:
    (r,) = [r for r in results if r.claim == name]
    return r


def test_fig4_and_fig5_claims_from_one_sweep(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    parent = st.parent("choice_mpt_mode")
    kw = {"sweep": "choice_mpt_mode", "parent": parent}
    ids: dict[tuple[str, int], str] = {}
    # final entropy = mean of the last 10 steps; 12 steps, the first two off-window
    for seed, (off_h, static_h, dyn_h) in enumerate([(0.10, 0.40, 0.24), (0.12, 0.52, 0.26), (0.08, 0.58, 0.22)]):
        probs_off = {"p1": 0.25, "p2": 0.5}
        ids["off", seed] = st.run("fig4", {"algo.mpt.mode": "off"}, seed, entropy=[9.0, 9.0] + [off_h] * 10,
                                  heldout={150: 0.375}, per_problem={150: probs_off}, **kw)
        ids["static", seed] = st.run("fig4", {"algo.mpt.mode": "static"}, seed, entropy=[9.0, 9.0] + [static_h] * 10,
                                     heldout={150: 0.375 + 0.1 * (seed + 1)}, **kw)
        ids["dyn", seed] = st.run("fig5", {"algo.mpt.mode": "dynamic", "algo.mpt.sigma": 0.25}, seed,
                                  entropy=[9.0, 9.0] + [dyn_h] * 10, heldout={150: 0.5},
                                  per_problem={150: {"p1": 0.5, "p2": 0.5}}, **kw)
    results = C.evaluate_claims(RunStore.open(st.uri))
    ent = _one(results, "fig4_entropy")
    # per-seed static - off: 0.30, 0.40, 0.50 -> 0.4 +- t * 0.1 / sqrt(3)
    assert ent.seeds == 3 and ent.sweep.startswith("choice_mpt_mode")
    assert [p["diff"] for p in ent.per_seed] == pytest.approx([0.3, 0.4, 0.5])
    assert ent.effect == pytest.approx(0.4)
    assert ent.t_low == pytest.approx(0.4 - T975_2 * 0.1 / math.sqrt(3))
    assert ent.verdict == C.HOLDS and ent.problem_low is None           # entropy: no per-problem interval
    assert set(ent.run_ids) == {ids[m, s] for m in ("static", "off") for s in range(3)}
    acc = _one(results, "fig4_heldout")
    # diffs 0.1, 0.2, 0.3: 0.2 +- 4.303 * 0.1 / sqrt(3) = [-0.048, 0.448] -> inconclusive
    assert acc.effect == pytest.approx(0.2) and acc.t_low == pytest.approx(0.2 - T975_2 * 0.1 / math.sqrt(3))
    assert acc.verdict == C.INCONCLUSIVE
    assert acc.problem_low is None and any("per-problem" in n for n in acc.notes)  # static logged no CSVs
    f5 = _one(results, "fig5_heldout")
    # every seed: 0.5 - 0.375 = 0.125 (sd 0: the t-interval is the point); problems p1 +0.25, p2 0 pooled
    assert f5.effect == pytest.approx(0.125) and (f5.t_low, f5.t_high) == (pytest.approx(0.125), pytest.approx(0.125))
    assert f5.problems == 2 and f5.problem_effect == pytest.approx(0.125)
    assert 0.0 <= f5.problem_low <= 0.125 <= f5.problem_high <= 0.25
    assert f5.verdict == C.INCONCLUSIVE                                  # the bootstrap interval reaches 0
    gap = _one(results, "fig5_sigma_gap")
    # |dyn - 0.25| = 0.01, 0.01, 0.03; |off - 0.25| (arm a's sigma, not off's own 0.2) = 0.15, 0.13, 0.17
    assert [p["diff"] for p in gap.per_seed] == pytest.approx([-0.14, -0.12, -0.14])
    assert gap.effect == pytest.approx(-0.4 / 3) and gap.verdict == C.HOLDS
    fe = _one(results, "fig5_entropy")
    assert [p["diff"] for p in fe.per_seed] == pytest.approx([0.14, 0.14, 0.14]) and fe.verdict == C.HOLDS
    # the claims of other sweeps have no runs: one 'not run' row naming the command
    t3 = _one(results, "table3_heldout")
    assert t3.verdict == C.NOT_RUN and "sweeps/choice/output_length.yaml" in t3.notes[0]


def test_sweeps_are_not_mixed_and_one_seed_is_not_enough(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    p1, p2 = st.parent("mpt_mode"), st.parent("choice_mpt_mode")
    st.run("fig4", {"algo.mpt.mode": "off"}, 0, sweep="mpt_mode", parent=p1, entropy=[0.1])
    st.run("fig4", {"algo.mpt.mode": "static"}, 0, sweep="mpt_mode", parent=p1, entropy=[0.3])
    for s in (1, 2):   # the other sweep has only the off arm on other seeds: no pair with p1's static
        st.run("fig4", {"algo.mpt.mode": "off"}, s, sweep="choice_mpt_mode", parent=p2, entropy=[0.1])
    st.run("fig4", {"algo.mpt.mode": "static"}, 1, sweep="mpt_mode", parent=p1, entropy=[0.9], status="RUNNING")
    ent = _one(C.evaluate_claims(RunStore.open(st.uri)), "fig4_entropy")
    assert ent.sweep.startswith("mpt_mode") and ent.seeds == 1 and ent.effect == pytest.approx(0.2)
    assert ent.verdict == C.FEW_SEEDS
    assert any("unfinished" in n for n in ent.notes)


def test_table3_compares_at_equal_trained_samples(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    parent = st.parent("choice_output_length")
    kw = {"sweep": "choice_output_length", "parent": parent}
    for s, (tight, loose) in enumerate([(0.30, 0.40), (0.30, 0.45), (0.30, 0.50)]):
        # tight trains 10 samples/step, loose 20: the budget is tight's 40 samples at its last eval
        # (step 4); loose reaches 40 at step 2, so its step-2 point counts, not its better step-4 one
        st.run("table3", {"rollout.max_response_len": 96, "rollout.segments": 2}, s, samples=[10] * 4,
               heldout={2: 0.2, 4: tight}, per_problem={4: {"p1": tight, "p2": tight}}, **kw)
        st.run("table3", {"rollout.max_response_len": 192, "rollout.segments": 4}, s, samples=[20] * 4,
               heldout={2: loose, 4: 0.9}, per_problem={2: {"p1": loose, "p2": loose}, 4: {"p1": 1.0, "p2": 1.0}},
               **kw)
    r = _one(C.evaluate_claims(RunStore.open(st.uri)), "table3_heldout")
    assert [(p["a_step"], p["b_step"]) for p in r.per_seed] == [(2, 4)] * 3
    assert r.effect == pytest.approx(0.15) and any("budget 40" in n for n in r.notes)
    # per-problem CSVs of the budget steps, quantised to k = 4: loose 2/4 on every seed, tight 1/4
    assert r.problems == 2 and r.problem_effect == pytest.approx(0.25)
    assert r.verdict == C.HOLDS


def test_headline_pairs_the_best_config_and_its_reruns_with_the_baseline(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    parent = st.parent("choice_mpt_threshold")
    kw = {"sweep": "choice_mpt_threshold", "parent": parent}
    best = {"algo.mpt.mode": "dynamic", "algo.mpt.tau": 0.95, "algo.mpt.sigma": 0.3}
    other = {"algo.mpt.mode": "dynamic", "algo.mpt.tau": 0.9, "algo.mpt.sigma": 0.2}
    ids = {"best0": st.run("fig5", best, 0, heldout={150: 0.6}, **kw),
           "other": st.run("fig5", other, 0, heldout={150: 0.55}, **kw)}
    for s in (1, 2):
        ids[f"best{s}"] = st.run("fig5", best, s, role="rerun", heldout={150: 0.5 + 0.05 * s}, **kw)
    for s, v in enumerate((0.5, 0.5, 0.5)):
        ids[f"base{s}"] = st.run("fig5", {"algo.mpt.mode": "off"}, s, role="baseline", heldout={150: v}, **kw)
    results = C.evaluate_claims(RunStore.open(st.uri))
    h = _one(results, "headline")
    assert [p["a_run"] for p in h.per_seed] == [ids["best0"], ids["best1"], ids["best2"]]
    assert [p["b_run"] for p in h.per_seed] == [ids["base0"], ids["base1"], ids["base2"]]
    assert [p["diff"] for p in h.per_seed] == pytest.approx([0.1, 0.05, 0.1])
    assert h.seeds == 3 and any("selected" in n for n in h.notes)
    # the headline sweep holds a baseline: the fig5 claims (dynamic vs off) skip it
    assert _one(results, "fig5_heldout").verdict == C.NOT_RUN


def test_write_claims_markdown_and_json(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    out = C.write_claims(RunStore.open(st.uri), tmp_path / "o")
    assert [Path(f).name for f in out["files"]] == ["claims.md", "claims.json"]
    md = (tmp_path / "o" / "claims.md").read_text()
    assert md.count("**not run**") == len(C.CLAIMS) and "| Claim | Paper says |" in md
    js = json.loads((tmp_path / "o" / "claims.json").read_text())
    assert [r["claim"] for r in js] == [c.name for c in C.CLAIMS]
    assert all(r["verdict"] == "not run" and r["effect"] is None for r in out["rows"])


def test_claims_read_real_training_runs(tmp_path: Path, empty_db: Path) -> None:
    """Four real 2-step trainings of experiments/quickstart_choice.yaml (random-init model of its
    architecture): masking off / static on seeds 0 and 1, tagged fig4. The claims pair them by their
    logged seeds and read the trainer's own per-problem held-out CSVs."""
    from ulorl.config import load_experiment
    from ulorl.models.tiny import build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer
    from ulorl.train.trainer import train

    model_dir = tmp_path / "tiny"
    tok = build_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    uri = store_uri_from_template(tmp_path, empty_db)
    base = Path(__file__).resolve().parents[1] / "experiments" / "quickstart_choice.yaml"
    common = [f"model.name_or_path={model_dir}", "train.max_steps=2", "rollout.max_response_len=32",
              "rollout.segments=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "eval.every=2",
              "eval.num_problems=4", "eval.k=1", "algo.dynamic_sampling=false", f"tracking.uri={uri}",
              "tracking.paper_ref=fig4", "train.threads=1", "train.checkpoint_every=2"]
    ids = {}
    for mode in ("off", "static"):
        for seed in (0, 1):
            over = common + [f"algo.mpt.mode={mode}", f"data.seed={seed}", f"rollout.seed={seed}",
                             f"train.seed={seed}", f"train.output_dir={tmp_path / 'runs' / f'{mode}{seed}'}"]
            ids[mode, seed] = train(load_experiment(base, over), progress=False).run_id
    store = RunStore.open(uri)
    results = C.evaluate_claims(store)
    acc = _one(results, "fig4_heldout")
    assert acc.seeds == 2 and acc.problems == 4
    assert [(p["a_run"], p["b_run"]) for p in acc.per_seed] == [(ids["static", s], ids["off", s]) for s in (0, 1)]
    want = [store.history(ids["static", s], C.HELDOUT)[1][-1] - store.history(ids["off", s], C.HELDOUT)[1][-1]
            for s in (0, 1)]
    assert [p["diff"] for p in acc.per_seed] == pytest.approx(want)
    assert acc.verdict in (C.HOLDS, C.NOT_HOLD, C.INCONCLUSIVE)
    ent = _one(results, "fig4_entropy")
    assert ent.seeds == 2 and ent.effect is not None
