"""The three questions ``ulorl-sim`` answers, on top of ``ulorl.sim.simulator``.

* ``run_validate(bench)`` — check (a): fit the cost model on a ``ulorl-bench rollout --json``
  output's cost curve and S = 1 rows only, predict every other (S, regime) row;
* ``run_paper()`` — check (b): the paper's Table 1 setting (64k, 128 x 8) in the flat-cost GPU
  regime, fitted exactly to S = 1 and S = 2 (1240 s, 774 s), predicting S = 4 (paper: 601 s);
* ``run_plan(dist, cost, ...)`` — which S gives the most finished samples per second.

Each returns plain JSON-able data; ``synthetic_bench`` makes a bench-shaped object from the
simulator itself (tests, docs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, Literal, Optional, Protocol

import numpy as np

from ulorl.sim.simulator import (
    ContextMode,
    CostModel,
    EmpiricalLengths,
    LengthDist,
    LogNormalLengths,
    RolloutSetup,
    SimResult,
    SimTrace,
    add_ratios,
    evaluate,
    fit_cost_curve,
    fit_prefill_curve,
    fit_s1,
    fit_two_points,
    parse_lengths,
    simulate,
)

__all__ = ["BENCH_CONFIG_KEYS", "bench_setup", "paper_lengths", "run_paper", "run_plan", "run_validate",
           "synthetic_bench"]

PAPER_MAX_LEN = 65536
PAPER_PROMPTS, PAPER_GROUP = 128, 8


def _progress(msg: str, progress: Optional[Any]) -> None:
    if progress is not None:
        progress(msg)


def bench_setup(config: dict[str, Any], segments: int, regime: str,
                context: Optional[ContextMode] = None) -> RolloutSetup:
    """``RolloutSetup`` from a bench ``config`` object (``BENCH_CONFIG_KEYS``).

    Engine traits default to the engine the bench names: hf fast path (``engine_backend: fast``)
    = bucketed contexts, prefix-forest prefill with ``share_min_tokens`` 64 (counted exactly when
    the bench recorded ``group_prefix``; else shared prompt prefill), compaction at 1/8 of rows
    done; hf fallback = one padded cache, no sharing; vllm = per-row contexts, shared prefix,
    immediate compaction. Config keys ``context_mode``, ``share_prompt_prefill``,
    ``share_min_tokens``, ``compact_min_frac``, ``max_buckets`` and ``bucket_overhead`` override
    them, and ``context`` overrides ``context_mode``.
    """
    def need(*names: str) -> Any:
        for n in names:
            if config.get(n) is not None:
                return config[n]
        raise ValueError(f"BENCH.json config lacks {names[0]!r}")
    engine = str(config.get("engine") or "hf")
    backend = str(config.get("engine_backend") or "fast")
    if engine == "vllm":
        traits: dict[str, Any] = {"context": "row", "share_prompt_prefill": True, "compact_min_frac": 0.0,
                                  "share_min_tokens": None}
    elif backend == "fast":
        traits = {"context": "bucket", "share_prompt_prefill": True, "compact_min_frac": 0.125,
                  "share_min_tokens": 64}
    else:
        traits = {"context": "padded", "share_prompt_prefill": False, "compact_min_frac": 0.125,
                  "share_min_tokens": None}
    for key, cfg_key in (("context", "context_mode"), ("share_prompt_prefill", "share_prompt_prefill"),
                         ("compact_min_frac", "compact_min_frac")):
        if config.get(cfg_key) is not None:
            traits[key] = config[cfg_key]
    if "share_min_tokens" in config:            # null = no prefix forest
        traits["share_min_tokens"] = None if config["share_min_tokens"] is None else int(config["share_min_tokens"])
    if context is not None:
        traits["context"] = context
    return RolloutSetup(
        max_len=int(need("max_response_len", "max_len")),
        segments=segments,
        prompts_per_step=int(need("prompts_per_step", "prompts")),
        group_size=int(need("group_size", "group")),
        regime=regime,  # type: ignore[arg-type]
        prompt_len=int(round(float(config.get("prompt_len_mean") or 0))),
        prompt_lens=tuple(int(x) for x in config["prompt_lengths"]) if config.get("prompt_lengths") else None,
        min_ready_groups=int(config.get("min_ready_groups") or 1),
        max_buckets=int(config.get("max_buckets") or 4),
        bucket_overhead=float(config.get("bucket_overhead") or 256.0),
        **traits,
    )


BENCH_CONFIG_KEYS = ("max_response_len", "prompts_per_step", "group_size", "prompt_len_mean", "prompt_lengths",
                     "engine",
                     "engine_backend", "min_ready_groups", "context_mode", "share_prompt_prefill",
                     "compact_min_frac", "max_buckets", "bucket_overhead", "share_min_tokens")


DEFAULT_FREE = ("scale", "overhead")


def run_validate(bench: dict[str, Any], *, context: Optional[ContextMode] = None, steps: int = 400, seed: int = 0,
                 tolerance: float = 0.15, free: Optional[Sequence[str]] = None,
                 prefill_from: Literal["auto", "s1", "curve"] = "auto",
                 progress: Optional[Any] = None) -> dict[str, Any]:
    """Check (a): fit on the cost curve and the S = 1 rows only, predict every other row.

    Prefill cost per token (``prefill_from``): ``auto`` (default) = the bench's prefill
    microbenchmark (``prefill_curve``, fitted as ``ms = call + p * tokens``) whenever the bench has
    one, else the in-run S = 1 prefill share; ``curve`` / ``s1`` force one. Why the curve: at
    S = 1 prefill is only ~1-3 % of a step and ~2 tokens per finished sample, and the engine's
    measured prefill time includes per-call costs (cache allocation, bucket planning, first
    sampling), so ``prefill share x step time / tokens`` charges those fixed costs to tokens —
    an ill-conditioned estimate that is then extrapolated ~30x to S = 8, where re-prefill is ~40 %
    of the step. The curve measures several sizes and separates the per-call intercept.

    ``free``: terms ``fit_s1`` calibrates on the S = 1 rows (one per regime); default
    ``DEFAULT_FREE`` = ``scale`` (factor on the isolated cost curve: in-run memory / cache effects)
    + ``overhead`` (ms per step: scheduler bookkeeping, the prefill call's intercept, sampling
    setup) — the two terms that the static and compact S = 1 rows separate well, since their
    decode costs differ ~4x while per-step costs are alike. ``bucket`` (ms per extra context
    bucket per iteration) is an option: at S = 1 all contexts are short new prompts, the batch has
    about one bucket, so its column is nearly empty there and its fit is ill-determined.

    A row's error is also given in units of the bench's standard error of finished/s
    (``finished_per_s_se``) where present.
    """
    for key in ("results", "cost_curve", "config"):
        if key not in bench:
            raise ValueError(f"BENCH.json lacks {key!r}")
    dist = parse_lengths(bench, "BENCH.json")
    decode, curve_fit = fit_cost_curve(bench["cost_curve"])
    measured: dict[tuple[int, str], dict[str, float]] = {}
    for i, result in enumerate(bench["results"]):
        try:
            measured[(int(result["segments"]), str(result["regime"]))] = result
        except KeyError as exc:
            raise ValueError(f"BENCH.json results[{i}] lacks {exc.args[0]!r}") from None
    s1 = {reg: m for (s, reg), m in measured.items() if s == 1}
    if not s1:
        raise ValueError("BENCH.json results have no segments=1 row to fit on")
    traces: dict[tuple[int, str], SimTrace] = {}
    setups = {k: bench_setup(bench["config"], k[0], k[1], context) for k in sorted(measured)}
    for (s, reg), setup in setups.items():
        _progress(f"simulating S={s} {reg} ({steps} steps)", progress)
        traces[(s, reg)] = simulate(setup, dist, steps=steps, seed=seed)
    p_curve, prefill_fit = None, None
    if bench.get("prefill_curve"):
        p_curve, prefill_fit = fit_prefill_curve(bench["prefill_curve"])
    if prefill_from not in ("auto", "s1", "curve"):
        raise ValueError(f"prefill_from must be 'auto', 's1' or 'curve', got {prefill_from!r}")
    if prefill_from == "curve" and p_curve is None:
        raise ValueError("prefill_from='curve' but BENCH.json has no 'prefill_curve'")
    s1_prefill = sum(float(traces[(1, reg)].features[:, 3].sum()) for reg in s1)
    s1_frac = any((m.get("prefill_frac") or 0) > 0 for m in s1.values())
    if prefill_from == "s1":
        use_curve = p_curve is not None and not (s1_prefill > 0 and s1_frac)   # s1 impossible: curve
    else:
        use_curve = p_curve is not None
    if free is None:
        free = DEFAULT_FREE
    cost, s1_fit = fit_s1(decode, {reg: traces[(1, reg)] for reg in s1}, s1, free=free,
                          prefill_ms_per_token=p_curve if use_curve else None)
    s1_fit["prefill_from"] = "prefill_curve" if use_curve else "s1_prefill_frac"
    s1_fit["prefill_curve_ms_per_token"] = p_curve
    preds = [evaluate(traces[k], cost) for k in sorted(measured)]
    add_ratios(preds)
    rows = []
    for p in preds:
        m = measured[(p.segments, p.regime)]
        row: dict[str, Any] = {"segments": p.segments, "regime": p.regime, "fitted_on": p.segments == 1}
        for name, pv in (("step_time_s", p.step_time_median_s), ("finished_per_s", p.finished_per_s),
                         ("ratio_vs_s1", p.ratio_vs_s1), ("decode_utilization", p.decode_utilization),
                         ("iters_per_finished", p.iters_per_finished), ("prefill_frac", p.prefill_frac),
                         ("tokens_per_s", p.tokens_per_s), ("mean_rows", p.batch_rows_mean),
                         ("mean_unfinished", p.unfinished_mean),
                         ("prefill_tokens_per_finished", p.prefill_tokens_per_finished)):
            mv = m.get(name)
            err = None if (mv in (None, 0) or pv is None) else (pv - float(mv)) / float(mv)
            row[name] = {"predicted": pv, "measured": mv, "rel_err": err}
        se = m.get("finished_per_s_se")
        row["finished_per_s"]["se"] = se
        row["finished_per_s"]["err_in_se"] = (None if not se or row["finished_per_s"]["rel_err"] is None
                                              else (p.finished_per_s - float(m["finished_per_s"])) / float(se))
        rows.append(row)
    checked = [r for r in rows if not r["fitted_on"]]
    errs = [abs(r[k]["rel_err"]) for r in checked for k in ("finished_per_s", "step_time_s")
            if r[k]["rel_err"] is not None]
    max_err = max(errs) if errs else None
    fps_errs = [abs(r["finished_per_s"]["rel_err"]) for r in checked if r["finished_per_s"]["rel_err"] is not None]
    in_se = [abs(r["finished_per_s"]["err_in_se"]) for r in checked if r["finished_per_s"]["err_in_se"] is not None]
    return {
        "command": "validate",
        "cost_curve_fit": {"a_ms": decode.a, "b_ms": decode.b, "c_ms": decode.c, **curve_fit},
        "s1_fit": s1_fit,
        "prefill_curve_fit": prefill_fit,
        "cost_model": asdict(cost),
        "engine_traits": {k: getattr(setups[min(setups)], k) for k in (
            "context", "share_prompt_prefill", "share_min_tokens", "compact_min_frac", "max_buckets",
            "bucket_overhead", "prompt_len")},
        "prefill_count": ("prefix forest (bench group_prefix, share_min_tokens "
                          f"{setups[min(setups)].share_min_tokens})"
                          if dist.has_prefix_structure and setups[min(setups)].share_min_tokens is not None
                          and setups[min(setups)].context != "padded" else "contexts (no prefix data)"),
        "lengths": dist.describe(),
        "steps": steps,
        "seed": seed,
        "rows": rows,
        "tolerance": tolerance,
        "max_abs_rel_err": max_err,
        "max_abs_rel_err_finished_per_s": max(fps_errs) if fps_errs else None,
        "max_abs_err_in_se": max(in_se) if in_se else None,
        "passed": bool(max_err is not None and max_err <= tolerance),
    }


def paper_lengths(within_half: float = 0.8, sigma: float = 0.6, rho: float = 0.5,
                  max_len: int = PAPER_MAX_LEN) -> LogNormalLengths:
    """Lognormal with ``within_half`` of responses at most ``max_len / 2`` tokens."""
    return LogNormalLengths.with_quantile(max_len / 2, within_half, sigma, rho)


class PaperRow(Protocol):
    """A row of the paper's Table 1 (``ulorl.report.paper.Table1Row``): what the fit reads of it."""

    @property
    def time_per_step_s(self) -> float: ...
    @property
    def speedup(self) -> float: ...


