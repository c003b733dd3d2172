"""``ulorl-sim`` — what does segment count S buy? (``ulorl.sim.simulator`` / ``studies``)

    ulorl-sim validate BENCH.json          fit on a bench's cost curve + S=1 rows, predict the rest
    ulorl-sim paper                        the paper's Table 1 setting (64k, 128 x 8, flat GPU cost)
    ulorl-sim plan --lognormal 7,0.8 --max-len 4096 --cost 20,0.05,0   which S should I use?

``--json`` on each prints exactly one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from ulorl.jsonout import emit_json, json_command
from ulorl.report import paper
from ulorl.sim import simulator as sim
from ulorl.sim import studies


class UsageError(ValueError):
    pass


# ----------------------------------------------------------------------------- parsing


def _floats(text: str, n: Optional[int], flag: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if n is not None and len(vals) != n:
        raise UsageError(f"{flag}: expected {n} comma-separated numbers, got {text!r}")
    return vals


def _ints(text: str, flag: str) -> list[int]:
    vals = _floats(text, None, flag)
    if any(v != int(v) or v < 1 for v in vals):
        raise UsageError(f"{flag}: expected positive integers, got {text!r}")
    return [int(v) for v in vals]


def _dist_from_args(args: argparse.Namespace) -> sim.LengthDist:
    given = [x for x in ("lengths", "lognormal", "mixture") if getattr(args, x, None)]
    if len(given) != 1:
        raise UsageError("give exactly one of --lengths FILE, --lognormal MU,SIGMA, --mixture W:MU:SIGMA,...")
    if args.lengths:
        try:
            return sim.load_lengths(args.lengths)
        except (FileNotFoundError, ValueError) as exc:
            raise UsageError(f"--lengths: {exc}") from None
    if args.lognormal:
        mu, sigma = _floats(args.lognormal, 2, "--lognormal")
        return sim.LogNormalLengths(mu, sigma, args.rho)
    comps = []
    for part in args.mixture.split(","):
        w = _floats(part.replace(":", ","), 3, "--mixture")
        comps.append((w[0], w[1], w[2]))
    try:
        return sim.MixtureLengths(tuple(comps), args.rho)
    except ValueError as exc:
        raise UsageError(f"--mixture: {exc}") from None


def _read_json(path: str, what: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{what} not found: {p}")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{p}: not valid JSON ({exc})") from None


def _progress(msg: str) -> None:
    print(f"[ulorl-sim] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- formatting


def _fmt(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return f"{v:.{nd}f}"
    return str(v)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:+.1f}%"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells)


def _print_validate(out: dict[str, Any]) -> None:
    f, s1 = out["cost_curve_fit"], out["s1_fit"]
    print("ulorl-sim validate: fit on the cost curve and the S=1 rows only, predict the others")
    print(f"cost curve fit ({f['points']} points): ms/iter = {f['a_ms']:.4g} + {f['b_ms']:.4g}*rows + "
          f"{f['c_ms']:.4g}*rows*context   (max |rel err| {100 * f['max_rel_err']:.1f}%)")
    src = "prefill curve" if s1.get("prefill_from") == "prefill_curve" else "in-run S=1 prefill share"
    curve_p = s1.get("prefill_curve_ms_per_token")
    print(f"S=1 fit ({'+'.join(s1['free'])}): decode scale {s1['decode_scale']:.3f}, overhead "
          f"{s1['overhead_ms']:.1f} ms/step, extra bucket {s1['bucket_iter_ms']:.3f} ms/iteration; prefill "
          f"{s1['prefill_ms_per_token']:.4g} ms/token (from the {src}"
          + ("" if curve_p is None else f"; the prefill curve says {curve_p:.4g}") + ")")
    print(f"engine model: {json.dumps(out['engine_traits'])}; prefill tokens counted by "
          f"{out.get('prefill_count', 'contexts')}")
    L = out["lengths"]
    print(f"lengths: {L['n']} observed ({L['groups'] or 'no'} groups), mean {L['mean']:.1f}, median {L['p50']:.0f}, "
          f"max {L['max']}")
    rows = []
    for r in out["rows"]:
        tag = "fit" if r["fitted_on"] else ""
        rows.append([r["segments"], r["regime"],
                     _fmt(r["step_time_s"]["predicted"], 3), _fmt(r["step_time_s"]["measured"], 3),
                     tag or _pct(r["step_time_s"]["rel_err"]),
                     _fmt(r["finished_per_s"]["predicted"], 2), _fmt(r["finished_per_s"]["measured"], 2),
                     tag or _pct(r["finished_per_s"]["rel_err"]),
                     "" if tag or r["finished_per_s"].get("err_in_se") is None
                     else f"{r['finished_per_s']['err_in_se']:+.1f}",
                     _fmt(r["ratio_vs_s1"]["predicted"], 2), _fmt(r["ratio_vs_s1"]["measured"], 2),
                     _fmt(r["decode_utilization"]["predicted"], 2), _fmt(r["decode_utilization"]["measured"], 2),
                     _fmt(r["iters_per_finished"]["predicted"], 2), _fmt(r["iters_per_finished"]["measured"], 2)])
    print(_table(["S", "regime", "step s pred", "meas", "err", "fin/s pred", "meas", "err", "err/se",
                  "ratio pred", "meas", "util pred", "meas", "it/fin pred", "meas"], rows))
    print("hardware-independent (scheduling model only):")
    rows2 = []
    for r in out["rows"]:
        rows2.append([r["segments"], r["regime"]] + [
            f"{_fmt(r[k]['predicted'], 1)} / {_fmt(r[k]['measured'], 1)}"
            for k in ("mean_rows", "mean_unfinished", "prefill_tokens_per_finished", "iters_per_finished")])
    print(_table(["S", "regime", "rows pred/meas", "unfinished pred/meas", "prefill tok/fin pred/meas",
                  "iters/fin pred/meas"], rows2))
    verdict = "PASS" if out["passed"] else "FAIL"
    print(f"max |error| over predicted rows (median step time, finished/s): {_pct(out['max_abs_rel_err'])} "
          f"-> {verdict} (tolerance {100 * out['tolerance']:.0f}%); finished/s alone: "
          f"{_pct(out['max_abs_rel_err_finished_per_s'])}"
          + ("" if out.get("max_abs_err_in_se") is None else
             f", at most {out['max_abs_err_in_se']:.1f} standard errors of the measurement"))


def _print_paper(out: dict[str, Any]) -> None:
    st, L, fo, fp = out["setting"], out["lengths"], out["fit"]["overhead"], out["fit"]["prefill"]
    print("ulorl-sim paper: Table 1 setting (Qwen3-30B-A3B, 64k outputs), flat-cost GPU regime")
    print(f"setting: max {st['max_len']} tokens, {st['prompts_per_step']} prompts x {st['group_size']}, static batch "
          f"(a decode iteration costs the same for any number of rows), prompt {st['prompt_len']} tokens, "
          f"{st['steps']} steady-state steps, seed {st['seed']}")
    print(f"lengths: lognormal mu {L['mu']:.3f} sigma {L['sigma']:.2f} (median {L['median']:.0f}), "
          f"within-group correlation {L['rho']:.2f}; P(L <= 32k) = {100 * L['frac_within_half']:.1f}%, "
          f"truncated at 64k = {100 * L['truncated_frac']:.1f}%")
    print(f"fit A (exact on S=1, S=2): decode {fo['a']:.3f} ms/iteration + {fo['o'] / 1000:.1f} s per step "
          "(training, weight sync, everything not decode)")
    print(f"fit B (exact on S=1, S=2): decode {fp['a']:.3f} ms/iteration + {fp['p'] * 1000:.2f} ms per 1k "
          "re-prefilled tokens, no per-step cost")
    rows = []
    for r in out["rows"]:
        rows.append([r["segments"], f"{r['decode_iters_per_step']:.0f}", f"{r['batch_rows_mean']:.0f}",
                     f"{100 * r['multi_segment_frac']:.0f}%", f"{r['reprefill_tokens_per_step'] / 1e6:.1f}M",
                     f"{r['predicted_step_s']:.1f}", f"{r['predicted_speedup']:.2f}x",
                     f"{r['predicted_step_s_prefill_fit']:.1f}", f"{r['predicted_speedup_prefill_fit']:.2f}x",
                     _fmt(r["paper_step_s"], 0), "-" if r["paper_speedup"] is None else f"{r['paper_speedup']:.2f}x",
                     "fit" if r["fitted_on"] else _pct(r["rel_err"])])
    print(_table(["S", "iters/step", "rows", "multi-seg", "prefill", "A s/step", "A speedup",
                  "B s/step", "B speedup", "paper s/step", "paper speedup", "A err"], rows))
    imp = out.get("implied_three_point")
    if imp:
        tps = "-" if imp["prefill_tok_per_s"] is None else f"{imp['prefill_tok_per_s'] / 1000:.0f}k tokens/s"
        print(f"attribution (uses S=4 too, not a prediction): all three paper points are met by "
              f"{imp['a_ms']:.2f} ms/iteration + {imp['o_ms'] / 1000:.1f} s/step + re-prefill at {tps}")
    row4 = next((r for r in out["rows"] if r["segments"] == 4), None)
    if row4 and row4["paper_step_s"]:
        print(f"S=4: fit A predicts {row4['predicted_step_s']:.0f} s ({row4['predicted_speedup']:.2f}x), fit B "
              f"{row4['predicted_step_s_prefill_fit']:.0f} s ({row4['predicted_speedup_prefill_fit']:.2f}x); "
              f"paper {row4['paper_step_s']:.0f} s ({row4['paper_speedup']:.2f}x)"
              + (" lies between them" if min(row4["predicted_step_s"], row4["predicted_step_s_prefill_fit"])
                 <= row4["paper_step_s"] <= max(row4["predicted_step_s"], row4["predicted_step_s_prefill_fit"])
                 else " lies outside both"))


def _print_plan(out: dict[str, Any]) -> None:
    st, c = out["setting"], out["cost_model"]
    print(f"ulorl-sim plan: max {st['max_len']} tokens, {st['prompts_per_step']} prompts x {st['group_size']}, "
          f"prompt {st['prompt_len']} tokens, context {st['context']}")
    print(f"cost: {c['a']:.4g} + {c['b']:.4g}*rows + {c['c']:.4g}*rows*context ms/iteration; prefill {c['p']:.4g} "
          f"ms/token; train {c['t']:.4g} ms/token; overhead {c['o']:.4g} ms/step; extra bucket {c['bk']:.4g} "
          "ms/iteration")
    print(f"lengths: {json.dumps(out['lengths'])}")
    rows = []
    for r in out["results"]:
        rows.append([r["regime"], r["segments"], _fmt(r["step_time_s"], 3), _fmt(r["finished_per_s"], 2),
                     _fmt(r["ratio_vs_s1"], 2) + "x", _fmt(r["decode_utilization"], 2),
                     _fmt(r["iters_per_finished"], 1), f"{r['batch_rows_mean']:.0f}",
                     f"{100 * r['prefill_frac']:.0f}%", f"{100 * r['multi_segment_frac']:.0f}%",
                     _fmt(r["staleness_mean"], 2)])
    print(_table(["regime", "S", "step s", "finished/s", "vs S=1", "util", "iters/fin", "rows", "prefill",
                  "multi-seg", "staleness"], rows))
    for reg, b in out["best"].items():
        extra = "" if b["smallest_within_near"] == b["segments"] else \
            f" (S={b['smallest_within_near']} is within {100 * st['near']:.0f}% with fewer off-policy tokens)"
        print(f"{reg}: best S={b['segments']} at {b['finished_per_s']:.3g} finished/s{extra}")
    rec = out["recommendation"]
    print(f"recommendation: S={rec['segments']} with {rec['regime']} batching")


# ----------------------------------------------------------------------------- commands


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ulorl-sim", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Examples:\n"
                                       "  ulorl-bench rollout --json > bench.json && ulorl-sim validate bench.json\n"
                                       "  ulorl-sim paper\n"
                                       "  ulorl-sim plan --lognormal 9.9,0.6 --max-len 65536 --cost 14,0,0 "
                                       "--overhead-ms 300000 --regime static")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser, steps: int) -> None:
        sp.add_argument("--steps", type=int, default=steps, help=f"steady-state steps simulated (default {steps})")
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    v = sub.add_parser("validate", help="fit on a bench's cost curve and S=1 rows; predict S=2,4,8 in both regimes")
    v.add_argument("bench", help="output of `ulorl-bench rollout --json`")
    v.add_argument("--context", choices=["padded", "row", "bucket"], default=None,
                   help="override the attention-context model (default: from the bench's engine: hf fast "
                        "path = bucket, hf fallback = padded, vllm = row)")
    v.add_argument("--tolerance", type=float, default=0.15)
    v.add_argument("--free", default=None,
                   help="terms fitted on the S=1 rows (after the cost curve): any two of scale (factor on the "
                        "curve), overhead (ms/step), bucket (ms per extra context bucket per iteration); "
                        "default scale,overhead: the static and compact S=1 rows separate them well, while at "
                        "S=1 the batch has about one context bucket, so bucket is ill-determined there")
    v.add_argument("--prefill-from", choices=["auto", "curve", "s1"], default="auto",
                   help="prefill ms/token: auto (default) = the bench's prefill microbenchmark (prefill_curve) "
                        "when present, else the in-run S=1 prefill share; curve / s1 force one. The S=1 share "
                        "is ill-conditioned: prefill is ~1-3%% of an S=1 step over ~2 tokens per finished "
                        "sample, so per-call costs get charged to tokens and then extrapolated to S=8")
    v.add_argument("--strict", action="store_true", help="exit 1 when the check fails")
    common(v, 400)

    pp = sub.add_parser("paper", help="Table 1: fit the flat GPU regime to S=1,2 (1240 s, 774 s), predict S=4, 8")
    pp.add_argument("--within-half", type=float, default=0.8, help="share of responses <= 32k tokens (default 0.8)")
    pp.add_argument("--sigma", type=float, default=0.6, help="log-length spread (default 0.6)")
    pp.add_argument("--rho", type=float, default=0.5, help="within-group correlation of log-lengths (default 0.5)")
    pp.add_argument("--lognormal", help="MU,SIGMA instead of --within-half/--sigma")
    pp.add_argument("--prompt-len", type=int, default=256)
    pp.add_argument("--segments", default="1,2,4,8")
    common(pp, 100)

    pl = sub.add_parser("plan", help="which S should I use for my lengths and hardware?")
    g = pl.add_argument_group("length distribution (exactly one)")
    g.add_argument("--lengths", help="JSON list / list of groups / JSONL of response lengths, or a bench JSON")
    g.add_argument("--lognormal", help="MU,SIGMA of log-length")
    g.add_argument("--mixture", help="W:MU:SIGMA,W:MU:SIGMA,... lognormal mixture (one component per prompt)")
    pl.add_argument("--rho", type=float, default=0.0, help="within-group correlation for parametric lengths")
    pl.add_argument("--max-len", type=int, required=True, help="global max response length")
    c = pl.add_argument_group("cost model (ms)")
    c.add_argument("--cost", help="A,B,C: ms per decode iteration = A + B*rows + C*rows*context")
    c.add_argument("--cost-curve", help="fit A,B,C on a cost curve JSON (bench output or list of points)")
    c.add_argument("--prefill-ms-per-token", type=float, default=0.0)
    c.add_argument("--train-ms-per-token", type=float, default=0.0)
    c.add_argument("--overhead-ms", type=float, default=0.0, help="fixed cost per step")
    c.add_argument("--bucket-ms", type=float, default=0.0,
                   help="cost of each extra context bucket per decode iteration (with --context bucket)")
    pl.add_argument("--prompts", type=int, default=128, help="new prompts per step (default 128)")
    pl.add_argument("--group", type=int, default=8, help="responses per prompt G (default 8)")
    pl.add_argument("--prompt-len", type=int, default=0)
    pl.add_argument("--regime", choices=["static", "compact", "both"], default="both")
    pl.add_argument("--context", choices=["padded", "row", "bucket"], default="padded",
                    help="attention context per row: padded batch, own (paged, vLLM) or bucketed (hf engine)")
    pl.add_argument("--share-prompt-prefill", action="store_true",
                    help="the G samples of a new prompt share one prefill (hf engine, vLLM prefix cache)")
    pl.add_argument("--share-min-tokens", type=int, default=None,
                    help="hf engine prefix-forest prefill (its share_min_tokens, 64): with --lengths from a "
                         "bench JSON that has group_prefix, count prefill tokens exactly as the engine does")
    pl.add_argument("--compact-min-frac", type=float, default=0.0,
                    help="compact regime: drop finished rows once this share is done (hf engine: 0.125)")
    pl.add_argument("--segments", default=None, help="candidates, default 1,2,4,8,16 (those <= max-len)")
    pl.add_argument("--near", type=float, default=0.05, help="also name the smallest S within this share of the best")
    common(pl, 300)
    return p


def _cmd_validate(args: argparse.Namespace) -> dict[str, Any]:
    bench = _read_json(args.bench, "bench file")
    if not isinstance(bench, dict):
        raise UsageError(f"{args.bench}: expected a JSON object (ulorl-bench rollout --json output)")
    try:
        free = None if args.free is None else [f.strip() for f in args.free.split(",") if f.strip()]
        return studies.run_validate(bench, context=args.context, steps=args.steps, seed=args.seed,
                                tolerance=args.tolerance, free=free, prefill_from=args.prefill_from,
                                progress=_progress)
    except ValueError as exc:
        raise UsageError(f"{args.bench}: {exc}") from None


def _cmd_paper(args: argparse.Namespace) -> dict[str, Any]:
    if args.lognormal:
        mu, sigma = _floats(args.lognormal, 2, "--lognormal")
        dist: sim.LengthDist = sim.LogNormalLengths(mu, sigma, args.rho)
    else:
        if not 0 < args.within_half < 1:
            raise UsageError(f"--within-half must be in (0, 1), got {args.within_half}")
        dist = studies.paper_lengths(args.within_half, args.sigma, args.rho)
    return studies.run_paper(paper.table1_by_segments(), dist, segments=_ints(args.segments, "--segments"),
                             prompt_len=args.prompt_len, steps=args.steps, seed=args.seed, progress=_progress)


def _cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    dist = _dist_from_args(args)
    if bool(args.cost) == bool(args.cost_curve):
        raise UsageError("give exactly one of --cost A,B,C or --cost-curve FILE")
    if args.cost:
        a, b, cc = _floats(args.cost, 3, "--cost")
        decode = sim.CostModel(a, b, cc)
    else:
        data = _read_json(args.cost_curve, "cost curve file")
        points = data.get("cost_curve") if isinstance(data, dict) else data
        if not isinstance(points, list):
            raise UsageError(f"{args.cost_curve}: expected a list of points or an object with 'cost_curve'")
        try:
            decode, _ = sim.fit_cost_curve(points)
        except ValueError as exc:
            raise UsageError(f"{args.cost_curve}: {exc}") from None
    cost = sim.CostModel(decode.a, decode.b, decode.c, args.prefill_ms_per_token, args.train_ms_per_token,
                         args.overhead_ms, args.bucket_ms)
    if args.segments:
        segs = _ints(args.segments, "--segments")
    else:
        segs = [s for s in (1, 2, 4, 8, 16) if s <= args.max_len]
    regimes = ["static", "compact"] if args.regime == "both" else [args.regime]
    try:
        return studies.run_plan(dist, cost, max_len=args.max_len, prompts_per_step=args.prompts, group_size=args.group,
                            segments=segs, regimes=regimes, prompt_len=args.prompt_len, context=args.context,
                            steps=args.steps, seed=args.seed, near=args.near,
                            share_prompt_prefill=args.share_prompt_prefill, compact_min_frac=args.compact_min_frac,
                            share_min_tokens=args.share_min_tokens, progress=_progress)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "steps", 1) < 1:
        print("ulorl-sim: --steps must be >= 1", file=sys.stderr)
        return 2
    try:
        out = {"validate": _cmd_validate, "paper": _cmd_paper, "plan": _cmd_plan}[args.command](args)
    except UsageError as exc:
        print(f"ulorl-sim {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        emit_json(out, default=float)
    else:
        {"validate": _print_validate, "paper": _print_paper, "plan": _print_plan}[args.command](out)
    if args.command == "validate" and args.strict and not out["passed"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
