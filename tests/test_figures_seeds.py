"""Figures 2 / 4 / 5 with an arm run on several seeds: faint per-seed curves, the mean across
seeds and its min-max band (real sqlite MLflow store, real matplotlib artists)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from ulorl.report.figures import SEED_ALPHA, build_figures, draw_seed_group, seed_band, seed_groups
from ulorl.report.store import RunStore
from ulorl.tracking import artifact_root_for, schema

HINTS = {"fig2": "H2", "fig4": "H4", "fig5": "H5"}


def test_seed_band_on_the_steps_every_seed_has() -> None:
    steps, mean, low, high = seed_band([([1, 2, 3], [1.0, 2.0, 3.0]), ([2, 3], [4.0, 5.0])])
    assert steps == [2, 3] and mean == [3.0, 4.0] and low == [2.0, 3.0] and high == [4.0, 5.0]
    assert seed_band([]) == ([], [], [], [])


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("ulorl", artifact_location=artifact_root_for(uri))
    ts = int(time.time() * 1000)

    def run(mode: str, seed: int, entropy: list[float], name: str) -> None:
        tags = {schema.KIND_TAG: "train", schema.PAPER_REF_TAG: "fig4"}
        rid = client.create_run(exp, run_name=name, tags=tags).info.run_id
        params = {"algo.mpt.mode": mode, "train.seed": seed, "rollout.seed": seed, "data.seed": seed,
                  "model.name_or_path": "embedded:choice"}
        client.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()],
                         metrics=[Metric("train/entropy", v, ts, st) for st, v in enumerate(entropy, start=1)])
        client.set_terminated(rid)

    for seed, ent in enumerate(([0.3, 0.2, 0.1], [0.3, 0.25, 0.2], [0.3, 0.15, 0.0])):
        run("off", seed, ent, f"off{seed}")
    for seed, ent in enumerate(([0.3, 0.4], [0.3, 0.6])):
        run("static", seed, ent, f"static{seed}")
    run("static", 1, [0.3, 0.9], "static1-again")   # same seeds as static1: not a third seed
    return RunStore.open(uri)


def test_seeds_of_one_arm_share_it_and_other_runs_stay_apart(store: RunStore) -> None:
    fig4 = {f.key: f for f in build_figures(store, HINTS)}["fig4"]
    groups = {g.arm: len(g.lines) for g in seed_groups(fig4.lines)}
    assert groups["baseline (no masking)"] == 3
    # static1 and static1-again have the same seeds: named apart, never averaged as seeds
    assert {"static MPT masking [static1]": 1, "static MPT masking [static1-again]": 1}.items() <= groups.items()
    assert len({ln.label for ln in fig4.lines}) == len(fig4.lines)   # per-run labels stay unique
    rec = [c for c in fig4.cell_records() if "mean of 3 seeds" in c["row"]]
    (r,) = rec
    assert r["row"] == "model embedded:choice / baseline (no masking) (mean of 3 seeds)"
    assert float(r["value"]) == pytest.approx(0.1) and len(r["run_ids"].split(";")) == 3
    assert "min 0, max 0.2" in r["note"]


def test_seed_curves_faint_mean_bold_band_shaded(store: RunStore) -> None:
    fig4 = {f.key: f for f in build_figures(store, HINTS)}["fig4"]
    (group,) = [g for g in seed_groups(fig4.lines) if len(g.lines) == 3]
    ax = Figure().add_subplot(1, 1, 1)
    draw_seed_group(ax, group, "train/entropy", 1, "C0", "-")
    faint = [ln for ln in ax.get_lines() if ln.get_alpha() == SEED_ALPHA]
    bold = [ln for ln in ax.get_lines() if ln.get_alpha() is None]
    assert len(faint) == 3 and len(bold) == 1
    assert list(bold[0].get_ydata()) == pytest.approx([0.3, 0.2, 0.1])
    assert bold[0].get_label() == "baseline (no masking): mean of 3 seeds"
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    ys = band.get_paths()[0].vertices[:, 1]
    assert min(ys) == pytest.approx(0.0) and max(ys) == pytest.approx(0.3)


def test_saved_figure_with_seed_groups(store: RunStore, tmp_path: Path) -> None:
    fig4 = {f.key: f for f in build_figures(store, HINTS)}["fig4"]
    fig4.save(tmp_path / "fig4.png")
    assert (tmp_path / "fig4.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_per_run_labels_name_the_seed_once(store: RunStore) -> None:
    fig4 = {f.key: f for f in build_figures(store, HINTS)}["fig4"]
    off = sorted(ln.label for ln in fig4.lines if ln.arm == "baseline (no masking)")
    assert off == [f"baseline (no masking) (seed={s})" for s in range(3)]