def run_paper(paper: Mapping[int, PaperRow], dist: Optional[LengthDist] = None, *,
              segments: Sequence[int] = (1, 2, 4, 8), prompt_len: int = 256, steps: int = 100, seed: int = 0,
              progress: Optional[Any] = None) -> dict[str, Any]:
    """Check (b): flat-cost static regime fitted exactly to the paper's S = 1 and S = 2 step times.

    ``paper``: the paper's Table 1 rows by segment count (``ulorl.report.paper.table1_by_segments()``);
    S = 1 and 2 are required, S = 4 adds the attribution."""
    segs = sorted(set(segments) | {1, 2})
    dist = dist or paper_lengths()
    traces = {}
    for s in segs:
        _progress(f"simulating S={s} (128 x 8, 64k, {steps} steps)", progress)
        traces[s] = simulate(RolloutSetup(PAPER_MAX_LEN, s, PAPER_PROMPTS, PAPER_GROUP, "static",
                                          prompt_len=prompt_len, context="row"), dist, steps=steps, seed=seed)
    t1, t2 = paper[1].time_per_step_s, paper[2].time_per_step_s
    fits = {
        "overhead": fit_two_points(traces[1], traces[2], t1, t2, second="overhead"),
        "prefill": fit_two_points(traces[1], traces[2], t1, t2, second="prefill"),
    }
    implied = None
    if 4 in paper and 4 in traces:      # all three points, (a, p, o): not a prediction, an attribution
        X = np.array([traces[s].features.mean(0)[[0, 3, 5]] for s in (1, 2, 4)])
        y = np.array([paper[s].time_per_step_s * 1000.0 for s in (1, 2, 4)])
        sol = np.linalg.solve(X, y)
        implied = {"a_ms": float(sol[0]), "p_ms_per_token": float(sol[1]), "o_ms": float(sol[2]),
                   "prefill_tok_per_s": float(1000.0 / sol[1]) if sol[1] > 0 else None}
    out_rows = []
    for s in segs:
        res = {name: evaluate(traces[s], cm) for name, cm in fits.items()}
        main = res["overhead"]
        row: dict[str, Any] = {
            "segments": s,
            "decode_iters_per_step": main.decode_iters_per_step,
            "batch_rows_mean": main.batch_rows_mean,
            "unfinished_mean": main.unfinished_mean,
            "multi_segment_frac": main.multi_segment_frac,
            "staleness_mean": main.staleness_mean,
            "reprefill_tokens_per_step": float(traces[s].features[:, 3].mean()),
            "predicted_step_s": main.step_time_s,
            "predicted_speedup": t1 / main.step_time_s,
            "predicted_step_s_prefill_fit": res["prefill"].step_time_s,
            "predicted_speedup_prefill_fit": t1 / res["prefill"].step_time_s,
            "paper_step_s": paper[s].time_per_step_s if s in paper else None,
            "paper_speedup": paper[s].speedup if s in paper else None,
            "fitted_on": s in (1, 2),
        }
        row["rel_err"] = None if row["paper_step_s"] is None else \
            (row["predicted_step_s"] - row["paper_step_s"]) / row["paper_step_s"]
        out_rows.append(row)
    first = traces[1]
    return {
        "command": "paper",
        "setting": {"max_len": PAPER_MAX_LEN, "prompts_per_step": PAPER_PROMPTS, "group_size": PAPER_GROUP,
                    "regime": "static", "context": "row", "prompt_len": prompt_len, "steps": steps, "seed": seed},
        "lengths": {**dist.describe(), "frac_within_half": dist.frac_within(PAPER_MAX_LEN / 2),
                    "truncated_frac": float(first.truncated.sum() / first.completed.sum())},
        "fit": {"overhead": asdict(fits["overhead"]), "prefill": asdict(fits["prefill"])},
        "implied_three_point": implied,
        "rows": out_rows,
    }


