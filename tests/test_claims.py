"""Claims over seeds (ulorl.report.claims, ulorl.eval.paired): hand-derived statistics on tiny
numbers (t quantiles, the equivalence and directional verdict rules, minimum detectable effects), and
the loader on real sqlite MLflow stores filled with the tracking schema's tags, params, metrics and
per-problem eval CSVs, as sweeps write them, read directly and through exported results files."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Metric, Param
from mlflow_store import StoreBase, migrated_empty_db, store_uri_from_template

from ulorl.eval import paired as P
from ulorl.report import claims as C
from ulorl.report.results import ResultsStore, export_results, read_records
from ulorl.report.store import RunStore
from ulorl.tracking import schema

T975_2 = 4.302652729911275  # t_{0.975, 2}
T95_2 = 2.919985580355516   # t_{0.95, 2}: the 90 % interval of a no-difference claim
T80_2 = 1.0606601717798212  # t_{0.80, 2}: P(|T| < t) = t / sqrt(2 + t^2) = 0.6 -> t^2 = 1.125
Z975, Z80 = 1.959963984540054, 0.8416212335729143


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


def _with_t(direction: int, intervals: list[tuple[float, float]], n: int, margin: float | None = None) -> str:
    """A verdict whose first interval is the t-interval whenever there are enough seeds for one."""
    return C.verdict(direction, intervals, n, margin, t_usable=n >= P.MIN_T_SEEDS)


def test_directional_verdicts() -> None:
    v = _with_t
    assert v(+1, [(0.01, 0.3)], 3) == C.HOLDS
    assert v(+1, [(-0.3, -0.01)], 3) == C.NOT_HOLD
    assert v(+1, [(-0.1, 0.2)], 3) == C.INCONCLUSIVE
    assert v(-1, [(-0.3, -0.01)], 3) == C.HOLDS and v(-1, [(0.01, 0.3)], 3) == C.NOT_HOLD
    assert v(+1, [(0.01, 0.3), (-0.02, 0.4)], 3) == C.INCONCLUSIVE   # every interval must agree
    assert v(+1, [(0.01, 0.3)], 1) == C.FEW_SEEDS and v(+1, [], 0) == C.FEW_SEEDS
    # no interval at all: with 2 seeds there is no t-interval to have had; with 3 the intervals said nothing
    assert v(+1, [], 2) == C.FEW_SEEDS and v(+1, [], 3) == C.INCONCLUSIVE


def test_equivalence_verdicts_are_two_one_sided_tests() -> None:
    v = _with_t
    # inside +-margin: holds
    assert v(0, [(-0.02, 0.03)], 3, margin=0.05) == C.HOLDS
    assert v(0, [(-0.02, 0.03), (-0.049, 0.01)], 8, margin=0.05) == C.HOLDS
    # excludes zero but crosses the margin: the difference may be 0.01, inside it -> inconclusive
    assert v(0, [(0.01, 0.30)], 3, margin=0.05) == C.INCONCLUSIVE
    # the last round's Fig. 2 intervals, both below zero and both crossing -0.05 (once "does not hold")
    assert v(0, [(-0.106, -0.003), (-0.102, -0.010)], 3, margin=0.05) == C.INCONCLUSIVE
    assert v(0, [(-0.02, 0.08)], 3, margin=0.05) == C.INCONCLUSIVE
    # wholly outside: does not hold (either side; touching the margin counts as outside)
    assert v(0, [(0.06, 0.08)], 3, margin=0.05) == C.NOT_HOLD
    assert v(0, [(-0.30, -0.05), (-0.2, -0.06)], 3, margin=0.05) == C.NOT_HOLD
    assert v(0, [(0.06, 0.08), (0.04, 0.08)], 3, margin=0.05) == C.INCONCLUSIVE   # one interval crosses
    with pytest.raises(ValueError, match="margin"):
        v(0, [(-0.01, 0.01)], 3)


def test_equivalence_claims_use_90_percent_intervals() -> None:
    levels = {c.name: c.level for c in C.CLAIMS}
    assert levels["fig2_pois_vs_tois"] == 0.90
    assert all(lv == 0.95 for name, lv in levels.items() if name != "fig2_pois_vs_tois")


def test_two_identical_differences_never_make_a_t_interval() -> None:
    assert P.seed_interval_usable([0.039, 0.039]) == (False, "only 2 seed(s) (a t-interval needs >= 3)")
    assert P.seed_interval_usable([0.01, 0.09])[0] is False          # 2 seeds, even with spread
    ok, why = P.seed_interval_usable([0.039, 0.039, 0.039])
    assert not ok and "identical" in why
    assert P.seed_interval_usable([0.03, 0.04, 0.05]) == (True, "")
    assert P.mde_seeds([0.039, 0.039]) is None and P.mde_seeds([0.039] * 3) is None


def test_minimum_detectable_effects_hand_derived() -> None:
    # seeds: sd 0.1, n 3. The exact MDE is the effect the t-test detects with power 0.80 (noncentral t); the
    # normal-style (t_0.975,2 + t_0.8,2) * 0.1 / sqrt(3) is a few per cent below it at n = 3 and meets it as n grows
    approx = (T975_2 + T80_2) * 0.1 / math.sqrt(3)
    mde = P.mde_seeds([0.1, 0.2, 0.3])
    assert mde is not None and P.power_seeds(mde, 0.1, 3) == pytest.approx(0.80, abs=1e-9)
    assert approx < mde < 1.06 * approx
    assert P.power_seeds(0.0, 0.1, 3) == pytest.approx(0.05, abs=1e-12)      # no effect: the test's own level
    mde90 = P.mde_seeds([0.1, 0.2, 0.3], level=0.90)
    assert mde90 is not None and P.power_seeds(mde90, 0.1, 3, level=0.90) == pytest.approx(0.80, abs=1e-9)
    assert mde90 < mde and mde90 == pytest.approx((T95_2 + T80_2) * 0.1 / math.sqrt(3), rel=0.02)
    many = [0.1, 0.2, 0.3] * 10                                                  # n 30: within 0.1 % of the formula
    sd30 = float(np.std(many, ddof=1))
    assert P.mde_seeds(many) == pytest.approx((P.t_quantile(0.975, 29) + P.t_quantile(0.8, 29)) * sd30
                                              / math.sqrt(30), rel=1e-3)
    # problems: differences 0, 0.5, 0, 0.5 -> sd (n - 1) = sqrt(0.25 / 3) = sqrt(1/12), P = 4
    x = [0.0, 0.5, 0.0, 0.5]
    assert P.mde_problems(x) == pytest.approx((Z975 + Z80) * math.sqrt(1 / 12) / 2, rel=1e-9)
    assert P.mde_problems([0.25]) is None
    assert C.t_quantile(0.8, 2) == pytest.approx(T80_2, rel=1e-9)
    assert C.t_quantile(0.95, 2) == pytest.approx(T95_2, rel=1e-9)


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
            status: str = "FINISHED", confirm: dict[int, dict[str, float]] | None = None,
            final: dict[int, dict[str, float]] | None = None) -> str:
        """One training run; ``confirm``: per step, the confirmation part's per-problem scores (its
        eval/heldout_confirm/avg_at_k is their mean); ``final``: the same for the final evaluation
        (eval/heldout_final/*, k = 16)."""
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
        ms += [Metric(f"eval/{bench}/avg_at_k", sum(sc.values()) / len(sc), ts, st)
               for bench, parts in ((C.CONFIRM, confirm), (C.FINAL, final)) for st, sc in (parts or {}).items()]
        if ms:
            self.client.log_batch(rid, metrics=ms)
        for bench, by_step, k in (("heldout", per_problem or {}, 4), (C.CONFIRM, confirm or {}, 4),
                                  (C.FINAL, final or {}, 16)):
            for st, scores in by_step.items():
                rows = "".join(f"{p},{int(round(v * k))},{k}\n" for p, v in scores.items())
                path = f"eval/{bench}_per_problem_step_{st:06d}.csv"
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
    assert ent.level == 0.95 and ent.basis == C.B_SEEDS
    # sd 0.1 over 3 seeds: the effect the t-test detects with power 0.80 (noncentral t)
    assert ent.mde_seeds is not None and ent.mde == ent.mde_seeds
    assert P.power_seeds(ent.mde_seeds, 0.1, 3) == pytest.approx(P.POWER, abs=1e-9)
    f5 = _one(results, "fig5_heldout")
    # every seed: 0.5 - 0.375 = 0.125: zero spread, no t-interval; the verdict rests on the problems
    # (p1 +0.25, p2 0 pooled), whose bootstrap interval reaches 0
    assert f5.effect == pytest.approx(0.125) and f5.t_low is None and f5.mde_seeds is None
    assert f5.problems == 2 and f5.problem_effect == pytest.approx(0.125)
    assert 0.0 <= f5.problem_low <= 0.125 <= f5.problem_high <= 0.25
    assert f5.basis == C.B_PROBLEMS and any("identical" in n and "bootstrap alone" in n for n in f5.notes)
    assert f5.mde_problems == pytest.approx((Z975 + Z80) * math.sqrt(0.03125) / math.sqrt(2), rel=1e-9)
    assert f5.verdict == C.INCONCLUSIVE
    gap = _one(results, "fig5_sigma_gap")
    # |dyn - 0.25| = 0.01, 0.01, 0.03; |off - 0.25| (arm a's sigma, not off's own 0.2) = 0.15, 0.13, 0.17
    assert [p["diff"] for p in gap.per_seed] == pytest.approx([-0.14, -0.12, -0.14])
    assert gap.effect == pytest.approx(-0.4 / 3) and gap.verdict == C.HOLDS
    fe = _one(results, "fig5_entropy")
    # three identical differences: no t-interval, and entropy has no per-problem interval -> no verdict
    assert [p["diff"] for p in fe.per_seed] == pytest.approx([0.14, 0.14, 0.14])
    assert fe.t_low is None and fe.basis == C.B_NONE and fe.verdict == C.INCONCLUSIVE
    assert any("no interval to judge by" in n for n in fe.notes)
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
    rows = {r.sweep.split(" ")[0]: r for r in C.evaluate_claims(RunStore.open(st.uri)) if r.claim == "fig4_entropy"}
    ent = rows["mpt_mode"]
    assert ent.seeds == 1 and ent.effect == pytest.approx(0.2)
    assert ent.verdict == C.FEW_SEEDS
    assert any("unfinished" in n for n in ent.notes)
    # the sweep with one arm only: a row that names the missing arm
    other = rows["choice_mpt_mode"]
    assert other.verdict == C.NOT_RUN and other.seeds == 0 and "'static masking'" in other.notes[0]


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


def _headline_store(tmp_path: Path, empty_db: Path, with_confirm: bool = True) -> tuple[Store, dict[str, str]]:
    """A headline sweep: the best config (search, seed 0) and another search trial, the best re-run on
    seeds 1-3, the baseline on 0-3. On the confirmation problems q1..q4 the re-runs gain
    0.25 / 0.25 / 0.5 per problem over the baseline on q1 only (diffs 0.0625, 0.0625, 0.125); on
    all held-out problems (what the search selected on) they gain more."""
    st = Store(tmp_path, empty_db)
    parent = st.parent("choice_mpt_threshold")
    kw = {"sweep": "choice_mpt_threshold", "parent": parent}
    best = {"algo.mpt.mode": "dynamic", "algo.mpt.tau": 0.95, "algo.mpt.sigma": 0.3}
    other = {"algo.mpt.mode": "dynamic", "algo.mpt.tau": 0.9, "algo.mpt.sigma": 0.2}
    base_conf = {"q1": 0.25, "q2": 0.5, "q3": 0.75, "q4": 0.5}

    def conf(gain: float) -> dict[int, dict[str, float]] | None:
        return {150: {**base_conf, "q1": base_conf["q1"] + gain}} if with_confirm else None

    ids = {"best0": st.run("fig5", best, 0, heldout={150: 0.9}, confirm=conf(0.75), **kw),
           "other": st.run("fig5", other, 0, heldout={150: 0.55}, confirm=conf(0.0), **kw)}
    for s, gain in ((1, 0.25), (2, 0.25), (3, 0.5)):
        ids[f"best{s}"] = st.run("fig5", best, s, role="rerun", heldout={150: 0.7 + 0.05 * s}, confirm=conf(gain), **kw)
    for s in range(4):
        ids[f"base{s}"] = st.run("fig5", {"algo.mpt.mode": "off"}, s, role="baseline", heldout={150: 0.5},
                                 confirm=conf(0.0), **kw)
    return st, ids


def test_headline_reads_rerun_seeds_on_the_confirmation_problems(tmp_path: Path, empty_db: Path) -> None:
    st, ids = _headline_store(tmp_path, empty_db)
    results = C.evaluate_claims(RunStore.open(st.uri))
    h = _one(results, "headline")
    # the selected search trial (seed 0, +0.1875 on the confirmation part) is not counted
    assert [p["a_run"] for p in h.per_seed] == [ids["best1"], ids["best2"], ids["best3"]]
    assert [p["b_run"] for p in h.per_seed] == [ids["base1"], ids["base2"], ids["base3"]]
    assert h.bench == C.CONFIRM and h.problems == 4
    assert [p["diff"] for p in h.per_seed] == pytest.approx([0.0625, 0.0625, 0.125])
    assert h.effect == pytest.approx(0.25 / 3)
    sd = math.sqrt(((0.0625 - 0.25 / 3) ** 2 * 2 + (0.125 - 0.25 / 3) ** 2) / 2)
    assert h.t_low == pytest.approx(0.25 / 3 - T975_2 * sd / math.sqrt(3))
    # pooled over seeds, q1 gains (0.25 + 0.25 + 0.5) / 3 and q2..q4 nothing: the bootstrap interval reaches 0
    assert h.problem_effect == pytest.approx(0.25 / 3) and h.problem_low == pytest.approx(0.0)
    assert h.verdict == C.INCONCLUSIVE and h.basis == C.B_BOTH
    assert any("re-run seeds only" in n for n in h.notes)
    assert any("one arm only" in n and "0/0/0" in n for n in h.notes)   # baseline seed 0 has no re-run
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


def _is_mode_runs(st: Store, parent: str, seeds: tuple[int, ...], params: dict | None = None) -> None:
    """Fig. 2 runs of one launch: TOIS / SAIS / POIS on ``seeds``, held-out and per-problem scores that
    differ by arm and seed, entropy and samples curves."""
    kw = {"sweep": "choice_is_mode", "parent": parent}
    for s in seeds:
        for i, mode in enumerate(("tois", "sais", "pois")):
            probs = {f"p{j}": ((i + s + j) % 5) / 4 for j in range(6)}
            st.run("fig2", {"algo.is_mode": mode, **(params or {})}, s, entropy=[0.2 + 0.01 * (i + s)] * 12,
                   heldout={0: 0.5, 150: sum(probs.values()) / 6}, per_problem={0: {"p0": 0.5}, 150: probs},
                   samples=[8.0] * 12, **kw)


def test_results_files_reproduce_the_store_claims_and_merge_later_seeds(tmp_path: Path, empty_db: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    st, _ = _headline_store(tmp_path / "a", empty_db)
    first = st.parent("choice_is_mode")
    _is_mode_runs(st, first, (0, 1, 2))
    st.run("fig2", {"algo.is_mode": "tois"}, 7, sweep="choice_is_mode", parent=first, status="RUNNING")
    store = RunStore.open(st.uri)
    res = tmp_path / "results"
    out = export_results(store, res)
    assert set(out) == {"choice_is_mode", "choice_mpt_threshold"}
    assert out["choice_is_mode"]["runs"] == 9 and out["choice_mpt_threshold"]["runs"] == 9   # the RUNNING one: not
    files = ResultsStore.open(res)
    # the file-backed source answers as the store does: claims identical, field for field (the store
    # also notes its unfinished run, which the files never held)
    from_store = [asdict(r) for r in C.evaluate_claims(store)]
    assert sum("1 unfinished run(s)" in n for r in from_store for n in r["notes"]) == 3   # the three fig2 claims
    for r in from_store:
        r["notes"] = [n for n in r["notes"] if "unfinished" not in n]
    assert [asdict(r) for r in C.evaluate_claims(files)] == from_store
    run = next(r for r in store.runs(paper_ref="fig2") if r.status == "FINISHED")
    assert files.history(run.run_id, "train/entropy") == store.history(run.run_id, "train/entropy")
    assert files.per_problem(run.run_id, 0) == store.per_problem(run.run_id, 0) == {"p0": 0.5}
    # exporting again changes nothing, byte for byte
    before = {f.name: f.read_bytes() for f in res.iterdir()}
    again = export_results(RunStore.open(st.uri), res)
    assert not any(e["written"] for e in again.values()) and {f.name: f.read_bytes() for f in res.iterdir()} == before
    # a later session's store holds only a new launch on seeds 3-4: the file keeps the old runs
    st2 = Store(tmp_path / "b", empty_db)
    _is_mode_runs(st2, st2.parent("choice_is_mode"), (3, 4))
    merged = export_results(RunStore.open(st2.uri), res)["choice_is_mode"]
    assert (merged["runs"], merged["added"], merged["kept"]) == (15, 6, 9)
    assert len(read_records(res / "choice_is_mode.jsonl")) == 15
    fig2 = _one(C.evaluate_claims(ResultsStore.open(res)), "fig2_pois_vs_sais")
    assert fig2.seeds == 5 and fig2.sweep.count("+") == 1     # the two launches pooled, both named


def test_a_results_folder_reads_results_records_only(tmp_path: Path) -> None:
    # a bench's own JSON lines (one object per finished run, with a run_id, no results format) beside a
    # results file in the folder are not runs of the claims
    from ulorl.report.results import FORMAT, holds_records, results_files

    (tmp_path / "sweep.jsonl").write_text(json.dumps({"format": FORMAT, "run_id": "r1", "tags": {}}) + "\n")
    (tmp_path / "entropy_map.jsonl").write_text(json.dumps({"run_id": "m1", "share": 0.01}) + "\n")
    (tmp_path / "empty.jsonl").write_text("")
    assert [f.name for f in results_files([tmp_path])] == ["empty.jsonl", "sweep.jsonl"]
    assert not holds_records(tmp_path / "entropy_map.jsonl")
    assert [r.run_id for r in ResultsStore.open(tmp_path).runs()] == ["r1"]
    # named on its own, a file is read as given
    assert [r.run_id for r in ResultsStore.open(tmp_path / "entropy_map.jsonl").runs()] == ["m1"]


def test_launches_with_other_fixed_settings_are_not_pooled(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    _is_mode_runs(st, st.parent("choice_is_mode"), (0, 1, 2), {"train.lr": 1e-4})
    _is_mode_runs(st, st.parent("choice_is_mode"), (3, 4, 5), {"train.lr": 1e-4})
    _is_mode_runs(st, st.parent("choice_is_mode"), (0, 1, 2), {"train.lr": 5e-4})
    rows = [r for r in C.evaluate_claims(RunStore.open(st.uri)) if r.claim == "fig2_pois_vs_tois"]
    assert sorted(r.seeds for r in rows) == [3, 6]
    assert all(r.level == 0.90 and r.margin == 0.05 for r in rows)


def test_docs_table_replaces_only_its_block() -> None:
    res = C.ClaimResult("fig2_pois_vs_tois", "", "", "POIS vs TOIS (S=1)", 0, "choice_is_mode (abcdef12)",
                        level=0.90, margin=0.05, bench="heldout", seeds=3, effect=-0.055, t_low=-0.09, t_high=-0.02,
                        eq_margin_seeds=0.06, seeds_for_margin=5, basis=C.B_SEEDS, verdict=C.INCONCLUSIVE,
                        per_seed=[{"diff": -0.078}, {"diff": -0.039}, {"diff": -0.047}])
    table = C.docs_table([res])
    assert "`ulorl-sweep sweeps/choice/is_mode.yaml`" in table and "[-0.090, -0.020] (90 %)" in table
    assert "-0.055 (-0.078, -0.039, -0.047)" in table and "**inconclusive** (seeds only, margin +-0.05)" in table
    doc = f"intro\n{C.DOCS_BEGIN}\nold\n{C.DOCS_END}\nafter\n"
    assert C.replace_docs_table(doc, table) == f"intro\n{C.DOCS_BEGIN}\n{table}{C.DOCS_END}\nafter\n"
    with pytest.raises(ValueError, match="claims-table"):
        C.replace_docs_table("no markers", table)


def test_readme_summary_keeps_the_paper_claims_and_both_blocks_are_rewritten() -> None:
    fig2 = C.ClaimResult("fig2_pois_vs_tois", "", "", "POIS vs TOIS (S=1)", 0, "choice_is_mode (abcdef12)",
                         level=0.90, margin=0.05, bench="heldout", seeds=3, effect=-0.055, t_low=-0.09,
                         t_high=-0.02, problem_low=-0.07, problem_high=0.01, problems=64, eq_margin_seeds=0.06,
                         eq_margin_problems=0.04, seeds_for_margin=5, basis=C.B_BOTH, verdict=C.INCONCLUSIVE,
                         per_seed=[{"diff": -0.078}, {"diff": -0.039}, {"diff": -0.047}])
    ec = C.ClaimResult("ec_kl_cov_entropy", "", "", "KL-Cov vs off", 1, "choice_entropy_controls (abc)")
    summary = C.summary_table([fig2, ec])
    assert "ec_kl_cov" not in summary and "-0.078" not in summary          # paper claims, no per-seed list
    assert ("| fig2_pois_vs_tois: POIS vs TOIS (S=1) | 3 | -0.055 | [-0.090, -0.020] | [-0.070, +0.010] "
            "| margin 0.060; +-0.05 needs ~5 seeds "
            "| **inconclusive** (90 %, seeds + problems, margin +-0.05) "
            "| `ulorl-sweep sweeps/choice/is_mode.yaml` |") in summary
    doc = (f"a\n{C.SUMMARY_BEGIN}\nold summary\n{C.SUMMARY_END}\nb\n{C.DOCS_BEGIN}\nold table\n"
           f"{C.DOCS_END}\nc\n")
    assert C.update_docs(doc, [fig2, ec]) == (f"a\n{C.SUMMARY_BEGIN}\n{summary}{C.SUMMARY_END}\nb\n{C.DOCS_BEGIN}\n"
                                              f"{C.docs_table([fig2, ec])}{C.DOCS_END}\nc\n")
    with pytest.raises(ValueError, match="claims-summary"):
        C.update_docs("no markers", [fig2])


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
    assert acc.seeds == 2
    assert [(p["a_run"], p["b_run"]) for p in acc.per_seed] == [(ids["static", s], ids["off", s]) for s in (0, 1)]
    want = [store.history(ids["static", s], C.HELDOUT)[1][-1] - store.history(ids["off", s], C.HELDOUT)[1][-1]
            for s in (0, 1)]
    assert [p["diff"] for p in acc.per_seed] == pytest.approx(want)
    assert len(C.run_value(store, store.get(ids["off", 0]), C.M_HELDOUT).scores) == 4   # its per-problem CSV
    # a random-init policy earns no reward in 2 steps: zero advantages, so masking changes nothing and the
    # arms train the same model, bit for bit; the claims see it on the real runs
    ent = _one(results, "fig4_entropy")
    assert ent.seeds == 2 and ent.effect == 0.0
    assert acc.verdict == ent.verdict == C.ARMS_IDENTICAL


def test_split_feeds_the_sweep_verdict_and_the_headline_claim(tmp_path: Path, empty_db: Path) -> None:
    """Five real 2-step trainings with eval.select_problems (6 held-out problems: 3 to select on, 3 to
    confirm), tagged as a headline sweep writes them: the best search trial on seed 0, its re-runs and
    the baseline on seeds 1 and 2. The trainer logs both parts; the sweep summary ranks by the
    selection part and judges on the confirmation part of the re-run seeds; so does the claim."""
    from mlflow.tracking import MlflowClient

    from ulorl.config import load_experiment
    from ulorl.models.tiny import build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer
    from ulorl.sweep import summary as sweep_summary
    from ulorl.sweep.spec import load_sweep
    from ulorl.train.trainer import Trainer

    model_dir = tmp_path / "tiny"
    tok = build_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    uri = store_uri_from_template(tmp_path, empty_db)
    client = MlflowClient(uri)
    exp = client.create_experiment("ulorl")
    parent = client.create_run(exp, run_name="sweep", tags={schema.KIND_TAG: "sweep"}).info.run_id
    root = Path(__file__).resolve().parents[1]
    base = root / "experiments" / "quickstart_choice.yaml"
    common = [f"model.name_or_path={model_dir}", "train.max_steps=2", "rollout.max_response_len=32",
              "rollout.segments=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "eval.every=2",
              "eval.num_problems=6", "eval.select_problems=3", "eval.k=1", "algo.dynamic_sampling=false",
              "tracking.experiment=ulorl", "tracking.paper_ref=fig5", "train.threads=1", "train.checkpoint_every=2"]
    ids = {}
    for name, mode, seed, role in (("search", "dynamic", 0, "search"), ("rerun1", "dynamic", 1, "rerun"),
                                   ("rerun2", "dynamic", 2, "rerun"), ("base1", "off", 1, "baseline"),
                                   ("base2", "off", 2, "baseline")):
        over = common + [f"algo.mpt.mode={mode}", "algo.mpt.tau=0.9", f"data.seed={seed}", f"rollout.seed={seed}",
                         f"train.seed={seed}", f"train.output_dir={tmp_path / 'runs' / name}"]
        tags = {schema.TRIAL_TAG: name, schema.SWEEP_TAG: "choice_mpt_threshold", schema.ROLE_TAG: role,
                schema.SEED_TAG: str(seed)}
        ids[name] = Trainer(load_experiment(base, over), tracking_uri=uri, parent_run_id=parent, extra_tags=tags,
                            progress=False).run().run_id
    store = RunStore.open(uri)
    run = store.get(ids["search"])
    assert run is not None
    whole, sel, conf = (run.metrics[f"eval/{b}/avg_at_k"] for b in ("heldout", "heldout_select", "heldout_confirm"))
    assert whole == pytest.approx((sel + conf) / 2)              # 3 + 3 problems of the same evaluation
    ids_of = {b: sorted(store.per_problem(run.run_id, 2, b)) for b in ("heldout", "heldout_select", "heldout_confirm")}
    assert ids_of["heldout_select"] == ids_of["heldout"][:3] and ids_of["heldout_confirm"] == ids_of["heldout"][3:]

    spec, base_path, base_dict = load_sweep(root / "sweeps" / "choice" / "mpt_threshold.yaml")
    assert spec.metrics == ["eval/heldout_select/avg_at_k"]
    summary = sweep_summary.summarize(client, parent, spec, base_dict, base_path)
    assert summary["best"]["run_id"] == ids["search"]
    assert summary["best"]["objective"] == pytest.approx(sel)     # ranked on the selection part
    assert [(p["seed_offset"], p["run_id"], p["problems"]) for p in summary["per_seed"]] == \
        [(1, ids["rerun1"], 3), (2, ids["rerun2"], 3)]
    conf_of = {k: store.get(v).metrics["eval/heldout_confirm/avg_at_k"] for k, v in ids.items()}
    assert [p["diff"] for p in summary["per_seed"]] == pytest.approx(
        [conf_of["rerun1"] - conf_of["base1"], conf_of["rerun2"] - conf_of["base2"]])
    assert "confirmation problems" in summary["verdict"] and "judged on the other 3" in summary["not_covered"]

    h = _one(C.evaluate_claims(store), "headline")
    assert h.bench == C.CONFIRM and h.seeds == 2 and ids["search"] not in h.run_ids
    assert [(p["a_run"], p["b_run"]) for p in h.per_seed] == [(ids[f"rerun{s}"], ids[f"base{s}"]) for s in (1, 2)]
    assert [p["diff"] for p in h.per_seed] == pytest.approx([p["diff"] for p in summary["per_seed"]])
    assert h.t_low is None                                        # 2 re-run seeds: no t-interval
    # a random-init policy earns no reward in 2 steps: DMMPTs and masking off train the same model
    assert h.verdict == C.ARMS_IDENTICAL and all(p["diff"] == 0 for p in h.per_seed)
    assert sorted(C.run_value(store, store.get(ids["rerun1"]), C.M_HELDOUT, bench=C.CONFIRM).scores) == \
        sorted(store.per_problem(ids["rerun1"], 2, "heldout"))[3:]


def test_tables_cli_exports_then_recomputes_claims_from_the_files_alone(
        tmp_path: Path, empty_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ulorl.cli.tables import main

    st = Store(tmp_path, empty_db)
    _is_mode_runs(st, st.parent("choice_is_mode"), (0, 1, 2))
    res, out = tmp_path / "results", tmp_path / "out"
    assert main(["--tracking-uri", st.uri, "--export-results", str(res), "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)["export"]
    assert exported["choice_is_mode"]["runs"] == 9 and exported["choice_is_mode"]["written"]
    (tmp_path / "mlflow.db").unlink()                       # the store is gone: the files are enough
    docs = tmp_path / "claims_page.txt"
    docs.write_text(f"# page\n{C.DOCS_BEGIN}\nstale\n{C.DOCS_END}\ntail\n")
    assert main(["--results", str(res), "--out", str(out), "--docs", str(docs), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = {r["claim"]: r for r in summary["claims"]}
    assert rows["fig2_pois_vs_sais"]["seeds"] == 3 and rows["fig2_pois_vs_tois"]["level"] == 0.90
    assert (out / "claims.md").is_file() and (out / "fig2.png").is_file()
    page = docs.read_text()
    assert "stale" not in page and page.startswith("# page\n") and page.endswith(f"{C.DOCS_END}\ntail\n")
    assert "fig2_pois_vs_tois: POIS vs TOIS (S=1)" in page
    assert main(["--docs", str(docs)]) == 2
    assert main(["--results", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "results file or folder not found" in capsys.readouterr().err


def test_committed_results_files_reproduce_the_docs_and_readme_claims_tables() -> None:
    """platform/ulorl/docs/paper_claims.md's claims table and its reading, and the README's short table,
    are what the committed results files give (regenerate both with: ulorl-tables --results experiments/results
    --out paper_tables --docs platform/ulorl/docs/paper_claims.md --docs README.md)."""
    root = Path(__file__).resolve().parents[1]
    results = C.evaluate_claims(ResultsStore.open(root / "experiments" / "results"))
    for path, begin, end, make in (("platform/ulorl/docs/paper_claims.md", C.DOCS_BEGIN, C.DOCS_END, C.docs_table),
                                   ("platform/ulorl/docs/paper_claims.md", C.READING_BEGIN, C.READING_END,
                                    C.reading_markdown),
                                   ("platform/ulorl/docs/paper_claims.md", C.FINAL_COST_BEGIN, C.FINAL_COST_END,
                                    C.final_cost_markdown),
                                   ("README.md", C.SUMMARY_BEGIN, C.SUMMARY_END, C.summary_table)):
        page = (root / path).read_text()
        start, stop = page.index(begin) + len(begin) + 1, page.index(end)
        assert page[start:stop] == make(results), path
    assert any(r.seeds for r in results)          # the files hold paired runs, not only 'not run' rows
