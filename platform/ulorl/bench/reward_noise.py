"""``ulorl-bench reward-noise``: what the verifier's measured errors cost a training run.

    ulorl-bench reward-noise --rates rows.jsonl                    # rates from `ulorl-bench verifier --out`
    ulorl-bench reward-noise --fn 0.05 --fp 0.002 --seeds 0,1 --json
    ulorl-bench reward-noise --rates rows.jsonl --extraction boxed_or_final --form all --scale 2 \\
        experiments/quickstart.yaml train.max_steps=10 eval.every=10

Paired runs on the embedded task, one pair per seed (data order, sampling and the trainer seeded
alike): a *clean* arm scored by the verifier as it is, and a *noisy* arm whose training rewards get
the verifier's measured errors drawn on top (``ulorl.reward.noise``: a right answer scored 0 with
its answer form's false-negative rate, a wrong one scored 1 with the false-positive rate; truncated
responses keep their 0). Evaluation is never noisy: both arms' held-out avg@k use the verifier as is.
Reported per pair and over pairs: the held-out avg@k of each arm at the last evaluation and the
difference (noisy - clean), and the advantage signal of the noisy arm's released groups -- groups
whose clean rewards differ (kept by dynamic sampling) but whose noisy rewards are all equal (``lost``:
dropped because of the noise), and the reverse (``spurious``). ``--form all`` applies the pooled FN
rate to every answer (the embedded task's answers are all integers, whose own rate is the
``integer`` one: ``--form integer``, the default ``auto`` reads each reference's form).
Progress goes to stderr; runs log to a SQLite MLflow store under ``--workdir``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from ulorl.data.jsonl import DataError, read_json_objects
from ulorl.jsonout import emit_json, json_command
from ulorl.reward.noise import ErrorRates, add_signal, answer_form, group_signal, inject, rates_from_rows

DEFAULT_EXPERIMENT = "experiments/quickstart.yaml"
HELDOUT_METRIC = "eval/heldout/avg_at_k"


class NoisyScorer:
    """The trainer's scorer with a verifier's errors drawn on the training rewards (``score_samples``);
    every other call -- evaluation's ``score``, ``stats``, ``close`` -- goes to the real scorer.
    Keeps each scored sample's clean reward (``clean``, by sample id) for ``group_signal``."""

    def __init__(self, inner: Any, rates: ErrorRates, seed: int, form: str = "auto") -> None:
        self.inner = inner
        self.rates = rates
        self.form = form
        self.rng = random.Random(seed)
        self.clean: dict[int, float] = {}

    def score_samples(self, samples: list[Any], tokenizer: Any) -> list[float]:
        from ulorl.rollout.types import SampleStatus

        clean = self.inner.score_samples(samples, tokenizer)
        forms = [answer_form(s.answer) if self.form == "auto" else self.form for s in samples]
        noisy = inject(clean, forms, self.rates, self.rng, [s.status is not SampleStatus.TRUNCATED for s in samples])
        for s, c in zip(samples, clean):
            self.clean[s.sample_id] = float(c)
        return noisy

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_arm(experiment: str, overrides: list[str], seed: int, rates: ErrorRates, form: str, uri: str,
            run_dir: Path) -> dict[str, Any]:
    """One seeded run with ``rates`` injected into its training rewards: held-out avg@k and signal."""
    from ulorl.config import load_experiment
    from ulorl.train.trainer import Trainer

    cfg = load_experiment(experiment, [*overrides, f"tracking.uri={uri}", f"data.seed={seed}",
                                       f"rollout.seed={seed}", f"train.seed={seed}"])
    t0 = time.perf_counter()
    trainer = Trainer(cfg, run_dir=run_dir, progress=False)
    trainer.setup()
    noisy = NoisyScorer(trainer.scorer, rates, seed=seed * 7919 + 17, form=form)
    trainer.scorer = noisy  # type: ignore[assignment]  # the same calls, training rewards noisy
    signal: dict[str, int] = {}
    held: dict[int, float] = {}
    status = "FAILED"
    try:
        while trainer.step < cfg.train.max_steps:
            step = trainer.train_step()
            for group in step.rollout.groups:
                clean = [noisy.clean.get(s.sample_id, 0.0) for s in group]
                signal = add_signal(signal, group_signal(clean, [float(s.reward or 0.0) for s in group],
                                                         [s.group_id for s in group]))
            if HELDOUT_METRIC in step.metrics and trainer.last_eval:
                held[trainer.step] = float(step.metrics[HELDOUT_METRIC])
        status = "FINISHED"
    finally:
        trainer.close(status)
    if not held:
        raise RuntimeError(f"{experiment}: no {HELDOUT_METRIC} logged (eval.every must be > 0)")
    return {"seed": seed, "run_id": trainer.run_id, "steps": trainer.step,
            "seconds": round(time.perf_counter() - t0, 1), "heldout_final": held[max(held)], "heldout": held,
            "signal": signal}