def run_plan(dist: LengthDist, cost: CostModel, *, max_len: int, prompts_per_step: int, group_size: int,
             segments: Sequence[int], regimes: Sequence[str] = ("static", "compact"), prompt_len: int = 0,
             context: ContextMode = "padded", steps: int = 300, seed: int = 0, near: float = 0.05,
             share_prompt_prefill: bool = False, compact_min_frac: float = 0.0,
             share_min_tokens: Optional[int] = None, progress: Optional[Any] = None) -> dict[str, Any]:
    """Which S maximises finished samples per second, per regime (and the smallest S within
    ``near`` of the best, since more segments mean more off-policy tokens)."""
    results: list[SimResult] = []
    for reg in regimes:
        for s in segments:
            if s > max_len:
                raise ValueError(f"segments {s} > max_len {max_len}")
            _progress(f"simulating S={s} {reg} ({steps} steps)", progress)
            setup = RolloutSetup(max_len, s, prompts_per_step, group_size, reg, prompt_len, context,  # type: ignore[arg-type]
                                 share_prompt_prefill=share_prompt_prefill, compact_min_frac=compact_min_frac,
                                 share_min_tokens=share_min_tokens)
            results.append(evaluate(simulate(setup, dist, steps=steps, seed=seed), cost))
    add_ratios(results)
    best: dict[str, Any] = {}
    for reg in regimes:
        rs = [r for r in results if r.regime == reg]
        top = max(rs, key=lambda r: r.finished_per_s)
        close = min((r for r in rs if r.finished_per_s >= (1 - near) * top.finished_per_s), key=lambda r: r.segments)
        best[reg] = {"segments": top.segments, "finished_per_s": top.finished_per_s,
                     "smallest_within_near": close.segments}
    overall = max(results, key=lambda r: r.finished_per_s)
    return {
        "command": "plan",
        "setting": {"max_len": max_len, "prompts_per_step": prompts_per_step, "group_size": group_size,
                    "prompt_len": prompt_len, "context": context, "share_prompt_prefill": share_prompt_prefill,
                    "compact_min_frac": compact_min_frac, "share_min_tokens": share_min_tokens,
                    "steps": steps, "seed": seed, "near": near},
        "lengths": dist.describe(),
        "cost_model": asdict(cost),
        "results": [r.to_dict() for r in results],
        "best": best,
        "recommendation": {"regime": overall.regime, "segments": overall.segments,
                           "finished_per_s": overall.finished_per_s},
    }


