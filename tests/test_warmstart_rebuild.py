"""``ulorl-bench warmstart-rebuild``: a from-scratch rebuild of the embedded warm start and an independent
held-out check.

Whether the shipped recipe still lands in the accuracy band is a measurement of tens of minutes (the
shipped build trained 46 min on 1 thread): the command's output, recorded in
platform/ulorl/docs/profiles.md. Here: the verdict by hand, and the command on a 2-step cut of the
recipe (a changed recipe that stops on its step guard, so not in band).
"""

from __future__ import annotations

import json

import pytest

from ulorl.bench.warmstart_rebuild import in_band, main
from ulorl.models.loading import embedded_model_dir, load_policy
from ulorl.models.warmstart import MANIFEST


def test_in_band_needs_the_target_and_the_check_in_band():
    assert in_band("target_reached", 0.41, (0.2, 0.8))
    assert in_band("target_reached", 0.2, (0.2, 0.8)) and in_band("target_reached", 0.8, (0.2, 0.8))
    assert not in_band("target_reached", 0.85, (0.2, 0.8)) and not in_band("target_reached", 0.1, (0.2, 0.8))
    assert not in_band("max_steps", 0.5, (0.2, 0.8))     # stopped by the step guard: the recipe did not work


@pytest.mark.slow  # 2 warm-start steps and two 4-prompt evaluations: ~15 s on an idle 2-core machine
def test_cut_rebuild_reports_its_numbers_beside_the_shipped_build(tmp_path, capfd):
    assert main(["--max-steps", "2", "--eval-n", "4", "--check-n", "4", "--threads", "1", "--workdir", str(tmp_path),
                 "--json"]) == 0
    out = capfd.readouterr().out
    assert out.count("\n") == 1
    res = json.loads(out)
    folder = tmp_path / "embedded"
    assert res["folder"] == str(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert res["rebuilt"] == {k: manifest[k] for k in res["rebuilt"]}
    assert res["rebuilt"]["status"] == "max_steps" and res["rebuilt"]["steps"] == 2 and res["rebuilt"]["threads"] == 1
    shipped = json.loads((embedded_model_dir() / MANIFEST).read_text())
    assert res["shipped"] == {k: shipped[k] for k in res["shipped"]} and shipped["status"] == "target_reached"
    assert res["same_recipe"] is False            # --max-steps enters the recipe's hash
    assert res["check"]["n"] == 4 and 0.0 <= res["check"]["acc"] <= 1.0
    assert res["in_band"] is False                # not stopped on its target
    model, _ = load_policy(str(folder))            # the rebuilt model loads as the trainer loads it
    assert model.config.vocab_size == json.loads((embedded_model_dir() / "config.json").read_text())["vocab_size"]
