"""Claims that cannot say more than the runs (ulorl.report.claims, ulorl.eval.paired): one test per rule,
hand-derived on tiny numbers and on real sqlite MLflow stores, and checked on the committed results files.

- a verdict needs the t-interval across >= 3 seeds with a spread; without it the row is inconclusive
  and says why;
- a no-difference row reports the smallest margin its design could establish (two one-sided tests,
  80 % power) and the seeds its own margin would need, not a difference-from-zero MDE;
- bit-identical arms say "arms identical";
- no row repeats or negates another on the same runs;
- a configuration a search selected is not judged without problems the search did not see."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from mlflow_store import migrated_empty_db
from test_claims import T95_2, Store, _headline_store, _one

from ulorl.eval import paired as P
from ulorl.report import claims as C
from ulorl.report.results import ResultsStore
from ulorl.report.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
T90_2 = 4 * math.sqrt(2) / 3           # t_{0.90, 2}: t / sqrt(2 + t^2) = 0.8 -> t^2 = 1.28 / 0.36
Z95, Z90 = 1.6448536269514722, 1.2815515655446004


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return migrated_empty_db(tmp_path_factory.mktemp("template"))


@pytest.fixture(scope="module")
def committed() -> list[C.ClaimResult]:
    return C.evaluate_claims(ResultsStore.open(ROOT / "experiments" / "results"))


def _fig4_sweep(st: Store, seeds: int, off: dict[str, float], static: list[dict[str, float]],
                entropy_off: list[float], entropy_static: list[list[float]]) -> None:
    parent = st.parent("choice_mpt_mode")
    for s in range(seeds):
        kw = {"sweep": "choice_mpt_mode", "parent": parent}
        st.run("fig4", {"algo.mpt.mode": "off"}, s, entropy=entropy_off, heldout={150: sum(off.values()) / len(off)},
               per_problem={150: off}, **kw)
        st.run("fig4", {"algo.mpt.mode": "static"}, s, entropy=entropy_static[s],
               heldout={150: sum(static[s].values()) / len(static[s])}, per_problem={150: static[s]}, **kw)


# ----------------------------------------------------------------------------- rule 1


def test_a_verdict_needs_a_t_interval_over_three_seeds_with_a_spread(tmp_path: Path, empty_db: Path) -> None:
    # the problem bootstrap alone, on 2 seeds: once "holds", now inconclusive and why
    word, why = P.judge(1, [(0.01, 0.07)], 2)
    assert C.verdict(1, [(0.01, 0.07)], 2) == word == C.INCONCLUSIVE
    assert "no t-interval across seeds" in why and "only 2 seed(s)" in why and "'holds'" in why
    assert C.verdict(-1, [(-0.3, -0.1)], 2) == C.INCONCLUSIVE
    # 3 seeds whose differences have no spread: the interval passed is not a t-interval
    assert C.verdict(1, [(0.01, 0.3)], 3, t_usable=False) == C.INCONCLUSIVE
    assert C.verdict(0, [(-0.01, 0.01)], 3, margin=0.05, t_usable=False) == C.INCONCLUSIVE
    assert C.verdict(1, [(0.01, 0.3)], 3, t_usable=True) == C.HOLDS     # with the t-interval among them
    # on a store: +0.5 on every problem and both seeds; the row says why it is not "holds"
    st = Store(tmp_path, empty_db)
    off = {f"p{i}": 0.25 for i in range(4)}
    _fig4_sweep(st, 2, off, [{p: 0.75 for p in off}] * 2, [0.2] * 12, [[0.3] * 12] * 2)
    r = _one(C.evaluate_claims(RunStore.open(st.uri)), "fig4_heldout")
    assert (r.seeds, r.problem_low, r.problem_high, r.t_low) == (2, 0.5, 0.5, None)
    assert r.verdict == C.INCONCLUSIVE and "no t-interval" in r.why
    assert "no t-interval across seeds" in C.docs_table([r]) and "no t-interval across seeds" in C.summary_table([r])
    assert any("cannot carry a verdict" in n for n in r.notes)


# ----------------------------------------------------------------------------- rule 2


def test_an_equivalence_row_reports_the_smallest_margin_its_design_could_establish(
        tmp_path: Path, empty_db: Path, committed: list[C.ClaimResult]) -> None:
    # seeds: sd 0.1, n 3 -> (t_0.95,2 + t_0.90,2) x 0.1 / sqrt(3); problems: sd sqrt(1/12), P 4
    assert P.t_quantile(0.90, 2) == pytest.approx(T90_2, rel=1e-9)
    assert P.equivalence_margin_seeds([0.1, 0.2, 0.3]) == pytest.approx((T95_2 + T90_2) * 0.1 / math.sqrt(3))
    assert P.equivalence_margin_problems([0.0, 0.5, 0.0, 0.5]) == pytest.approx((Z95 + Z90) * math.sqrt(1 / 12) / 2)
    assert P.equivalence_margin_seeds([0.1, 0.1, 0.1]) is None
    # the seeds a margin needs: the first n whose margin is inside it
    def margin_at(n: int, sd: float) -> float:
        return (P.t_quantile(0.95, n - 1) + P.t_quantile(0.90, n - 1)) * sd / math.sqrt(n)
    for sd, m in ((0.06, 0.05), (0.2, 0.05), (0.01, 0.05)):
        n = P.seeds_for_margin(sd, m)
        assert n is not None and margin_at(n, sd) <= m and (n == P.MIN_T_SEEDS or margin_at(n - 1, sd) > m)
    # Fig. 2's POIS ~ TOIS on the committed 8 seeds: 0.070, above its +-0.05; +-0.05 needs 14 seeds
    fig2 = _one(committed, "fig2_pois_vs_tois")
    diffs = [p["diff"] for p in fig2.per_seed]
    assert fig2.seeds == 8 and fig2.eq_margin == pytest.approx(P.equivalence_margin_seeds(diffs))
    assert round(fig2.eq_margin, 3) == 0.070 and fig2.seeds_for_margin == 14
    assert fig2.mde is None and fig2.mde_seeds is None and fig2.mde_problems is None
    row = next(line for line in C.docs_table([fig2]).splitlines() if line.startswith("| fig2"))
    assert "margin 0.070; +-0.05 needs ~14 seeds" in row
    # a directional row keeps its MDE and has no margin
    assert _one(committed, "fig2_pois_vs_sais").eq_margin is None and _one(committed, "fig2_pois_vs_sais").mde


# ----------------------------------------------------------------------------- rule 3


def test_bit_identical_arms_say_arms_identical(tmp_path: Path, empty_db: Path,
                                               committed: list[C.ClaimResult]) -> None:
    st = Store(tmp_path, empty_db)
    same = {f"p{i}": (i % 3) / 2 for i in range(4)}
    _fig4_sweep(st, 3, same, [same] * 3, [0.2, 0.19, 0.18] * 4, [[0.2, 0.19, 0.18] * 4] * 3)
    res = C.evaluate_claims(RunStore.open(st.uri))
    for name in ("fig4_heldout", "fig4_entropy"):
        r = _one(res, name)
        assert r.verdict == C.ARMS_IDENTICAL and r.mde is None and r.problem_low is None and r.effect == 0.0
        assert "bit-identical" in r.why and "MDE 0.000" not in C.claims_markdown([r])
    # the same held-out score from different training (entropy curves differ): an ordinary row
    (tmp_path / "b").mkdir()
    st2 = Store(tmp_path / "b", empty_db)
    _fig4_sweep(st2, 3, same, [same] * 3, [0.2] * 12, [[0.2 + 0.01 * s] * 12 for s in range(3)])
    assert _one(C.evaluate_claims(RunStore.open(st2.uri)), "fig4_heldout").verdict != C.ARMS_IDENTICAL
    # KL-Cov with POIS and one update per step is the masking-off update: the committed rows say so
    for name in ("ec_kl_cov_entropy", "ec_kl_cov_heldout"):
        assert _one(committed, name).verdict == C.ARMS_IDENTICAL and _one(committed, name).mde is None


# ----------------------------------------------------------------------------- rule 4


def test_no_row_is_another_row_negated(tmp_path: Path, empty_db: Path, committed: list[C.ClaimResult]) -> None:
    def sweep(st: Store, dyn_entropy: list[float]) -> list[C.ClaimResult]:
        parent = st.parent("choice_mpt_mode")
        for s, h in enumerate(dyn_entropy):
            kw = {"sweep": "choice_mpt_mode", "parent": parent}
            st.run("fig4", {"algo.mpt.mode": "off"}, s, entropy=[0.15 + 0.01 * s] * 10, **kw)
            st.run("fig5", {"algo.mpt.mode": "dynamic", "algo.mpt.sigma": 0.2}, s, entropy=[h] * 10, **kw)
        return C.evaluate_claims(RunStore.open(st.uri))

    # every run ends below sigma 0.2: |h - sigma| differences are the entropy differences negated
    res = sweep(Store(tmp_path, empty_db), [0.16, 0.19, 0.17])
    assert [r.claim for r in res if r.claim == "fig5_sigma_gap"] == []
    ent = _one(res, "fig5_entropy")
    assert [p["diff"] for p in ent.per_seed] == pytest.approx([0.01, 0.03, 0.0])
    assert any("fig5_sigma_gap" in n and "negated" in n and "below its sigma" in n for n in ent.notes)
    # one DMMPTs run ends above sigma: the gap is another quantity, both rows stay
    (tmp_path / "b").mkdir()
    res2 = sweep(Store(tmp_path / "b", empty_db), [0.16, 0.25, 0.17])
    gap = _one(res2, "fig5_sigma_gap")
    assert [p["diff"] for p in gap.per_seed] == pytest.approx([-0.01, 0.01, 0.0])   # entropy: +0.01, +0.09, 0
    # the committed Fig. 5 runs of the choice profile all end below sigma: no fig5_sigma_gap row for them;
    # the entropy regime's DMMPT runs end on both sides of its sigma 0.23, so its gap row stays (and, like
    # every committed row, mirrors no other)
    gap_sweeps = {r.sweep.split(" ")[0] for r in committed if r.claim == "fig5_sigma_gap"}
    assert not any(name.startswith("choice_") for name in gap_sweeps), gap_sweeps
    for i, r in enumerate(committed):
        assert all(C.mirror_of(r, e) is None for e in committed[:i]), r.claim


# ----------------------------------------------------------------------------- rule 5


def test_a_selected_configuration_without_a_split_is_refused(tmp_path: Path, empty_db: Path) -> None:
    st, _ = _headline_store(tmp_path, empty_db, with_confirm=False)
    h = _one(C.evaluate_claims(RunStore.open(st.uri)), "headline")
    # its re-run seeds beat the baseline on every held-out problem the search selected on (0.25-0.35):
    # no verdict, no effect, and the row says what is missing
    assert h.verdict == C.REFUSED and h.effect is None and h.t_low is None and h.problem_low is None
    assert "no selection / confirmation split" in h.why and "eval.final" in h.why
    assert "**refused** (no selection / confirmation split)" in C.summary_table([h])
    # with the split it is judged
    (tmp_path / "b").mkdir()
    st2, _ = _headline_store(tmp_path / "b", empty_db)
    assert _one(C.evaluate_claims(RunStore.open(st2.uri)), "headline").verdict != C.REFUSED