def measure(experiment: str, overrides: list[str], seeds: list[int], rates: ErrorRates, form: str,
            workdir: Path) -> dict[str, Any]:
    """Clean and noisy arm per seed; the pairs and their summary."""
    uri = f"sqlite:///{workdir.resolve()}/mlflow.db"
    zero = ErrorRates({"all": 0.0}, 0.0)
    pairs = []
    for seed in seeds:
        arms = {}
        for arm, r in (("clean", zero), ("noisy", rates)):
            print(f"[reward-noise] seed {seed}: {arm} arm", file=sys.stderr, flush=True)
            arms[arm] = run_arm(experiment, overrides, seed, r, form, uri, workdir / f"seed{seed}_{arm}")
        sig = arms["noisy"]["signal"]
        pairs.append({"seed": seed, "clean": arms["clean"], "noisy": arms["noisy"],
                      "heldout_diff": arms["noisy"]["heldout_final"] - arms["clean"]["heldout_final"],
                      "lost_share": sig.get("lost", 0) / sig["mixed_clean"] if sig.get("mixed_clean") else None})
        p = pairs[-1]
        print(f"[reward-noise] seed {seed}: held-out clean {p['clean']['heldout_final']:.3f}, noisy "
              f"{p['noisy']['heldout_final']:.3f}; groups lost {sig.get('lost', 0)}/{sig.get('mixed_clean', 0)}",
              file=sys.stderr, flush=True)
    total: dict[str, int] = {}
    for p in pairs:
        total = add_signal(total, p["noisy"]["signal"])
    diffs = [p["heldout_diff"] for p in pairs]
    return {
        "experiment": experiment, "overrides": overrides, "seeds": seeds, "form": form, "tracking_uri": uri,
        "rates": {"fn": rates.fn, "fp": rates.fp, "counts": rates.counts}, "pairs": pairs,
        "mean_heldout_clean": statistics.fmean(p["clean"]["heldout_final"] for p in pairs),
        "mean_heldout_noisy": statistics.fmean(p["noisy"]["heldout_final"] for p in pairs),
        "mean_heldout_diff": statistics.fmean(diffs),
        "sd_heldout_diff": statistics.stdev(diffs) if len(diffs) > 1 else None,
        "signal_noisy_arm": total,
        "lost_share": total.get("lost", 0) / total["mixed_clean"] if total.get("mixed_clean") else None,
        "spurious_share": total.get("spurious", 0) / total["groups"] if total.get("groups") else None,
    }


def format_report(res: dict[str, Any]) -> str:
    r = res["rates"]
    fn = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["fn"].items()))
    lines = [f"reward noise on {res['experiment']} {' '.join(res['overrides'])} (form {res['form']})".rstrip(),
             f"injected rates: FN {fn}; FP {r['fp']:.4f}",
             f"{'seed':>4} {'clean':>7} {'noisy':>7} {'diff':>7} {'groups':>6} {'mixed':>6} {'lost':>5} {'spur':>5}"]
    for p in res["pairs"]:
        s = p["noisy"]["signal"]
        lines.append(f"{p['seed']:>4} {p['clean']['heldout_final']:>7.3f} {p['noisy']['heldout_final']:>7.3f} "
                     f"{p['heldout_diff']:>+7.3f} {s.get('groups', 0):>6} {s.get('mixed_clean', 0):>6} "
                     f"{s.get('lost', 0):>5} {s.get('spurious', 0):>5}")
    sd = res["sd_heldout_diff"]
    lines.append(f"held-out avg@k: clean {res['mean_heldout_clean']:.3f}, noisy {res['mean_heldout_noisy']:.3f}, "
                 f"difference {res['mean_heldout_diff']:+.3f}"
                 + (f" (sd over pairs {sd:.3f})" if sd is not None else ""))
    ls = res["lost_share"]
    lines.append("noisy arm: " + (f"{100 * ls:.1f} % of the groups with a clean signal lost it" if ls is not None
                                  else "no group had a clean signal"))
    return "\n".join(lines)


