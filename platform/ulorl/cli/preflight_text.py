"""The dry-run's preflight text (``ulorl.scale.preflight`` with the plan's trainer estimate), and the
docs table of every paper profile on both paper cards::

    python -m ulorl.cli.preflight_text experiments/paper/*.yaml      # markdown table, 80 and 141 GiB
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from ulorl.cli.plan import architecture_of, trainer_memory
from ulorl.config import ExperimentConfig, load_experiment
from ulorl.model_shapes import model_shape
from ulorl.scale.preflight import Check, preflight, preflight_summary, preflight_table


def trainer_peak_fn(cfg: ExperimentConfig) -> Optional[Callable[[ExperimentConfig], float]]:
    """The plan's ``trainer_peak_per_gpu`` (GiB) as a function of the config, or None without an architecture."""
    arch = architecture_of(cfg.model.name_or_path)
    if arch is None or not (arch.hidden and arch.vocab):
        return None
    return lambda c: float(trainer_memory(c, arch)["trainer_peak_per_gpu"])


def preflight_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The ``preflight`` entry of the dry-run for ``cfg``."""
    return preflight_summary(cfg, model_shape(cfg.model.name_or_path), trainer_peak_fn(cfg))


def describe_preflight(cfg: ExperimentConfig) -> str:
    """What ``ulorl-train EXP.yaml --dry-run`` prints after the plan."""
    return "# preflight\n" + json.dumps(preflight_dict(cfg), indent=2)


def preflight_line(cfg: ExperimentConfig) -> str:
    """One line per sweep trial: whether it passes on its card and each failing check's fix."""
    out = preflight_dict(cfg)
    if "checks" not in out:
        return f"preflight: {out['note']}"
    failing = [f"{c['name']}: {c['fix']}" for c in out["checks"] if not c["ok"]]
    verdict = "passes" if not failing else "FAILS (" + "; ".join(failing) + ")"
    return f"preflight on {out['card_gib']:g} GiB: {verdict}"


def profile_checks(path: str, gpu_memory_gib: float) -> list[Check]:
    cfg = load_experiment(path, [])
    return preflight(cfg, model_shape(cfg.model.name_or_path), gpu_memory_gib, trainer_peak_fn(cfg))


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ulorl.cli.preflight_text",
                                description="preflight table of experiment profiles on 80 and 141 GiB cards")
    p.add_argument("experiments", nargs="+")
    p.add_argument("--cards", default="80,141", help="comma-separated card sizes in GiB")
    args = p.parse_args(argv)
    cards = [float(c) for c in args.cards.split(",")]
    rows = [(Path(e).stem, card, profile_checks(e, card)) for e in args.experiments for card in cards]
    print(preflight_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
