"""The entropy-control claims (report/claims.py, rows ec_*) on a real MLflow store written like the sweep
sweeps/choice/entropy_controls.yaml writes it: six arms on two seeds in one sweep parent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow_store import StoreBase, migrated_empty_db

from ulorl.report import claims as C
from ulorl.report.store import RunStore
from ulorl.tracking import schema

SWEEP = "choice_entropy_controls"
# arm -> (algo.mpt.mode, algo.entropy_control.mode, final entropy, held-out avg@k) per seed offset
ARMS = {
    "off": ("off", "off", (0.10, 0.12), (0.50, 0.52)),
    "static": ("static", "off", (0.40, 0.44), (0.55, 0.57)),
    "dmmpt": ("dynamic", "off", (0.20, 0.21), (0.60, 0.64)),
    "clip_cov": ("off", "clip_cov", (0.15, 0.19), (0.53, 0.56)),
    "kl_cov": ("off", "kl_cov", (0.10, 0.13), (0.49, 0.52)),
    "hem": ("off", "high_entropy_minority", (0.30, 0.35), (0.40, 0.44)),
}


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return migrated_empty_db(tmp_path_factory.mktemp("template"))


def _write(tmp_path: Path, empty_db: Path) -> tuple[RunStore, dict[tuple[str, int], str]]:
    st = StoreBase(tmp_path, empty_db)
    parent = st.client.create_run(st.exp, run_name=SWEEP, tags={schema.KIND_TAG: "sweep"}).info.run_id
    ids = {}
    for arm, (mpt, ec, entropy, heldout) in ARMS.items():
        for seed in (0, 1):
            tags = {schema.KIND_TAG: "train", schema.PAPER_REF_TAG: "entropy_controls", schema.SWEEP_TAG: SWEEP,
                    schema.PARENT_TAG: parent, schema.ROLE_TAG: "search", schema.VARIANT_TAG: arm}
            rid = st.client.create_run(st.exp, run_name=f"{arm}-{seed}", tags=tags).info.run_id
            params = {"data.seed": seed, "rollout.seed": seed, "train.seed": seed, "algo.mpt.mode": mpt,
                      "algo.mpt.sigma": 0.2, "algo.entropy_control.mode": ec}
            ts = int(time.time() * 1000)
            st.client.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()], metrics=[
                *(Metric("train/entropy", entropy[seed], ts, s) for s in range(1, 11)),
                Metric(C.HELDOUT, heldout[seed], ts, 10)])
            st.client.set_terminated(rid, status="FINISHED")
            ids[(arm, seed)] = rid
    return RunStore.open(st.uri), ids


def test_each_comparator_is_paired_with_off_and_with_dmmpts(tmp_path, empty_db):
    store, ids = _write(tmp_path, empty_db)
    results = {r.claim: r for r in C.evaluate_claims(store) if r.claim.startswith("ec_")}
    assert len(results) == 9 and all(r.seeds == 2 for r in results.values())
    clip_h = results["ec_clip_cov_heldout"]
    assert clip_h.per_seed[0]["a_run"] == ids[("clip_cov", 0)] and clip_h.per_seed[0]["b_run"] == ids[("off", 0)]
    assert clip_h.effect == pytest.approx(((0.53 - 0.50) + (0.56 - 0.52)) / 2)
    assert results["ec_kl_cov_entropy"].effect == pytest.approx(0.005)
    assert results["ec_high_entropy_minority_entropy"].effect == pytest.approx(0.215)
    dm = results["ec_dmmpt_vs_high_entropy_minority_heldout"]
    assert {p["a_run"] for p in dm.per_seed} == {ids[("dmmpt", 0)], ids[("dmmpt", 1)]}
    # 2 seeds and no per-problem scores in these runs: no interval is allowed, so no verdict either way
    assert dm.effect == pytest.approx(0.20) and dm.verdict == C.FEW_SEEDS
    # the "off" arm is the run with both keys off: no comparator run replaced it
    assert not any("replaced" in n for r in results.values() for n in r.notes)


def test_the_paper_claims_do_not_read_the_comparator_runs(tmp_path, empty_db):
    store, _ = _write(tmp_path, empty_db)
    paper = [r for r in C.evaluate_claims(store) if r.claim.startswith(("fig4", "fig5"))]
    assert paper and all(r.verdict == C.NOT_RUN for r in paper)