def load_rates(paths: list[str], extraction: Optional[str], with_box: bool = False) -> ErrorRates:
    """Error rates of ``ulorl-bench verifier --out`` rows (one extraction mode when the rows hold several;
    ``with_box``: only rows whose response has a box, the verifier's own misreads rather than a format miss)."""
    rows = []
    for path in paths:
        try:
            objects = read_json_objects(path)
        except DataError as exc:
            raise ValueError(f"--rates {exc}") from None
        for n, row in objects:
            if not {"answer", "label", "score"} <= set(row):
                raise ValueError(f"--rates {path}:{n}: needs answer, label and score (`ulorl-bench verifier --out`)")
            if (extraction is None or row.get("extraction", extraction) == extraction) and (
                    not with_box or row.get("has_box", True)):
                rows.append(row)
    if not rows:
        what = f" of extraction {extraction}" if extraction else ""
        raise ValueError(f"--rates {', '.join(paths)}: no rows{what}")
    return rates_from_rows(rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ulorl-bench reward-noise", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", nargs="?", default=DEFAULT_EXPERIMENT, help="experiment YAML (embedded task)")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides")
    p.add_argument("--rates", default=None,
                   help="comma-separated `ulorl-bench verifier --out` files to read rates from")
    p.add_argument("--extraction", default="boxed", help="the extraction mode of the rows to read (default boxed)")
    p.add_argument("--with-box", action="store_true",
                   help="read rates only from rows whose response has a box (misreads, not missing boxes)")
    p.add_argument("--fn", type=float, default=None, help="false-negative rate for every form (overrides --rates)")
    p.add_argument("--fp", type=float, default=None, help="false-positive rate (overrides --rates)")
    p.add_argument("--form", default="auto", help="answer form whose FN rate applies: auto (each reference's) | all | "
                   "integer | ...")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every rate (a dose of the same profile)")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds: one clean / noisy pair each")
    p.add_argument("--workdir", default=None, help="runs and the MLflow store (default: a temporary folder)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        if not seeds:
            raise ValueError("--seeds: empty list")
        if args.rates:
            rates = load_rates([x for x in args.rates.split(",") if x.strip()], args.extraction, args.with_box)
        elif args.fn is None and args.fp is None:
            raise ValueError("give --rates ROWS.jsonl (from `ulorl-bench verifier --out`) or --fn / --fp")
        else:
            rates = ErrorRates({"all": 0.0}, 0.0)
        if args.fn is not None or args.fp is not None:
            rates = ErrorRates({"all": args.fn} if args.fn is not None else rates.fn,
                               args.fp if args.fp is not None else rates.fp, rates.counts)
        if not all(0.0 <= v <= 1.0 for v in [*rates.fn.values(), rates.fp]) or args.scale < 0:
            raise ValueError("--fn / --fp must be in [0, 1] and --scale >= 0")
        rates = rates.scaled(args.scale)
    except ValueError as exc:
        print(f"ulorl-bench reward-noise: error: {exc}", file=sys.stderr)
        return 2
    if args.workdir:
        workdir = Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        res = measure(args.experiment, args.overrides, seeds, rates, args.form, workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="ulorl-reward-noise-") as tmp:
            res = measure(args.experiment, args.overrides, seeds, rates, args.form, Path(tmp))
    if args.json:
        emit_json(res, default=str)
    else:
        print(format_report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
