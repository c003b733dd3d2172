"""Does the warm-start recipe still rebuild the shipped embedded model? A from-scratch rebuild of the
default profile's warm start, then an independent held-out check, side by side with the shipped build.

    ulorl-bench warmstart-rebuild                  # the full recipe (the shipped build took 46 min, 1 thread)
    ulorl-bench warmstart-rebuild --json --workdir runs/warmstart_rebuild
    ulorl-bench warmstart-rebuild --max-steps 2 --eval-n 8 --check-n 8   # the plumbing in seconds

The rebuild is ``ulorl.models.warmstart.train_warmstart`` with the shipped recipe (``profile_config()``:
stop at held-out accuracy 0.35, checked every 50 steps on 128 prompts), into a fresh folder (no cache
is read or written). The independent check samples other held-out prompts (256, split seed 7) at the
rollout settings (temperature 0.85, top_p 1.0) with a looser length cap (3x the reference + 16
tokens); the rebuild lands in the band when it stopped on its target and that accuracy is within
``--band`` (default 0.2-0.8: a solver, imperfect). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from ulorl.jsonout import emit_json, json_command

CHECK_SEED = 7
CHECK_SLACK = 3.0
DEFAULT_BAND = (0.2, 0.8)


def in_band(status: str, check_acc: float, band: tuple[float, float]) -> bool:
    """The rebuild's verdict: it stopped on its accuracy target and the independent check is within ``band``."""
    return status == "target_reached" and band[0] <= check_acc <= band[1]


def rebuild(out: Path, threads: Optional[int] = None, max_steps: Optional[int] = None,
            eval_every: Optional[int] = None, eval_n: Optional[int] = None, check_n: int = 256,
            band: tuple[float, float] = DEFAULT_BAND) -> dict[str, Any]:
    """Rebuild the default warm start into ``out``, check it on ``check_n`` other held-out prompts."""
    from ulorl.data.task import make_split
    from ulorl.models.loading import embedded_model_dir, load_policy
    from ulorl.models.warmstart import MANIFEST, heldout_accuracy, profile_config, train_warmstart, with_overrides

    cfg = with_overrides(profile_config("default"), threads=threads, max_steps=max_steps, eval_every=eval_every,
                         eval_n=eval_n)
    manifest = train_warmstart(cfg, out)
    model, tok = load_policy(str(out))
    t0 = time.perf_counter()
    acc, _ = heldout_accuracy(model, tok, make_split("heldout", check_n, seed=CHECK_SEED), temperature=0.85,
                              top_p=1.0, seed=CHECK_SEED, slack=CHECK_SLACK)
    check_s = time.perf_counter() - t0
    shipped = json.loads((embedded_model_dir() / MANIFEST).read_text())
    keys = ("status", "steps", "final_acc", "train_s", "threads", "cache_key")
    return {"folder": str(out), "rebuilt": {k: manifest[k] for k in keys}, "shipped": {k: shipped.get(k) for k in keys},
            "same_recipe": manifest["cache_key"] == shipped.get("cache_key"),
            "check": {"n": check_n, "split_seed": CHECK_SEED, "slack": CHECK_SLACK, "acc": acc,
                      "seconds": round(check_s, 1)},
            "band": list(band), "in_band": in_band(manifest["status"], acc, band)}


def format_report(res: dict[str, Any]) -> str:
    c = res["check"]

    def row(name: str, b: dict[str, Any]) -> str:
        return (f"{name:8} {b['status']:>15} {b['steps']:>6} {b['final_acc']:>12.3f} {b['train_s']:>8.0f} "
                f"{b['threads']:>7}")

    recipe = "the shipped recipe" if res["same_recipe"] else "a changed recipe (config hash differs from the shipped)"
    return "\n".join([
        f"warm-start rebuild ({recipe}) in {res['folder']}",
        f"{'':8} {'status':>15} {'steps':>6} {'held-out acc':>12} {'train s':>8} {'threads':>7}",
        row("rebuilt", res["rebuilt"]),
        row("shipped", res["shipped"]),
        f"independent check: accuracy {c['acc']:.3f} on {c['n']} other held-out prompts (split seed {c['split_seed']}, "
        f"cap {c['slack']:g}x reference + 16 tokens, {c['seconds']:.0f} s)",
        f"verdict: {'in band' if res['in_band'] else 'NOT in band'} (stopped on target and check accuracy in "
        f"[{res['band'][0]}, {res['band'][1]}])",
    ])


def _band(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH (e.g. 0.2,0.8), got {text!r}") from None
    if not 0.0 <= lo <= hi <= 1.0:
        raise argparse.ArgumentTypeError(f"expected 0 <= LOW <= HIGH <= 1, got {text!r}")
    return lo, hi


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ulorl-bench warmstart-rebuild", description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, help="where the rebuilt model goes (default: a new temp folder)")
    ap.add_argument("--threads", type=_positive, help="torch threads of the rebuild (default: min(2, CPUs))")
    ap.add_argument("--max-steps", type=_positive, help="cut the recipe's step guard (3000), to try the command")
    ap.add_argument("--eval-every", type=_positive, help="the recipe's stopping check every N steps (50)")
    ap.add_argument("--eval-n", type=_positive, help="held-out prompts of the stopping check (128)")
    ap.add_argument("--check-n", type=_positive, default=256, help="held-out prompts of the independent check")
    ap.add_argument("--band", type=_band, default=DEFAULT_BAND, help="accuracy band of the check, LOW,HIGH")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of the table")
    return ap


@json_command
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ulorl-warmstart-rebuild-"))
    res = rebuild(workdir / "embedded", threads=args.threads, max_steps=args.max_steps, eval_every=args.eval_every,
                  eval_n=args.eval_n, check_n=args.check_n, band=args.band)
    if args.json:
        emit_json(res)
    else:
        print(format_report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