def synthetic_bench(cost: CostModel, dist: LengthDist, *, max_len: int, prompts_per_step: int, group_size: int,
                    prompt_len: int = 0, segments: Sequence[int] = (1, 2, 4, 8), context: ContextMode = "padded",
                    share_prompt_prefill: bool = False, compact_min_frac: float = 0.0,
                    prompt_lens: Optional[Sequence[int]] = None, share_min_tokens: Optional[int] = None,
                    steps: int = 300, seed: int = 1, n_lengths: int = 2000) -> dict[str, Any]:
    """A ``ulorl-bench rollout --json``-shaped object generated by the simulator itself (tests,
    docs): a cost curve from ``cost`` on a rows x context grid, and simulated results. The
    ``group_lengths`` it reports are ``n_lengths`` draws from ``dist`` — or, for an empirical
    ``dist`` with groups, exactly its groups (then ``run_validate`` with the same seed and steps
    reproduces the truth exactly); an empirical ``dist`` with prefix structure is also written
    as ``group_prefix`` / ``prefix_prompts``."""
    rng = np.random.default_rng(seed)
    curve = [{"rows": r, "context": c, "ms_per_iter": cost.iter_ms(r, c)}
             for r in (1, 8, 32, 64, 128, 256) for c in (64, max_len // 2, max_len + prompt_len)]
    results = []
    for reg in ("static", "compact"):
        for s in segments:
            setup = RolloutSetup(max_len, s, prompts_per_step, group_size, reg, prompt_len, context,
                                 share_prompt_prefill=share_prompt_prefill, compact_min_frac=compact_min_frac,
                                 prompt_lens=tuple(prompt_lens) if prompt_lens else None,
                                 share_min_tokens=share_min_tokens)
            tr = simulate(setup, dist, steps=steps, seed=seed)
            results.append(evaluate(tr, cost))
    add_ratios(results)
    if isinstance(dist, EmpiricalLengths) and dist.groups:
        groups = np.minimum(np.asarray(dist.groups, dtype=np.int64), max_len)   # the truth itself
    else:
        groups = np.minimum(dist.sample(rng, max(1, n_lengths // group_size), group_size), max_len)
    prefix: dict[str, Any] = {}
    if isinstance(dist, EmpiricalLengths) and dist.has_prefix_structure:
        prefix = {"prefix_prompts": [list(p) for p in dist.prompts or ()],
                  "group_prefix": [{"prompt": pi, "lengths": list(g), "lcp": list(c)} for pi, g, c in
                                   zip(dist.group_prompt or (), dist.groups or (), dist.group_lcps or ())]}
    return {
        **prefix,
        "config": {"max_response_len": max_len, "prompts_per_step": prompts_per_step, "group_size": group_size,
                   "prompt_len_mean": prompt_len, "segments": list(segments), "regimes": ["static", "compact"],
                   "engine": "simulator", "context_mode": context, "share_prompt_prefill": share_prompt_prefill,
                   "share_min_tokens": share_min_tokens,
                   "compact_min_frac": compact_min_frac, "prompt_lengths": list(prompt_lens or [])},
        "results": [{"segments": r.segments, "regime": r.regime, "step_time_s": r.step_time_median_s,
                     "finished_per_s": r.finished_per_s, "tokens_per_s": r.tokens_per_s,
                     "decode_utilization": r.decode_utilization, "prefill_frac": r.prefill_frac,
                     "iters_per_finished": r.iters_per_finished, "ratio_vs_s1": r.ratio_vs_s1,
                     "mean_rows": r.batch_rows_mean, "mean_unfinished": r.unfinished_mean,
                     "prefill_tokens_per_finished": r.prefill_tokens_per_finished}
                    for r in results],
        "cost_curve": curve,
        "prefill_curve": [{"tokens": n, "ms": cost.p * n} for n in (256, 4096, 65536)],
        "group_lengths": groups.tolist(),
        "lengths": groups.reshape(-1).tolist(),
    }
