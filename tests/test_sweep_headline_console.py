"""The headline sweep as ulorl-sweep prints it into a pipe: short, ending with the ranking, the speedup
against S = 1, the verdict and the spec's closing lines. Same spec as sweeps/mpt_threshold.yaml (same trials:
4 search, the baseline on 4 seeds, the best re-run on 3, the S = 1 reference), with its steps and sizes cut."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ulorl.sweep.launch import SweepRunner

ROOT = Path(__file__).resolve().parents[1]
HEADLINE = ROOT / "sweeps" / "mpt_threshold.yaml"
MAX_LINES = 60


def cut_headline(tmp_path: Path, steps: int = 6) -> Path:
    """sweeps/mpt_threshold.yaml with fewer, smaller steps (S = 4 keeps steps > 4 in its steady window)."""
    spec = yaml.safe_load(HEADLINE.read_text())
    spec["base"] = str((HEADLINE.parent / spec["base"]).resolve())
    spec["overrides"].update({"rollout.prompts_per_step": 4, "rollout.group_size": 4, "rollout.max_response_len": 128,
                              "eval.every": 3, "eval.num_problems": 8, "eval.select_problems": 4, "eval.k": 1,
                              "train.checkpoint_every": 3})
    spec["stop"] = {"steps": steps}
    path = tmp_path / "mpt_threshold.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_the_cut_sweep_keeps_the_headline_trials(tmp_path):
    cut = SweepRunner(cut_headline(tmp_path), tracking_uri=f"sqlite:///{tmp_path}/m.db", output_dir=tmp_path)
    full = SweepRunner(HEADLINE, tracking_uri=f"sqlite:///{tmp_path}/m.db", output_dir=tmp_path)
    assert cut.planned_trials() == full.planned_trials() == 12
    assert cut.spec.references == full.spec.references and cut.spec.baseline == full.spec.baseline


@pytest.mark.slow
def test_headline_sweep_piped_is_short_and_ends_with_ranking_speedup_and_verdict(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "ulorl.cli.sweep", str(cut_headline(tmp_path)), "--tracking-uri", uri,
           "--output-dir", str(tmp_path / "runs")]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=3000)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert len(lines) < MAX_LINES, res.stdout
    assert sum(": started (" in x for x in lines) == 12 and sum(": finished" in x for x in lines) == 12, res.stdout
    assert not any("Trial status" in x or "Checkpoint successfully created" in x for x in lines)
    ranking = next(i for i, x in enumerate(lines) if x.strip().startswith("sweep mpt_threshold: trials ranked by"))
    speedup = next(i for i, x in enumerate(lines) if x.startswith("speedup S=4 vs S=1 (compact batching"))
    epilogue = yaml.safe_load(HEADLINE.read_text())["epilogue"]
    assert lines[-len(epilogue):] == epilogue, lines[-4:]
    verdict = lines[-len(epilogue) - 1]
    assert ranking < speedup < len(lines) - len(epilogue) - 1
    assert re.search(r"time/step [\d.]+ s vs [\d.]+ s = [\d.]+x; trained samples/s [\d.]+ vs [\d.]+ = [\d.]+x",
                     lines[speedup]), lines[speedup]
    assert verdict.startswith("verdict: best trial ") and "REFUSED" not in verdict, lines[-4:]
    log = (tmp_path / "runs" / "sweeps" / "mpt_threshold" / "sweep.log").read_text()
    assert "Trial status" in log                             # Tune's tables went to the log, not the console
    c = MlflowClient(uri)
    parent = next(r for r in c.search_runs([c.get_experiment_by_name("ulorl").experiment_id],
                                           filter_string="tags.`ulorl.kind` = 'sweep'"))
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["sweep/speedup_s4_time_per_step"] > 0
