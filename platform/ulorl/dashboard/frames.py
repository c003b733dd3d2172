"""Pure pandas transforms behind the dashboard pages (no I/O, no Streamlit).

Input frames come from :mod:`ulorl.dashboard.store`: ``runs`` (one row per run, with
``params.<key>``, ``metrics.<key>``, ``best.<key>`` columns) and long metric histories
(run_id, metric, step, value, timestamp).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import numpy as np
import pandas as pd

from ulorl.dashboard.store import BEST_METRICS, unique_labels
from ulorl.report import speed
from ulorl.sweep.ranking import common_scores, paired_bootstrap
from ulorl.tracking import schema

_EVAL_KEY = re.compile(r"^metrics\.eval/([^/]+)/avg_at_k$")

FINAL_METRICS: tuple[str, ...] = (
    "train/reward_mean", "train/entropy", "train/masked_frac", schema.eval_metric("heldout", "avg_at_k"),
)


def labels_of(runs: pd.DataFrame) -> dict[str, str]:
    """run_id -> unique display label (the ``label`` column of ``load_runs``, else computed)."""
    if runs.empty:
        return {}
    if "label" in runs:
        return dict(zip(runs["run_id"], runs["label"]))
    return dict(zip(runs["run_id"], unique_labels(list(runs["run_id"]), list(runs["run_name"]))))


def label_series(runs: pd.DataFrame) -> pd.Series:
    labels = labels_of(runs)
    return runs["run_id"].map(labels) if not runs.empty else pd.Series(dtype=object)


def param_col(key: str) -> str:
    return f"params.{key}"


def coerce(series: pd.Series) -> pd.Series:
    """Strings as logged by MLflow -> numbers when every non-null value parses, else unchanged."""
    num = pd.to_numeric(series, errors="coerce")
    if num.notna().sum() == series.notna().sum() and series.notna().any():
        return num
    return series


def short_metric(key: str) -> str:
    """``train/reward_mean`` -> ``reward_mean``; ``eval/heldout/avg_at_k`` -> ``heldout avg@k``."""
    parts = key.split("/")
    if parts[0] == "eval" and len(parts) == 3:
        return f"{parts[1]} {parts[2].replace('_at_', '@')}"
    return parts[-1]


def runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Display table of the runs page: identity, status, key params, final and best metrics.

    Key params get short names (``segments``, ``max_len``, ``tau`` ...); final metrics are named
    ``final <metric>`` and best ones ``best <metric>``. ``run_id`` stays as the last column.
    """
    if runs.empty:
        return pd.DataFrame(columns=["run", "kind", "status", "run_id"])
    out = pd.DataFrame({
        "run": label_series(runs),
        "kind": runs["kind"],
        "status": runs["status"],
        "experiment": runs["experiment"],
        "sweep": runs.get("sweep"),
        "parent": runs.get("parent"),
        "config": runs.get("config"),
    })
    for key in schema.KEY_PARAMS:
        col = param_col(key)
        out[schema.PARAM_LABELS.get(key, key)] = coerce(runs[col]) if col in runs else None
    out["steps"] = runs.get("steps")
    for key in FINAL_METRICS:
        col = f"metrics.{key}"
        if col in runs:
            out[f"final {short_metric(key)}"] = runs[col]
    for key in BEST_METRICS:
        col = f"best.{key}"
        if col in runs:
            out[f"best {short_metric(key)}"] = runs[col]
    out["duration_s"] = runs.get("duration_s")
    out["start_time"] = runs.get("start_time")
    out["run_id"] = runs["run_id"]
    return out.reset_index(drop=True)


def filter_runs(
    runs: pd.DataFrame,
    experiments: Optional[Sequence[str]] = None,
    kinds: Optional[Sequence[str]] = None,
    statuses: Optional[Sequence[str]] = None,
    param: Optional[str] = None,
    param_values: Optional[Sequence[str]] = None,
    text: str = "",
) -> pd.DataFrame:
    """Rows matching every given filter. Empty / None filters match everything.

    ``param_values`` compare against the param's logged string; ``text`` is a case-insensitive
    substring of the run name, run id, sweep or config.
    """
    mask = pd.Series(True, index=runs.index)
    if experiments:
        mask &= runs["experiment"].isin(experiments)
    if kinds:
        mask &= runs["kind"].isin(kinds)
    if statuses:
        mask &= runs["status"].isin(statuses)
    if param and param_values:
        col = param_col(param)
        mask &= runs[col].astype("string").isin([str(v) for v in param_values]) if col in runs else False
    if text:
        needle = text.lower()
        hay = pd.Series("", index=runs.index)
        for col in ("run_name", "run_id", "sweep", "config"):
            if col in runs:
                hay = hay + " " + runs[col].fillna("").astype(str).str.lower()
        mask &= hay.str.contains(needle, regex=False)
    return runs[mask]


def param_keys(runs: pd.DataFrame) -> list[str]:
    """Param keys present in ``runs``: the schema's key params first, then the rest sorted."""
    present = [c[len("params."):] for c in runs.columns if c.startswith("params.")]
    first = [k for k in schema.KEY_PARAMS if k in present]
    return first + sorted(k for k in present if k not in first)


# Params that differ between runs without being hyperparameters.
NOT_HYPERPARAMS: frozenset[str] = frozenset({"tracking.run_name", "tracking.uri", "train.output_dir", "name"})


def varying_params(runs: pd.DataFrame) -> list[str]:
    """Hyperparameter keys with more than one distinct value across ``runs``."""
    return [k for k in param_keys(runs) if k not in NOT_HYPERPARAMS
            and runs[param_col(k)].astype("string").nunique(dropna=True) > 1]


# ----------------------------------------------------------------------------- curves


def ema(values: Sequence[float], weight: float) -> np.ndarray:
    """Exponential moving average ``s_t = w * s_{t-1} + (1 - w) * x_t`` with ``s_0 = x_0``.

    ``values`` [T] -> [T]. ``weight`` in [0, 1): 0 returns the input. NaNs are carried over
    without updating the average.
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    x = np.asarray(values, dtype=float)
    out = np.empty_like(x)
    last = np.nan
    for i, v in enumerate(x):
        if np.isnan(v):
            out[i] = last
            continue
        last = v if np.isnan(last) else weight * last + (1.0 - weight) * v
        out[i] = last
    return out


def curve_frame(
    hist: pd.DataFrame,
    runs: pd.DataFrame,
    x: str = "step",
    smoothing: float = 0.0,
    wall: Optional[pd.DataFrame] = None,
) -> pd.DataFrame:
    """Per-run curve of one metric, ready to plot.

    ``hist``: one metric's long history (run_id, step, value, timestamp). ``x``: ``"step"`` or
    ``"wall"`` (seconds since the run started: the ``time/wall_s`` value at that step from
    ``wall`` when given, else the metric timestamp minus the run's start time).
    Returns run_id, run (the run's unique short label, for legends), name (its full run name, for
    hover), step, x, raw, value (value = EMA-smoothed raw, per run).
    """
    cols = ["run_id", "run", "name", "step", "x", "raw", "value"]
    if hist.empty:
        return pd.DataFrame(columns=cols)
    names = labels_of(runs)
    full = dict(zip(runs["run_id"], runs["run_name"])) if "run_name" in runs else {}
    starts = dict(zip(runs["run_id"], runs["start_time"])) if "start_time" in runs else {}
    parts = []
    for run_id, h in hist.groupby("run_id", sort=False):
        h = h.sort_values("step", kind="stable").drop_duplicates("step", keep="last")
        part = pd.DataFrame({"run_id": run_id, "run": names.get(run_id, str(run_id)[:8]),
                             "name": full.get(run_id, str(run_id)), "step": h["step"].to_numpy(),
                             "raw": h["value"].to_numpy(dtype=float)})
        if x == "wall":
            w = None
            if wall is not None and not wall.empty:
                w = wall[wall["run_id"] == run_id].drop_duplicates("step", keep="last").set_index("step")["value"]
            if w is not None and len(w):
                part["x"] = part["step"].map(w).to_numpy(dtype=float)
            else:
                start = starts.get(run_id)
                start_ms = start.value / 1e6 if isinstance(start, pd.Timestamp) else float(h["timestamp"].min())
                part["x"] = (h["timestamp"].to_numpy(dtype=float) - start_ms) / 1000.0
        else:
            part["x"] = part["step"].astype(float)
        part["value"] = ema(part["raw"].to_numpy(), smoothing) if smoothing > 0 else part["raw"]
        parts.append(part)
    return pd.concat(parts, ignore_index=True)[cols]


def group_bands(curves: pd.DataFrame, runs: pd.DataFrame, param: str) -> pd.DataFrame:
    """Mean and min-max band across the runs of each value of ``param``, per step.

    Returns group, step, x (mean x of the group's runs at that step), mean, min, max, n.
    """
    cols = ["group", "step", "x", "mean", "min", "max", "n"]
    if curves.empty:
        return pd.DataFrame(columns=cols)
    col = param_col(param)
    values = dict(zip(runs["run_id"], runs[col].astype("string").fillna("(unset)"))) if col in runs else {}
    df = curves.assign(group=curves["run_id"].map(lambda r: f"{param}={values.get(r, '(unset)')}"))
    agg = df.groupby(["group", "step"], sort=True).agg(
        x=("x", "mean"), mean=("value", "mean"), min=("value", "min"), max=("value", "max"), n=("value", "size"))
    return agg.reset_index()[cols]


def sigma_lines(runs: pd.DataFrame, run_ids: Iterable[str]) -> pd.DataFrame:
    """Target entropy of each selected run (param ``algo.mpt.sigma``): run (label), sigma, mask_mode."""
    labels = labels_of(runs)
    sub = runs[runs["run_id"].isin(list(run_ids))]
    col, mode_col = param_col("algo.mpt.sigma"), param_col("algo.mpt.mode")
    if col not in sub:
        return pd.DataFrame(columns=["run", "sigma", "mask_mode"])
    out = pd.DataFrame({
        "run": sub["run_id"].map(labels),
        "sigma": pd.to_numeric(sub[col], errors="coerce"),
        "mask_mode": sub[mode_col] if mode_col in sub else None,
    })
    return out.dropna(subset=["sigma"]).reset_index(drop=True)


# ----------------------------------------------------------------------------- speedup


def sweep_groups(train: pd.DataFrame) -> pd.Series:
    """Group label of each training run: its sweep, else ``config: <experiment yaml stem>``."""
    sweep = train["sweep"] if "sweep" in train else pd.Series(None, index=train.index)
    config = train["config"] if "config" in train else pd.Series(None, index=train.index)
    fallback = "config: " + config.fillna("(unknown)").astype(str)
    return sweep.where(sweep.notna() & (sweep.astype("string") != ""), fallback)


def rollout_stats(hist: pd.DataFrame, skip: Optional[dict[str, int]] = None) -> pd.DataFrame:
    """Per-run rollout timing from ``time/step_s``, ``time/eval_s``, ``rollout/finished`` and
    ``train/samples`` histories, by the rule of :mod:`ulorl.report.speed` (one home for it).

    ``skip``: run_id -> number of leading steps to leave out (the Speedup page passes each run's
    segment count S: the steady window). Returns run_id, steps (in the window), first_step,
    median_step_s, total_s, finished, finished_per_s (= finished samples summed / step seconds summed)
    and trained_per_s (= train/samples summed / step seconds summed; NaN without train/samples); step
    seconds leave out the held-out evaluation (``time/eval_s``); median_step_cpu_s, trained_per_cpu_s
    (the same from ``time/step_cpu_s`` / ``time/eval_cpu_s``, NaN when not logged) and load (mean
    ``sys/load1``). A run with no step in its window has steps 0 and NaN values.
    """
    cols = ["run_id", "steps", "first_step", "median_step_s", "total_s", "finished", "finished_per_s", "trained_per_s",
            "median_step_cpu_s", "trained_per_cpu_s", "load"]
    if hist.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for run_id, h in hist.groupby("run_id", sort=False):
        by = {key: dict(zip(g["step"].astype(int), g["value"].astype(float)))
              for key, g in h.sort_values(["step", "timestamp"], kind="stable").groupby("metric")}
        st = speed.run_speed(by.get(speed.STEP_TIME, {}), (skip or {}).get(str(run_id), 0),
                             trained=by.get(speed.TRAINED), finished=by.get(speed.FINISHED),
                             eval_s=by.get(speed.EVAL_TIME), step_cpu_s=by.get(speed.STEP_CPU),
                             eval_cpu_s=by.get(speed.EVAL_CPU), load=by.get(speed.LOAD))
        if st is None:
            rows.append({"run_id": run_id, "steps": 0, **{c: np.nan for c in cols[2:]}})
        else:
            rows.append({"run_id": run_id, "steps": st.steps, "first_step": st.first_step,
                         "median_step_s": st.median_step_s, "total_s": st.total_s, "finished": st.finished,
                         "finished_per_s": st.finished_per_s, "trained_per_s": st.trained_per_s,
                         "median_step_cpu_s": st.median_step_cpu_s, "trained_per_cpu_s": st.trained_per_cpu_s,
                         "load": st.load})
    return pd.DataFrame(rows, columns=cols)


OVERLAP_SUFFIX = " + overlap"   # the batching label of rollout.schedule=overlap runs on the Speedup page


def speedup_table(stats: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Time per step and throughput by (batching, segments), relative to S = 1 of the same batching.

    ``stats``: output of :func:`rollout_stats`. Runs sharing (batching, segments) (seeds, trials)
    give the median of their per-run values (:func:`ulorl.report.speed.median_of`, Table 1's rule).
    Returns batching, segments, runs, median_step_s, finished_per_s, trained_per_s,
    step_speedup (= median_step_s at S=1 / median_step_s), throughput_x (= finished_per_s /
    finished_per_s at S=1), trained_x (= trained_per_s / trained_per_s at S=1), median_step_cpu_s,
    trained_per_cpu_s, load (medians of the per-run values), cpu_speedup (= median_step_cpu_s at S=1 /
    median_step_cpu_s) and trained_cpu_x (= trained_per_cpu_s / that at S=1); the relative columns are
    NaN when the batching has no S = 1 run (the CPU ones also when either side logged no CPU seconds).
    Runs with ``rollout.schedule=overlap`` get the batching label ``<batching> + overlap``: their own rows,
    compared with their own S = 1.
    """
    cols = ["batching", "segments", "runs", "median_step_s", "finished_per_s", "trained_per_s", "step_speedup",
            "throughput_x", "trained_x", "median_step_cpu_s", "trained_per_cpu_s", "cpu_speedup", "trained_cpu_x",
            "load"]
    if stats.empty:
        return pd.DataFrame(columns=cols)
    seg_col, bat_col = param_col("rollout.segments"), param_col("rollout.batching")
    meta = pd.DataFrame({
        "run_id": runs["run_id"],
        "segments": pd.to_numeric(runs[seg_col], errors="coerce") if seg_col in runs else np.nan,
        "batching": runs[bat_col].fillna("(unset)") if bat_col in runs else "(unset)",
    })
    sched_col = param_col("rollout.schedule")
    if sched_col in runs:   # overlapped runs form their own rows, against their own S = 1
        meta["batching"] = meta["batching"].where(runs[sched_col].fillna("sync").to_numpy() != "overlap",
                                                  meta["batching"] + OVERLAP_SUFFIX)
    for c in ("trained_per_s", "median_step_cpu_s", "trained_per_cpu_s", "load"):
        if c not in stats:
            stats = stats.assign(**{c: np.nan})
    df = stats.merge(meta, on="run_id", how="inner").dropna(subset=["segments", "median_step_s"])
    if df.empty:
        return pd.DataFrame(columns=cols)
    df["segments"] = df["segments"].astype(int)
    agg = df.groupby(["batching", "segments"], sort=True).agg(
        runs=("run_id", "size"), median_step_s=("median_step_s", speed.median_of),
        finished_per_s=("finished_per_s", speed.median_of), trained_per_s=("trained_per_s", speed.median_of),
        median_step_cpu_s=("median_step_cpu_s", speed.median_of),
        trained_per_cpu_s=("trained_per_cpu_s", speed.median_of), load=("load", speed.median_of),
    ).reset_index()
    base = agg[agg["segments"] == 1].set_index("batching")
    agg["step_speedup"] = agg["batching"].map(base["median_step_s"]) / agg["median_step_s"]
    agg["throughput_x"] = agg["finished_per_s"] / agg["batching"].map(base["finished_per_s"])
    agg["trained_x"] = agg["trained_per_s"] / agg["batching"].map(base["trained_per_s"])
    agg["cpu_speedup"] = agg["batching"].map(base["median_step_cpu_s"]) / agg["median_step_cpu_s"]
    agg["trained_cpu_x"] = agg["trained_per_cpu_s"] / agg["batching"].map(base["trained_per_cpu_s"])
    return agg[cols]


def speedups(table: pd.DataFrame) -> list[speed.Speedup]:
    """Every S > 1 row of a :func:`speedup_table` against the S = 1 row of its batching (none without one)."""
    out = []
    for batching, g in table.groupby("batching", sort=True):
        base = g[g["segments"] == 1]
        if base.empty:
            continue
        b = base.iloc[0]
        for _, r in g[g["segments"] > 1].iterrows():
            out.append(speed.Speedup(
                segments=int(r["segments"]), batching=str(batching), runs=int(r["runs"]), reference_runs=int(b["runs"]),
                step_s=float(r["median_step_s"]), reference_step_s=float(b["median_step_s"]),
                trained_per_s=float(r["trained_per_s"]), reference_trained_per_s=float(b["trained_per_s"]),
                cpu_step_s=float(r.get("median_step_cpu_s", np.nan)),
                reference_cpu_step_s=float(b.get("median_step_cpu_s", np.nan)),
                trained_per_cpu_s=float(r.get("trained_per_cpu_s", np.nan)),
                reference_trained_per_cpu_s=float(b.get("trained_per_cpu_s", np.nan)),
                load=float(r.get("load", np.nan)), reference_load=float(b.get("load", np.nan))))
    return out


# ----------------------------------------------------------------------------- benchmarks


def benchmarks_in(runs: pd.DataFrame) -> list[str]:
    """Benchmark names with an ``eval/<bench>/avg_at_k`` metric in any run."""
    return sorted({m.group(1) for c in runs.columns if (m := _EVAL_KEY.match(c))})


def run_label(runs: pd.DataFrame) -> pd.Series:
    """``ulorl.model_label`` tag when set, else the run's short label (``load_runs``' ``label``: role and
    swept values for a sweep trial), else its name; made unique like
    :func:`~ulorl.dashboard.store.unique_labels` (two runs never share a bar)."""
    label = runs["model_label"] if "model_label" in runs else pd.Series(None, index=runs.index)
    short = runs["label"] if "label" in runs else runs["run_name"]
    names = label.where(label.notna() & (label.astype("string") != ""), short)
    return pd.Series(unique_labels(list(runs["run_id"]), list(names)), index=runs.index)


def _present(v: Any) -> Any:
    """``v`` unless it is missing (None / NaN / empty)."""
    return None if v is None or (isinstance(v, float) and np.isnan(v)) or v == "" else v


def benchmark_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, benchmark) with an avg@k: run_id, label (short, unique), name (the full run
    name), kind, bench, k, extraction (the reward's answer extraction mode; ``boxed`` for runs older
    than the mode), avg_at_k, pass_at_k, ci_low, ci_high (values as logged)."""
    cols = ["run_id", "label", "name", "kind", "bench", "k", "extraction", "avg_at_k", "pass_at_k", "ci_low",
            "ci_high"]
    rows = []
    labels = run_label(runs) if not runs.empty else pd.Series(dtype=object)
    for bench in benchmarks_in(runs):
        for idx, r in runs.iterrows():
            avg = r.get(f"metrics.{schema.eval_metric(bench, 'avg_at_k')}")
            if avg is None or pd.isna(avg):
                continue
            k = r.get("tags.ulorl.k")
            if (k is None or pd.isna(k)) and "params.eval.k" in r:
                k = r.get("params.eval.k")
            rows.append({
                "run_id": r["run_id"], "label": labels[idx], "name": r.get("run_name", r["run_id"]),
                "kind": r["kind"], "bench": bench,
                "k": pd.to_numeric(k, errors="coerce") if k is not None else np.nan,
                "extraction": _present(r.get(f"tags.{schema.EXTRACTION_TAG}"))
                or _present(r.get(f"params.{schema.EXTRACTION_PARAM}")) or "boxed",
                "avg_at_k": avg,
                **{name: r.get(f"metrics.{schema.eval_metric(bench, name)}", np.nan)
                   for name in ("pass_at_k", "ci_low", "ci_high")},
            })
    return pd.DataFrame(rows, columns=cols)


def bench_series(table: pd.DataFrame) -> pd.Series:
    """Chart series of each benchmark row: the bench name where every shown row of that bench used one
    reward extraction mode, else ``"<bench> [<mode>]"``, so bars scored under different modes never
    share a series (their numbers are not comparable)."""
    if table.empty:
        return pd.Series(dtype=object)
    modes = table.groupby("bench")["extraction"].nunique()
    mixed = table["bench"].map(modes) > 1
    return table["bench"].where(~mixed, table["bench"] + " [" + table["extraction"].astype(str) + "]")


def benchmark_deltas(table: pd.DataFrame, baseline_run_id: Optional[str]) -> pd.DataFrame:
    """Add delta_avg and delta_pass: the run's value minus the baseline run's on the same bench
    (NaN where the baseline has no value for that bench, scored it with another reward extraction
    mode, or there is no baseline)."""
    out = table.copy()
    if table.empty or not baseline_run_id:
        out["delta_avg"] = np.nan
        out["delta_pass"] = np.nan
        return out
    base = table[table["run_id"] == baseline_run_id].set_index("bench")
    out["delta_avg"] = out["avg_at_k"] - out["bench"].map(base["avg_at_k"])
    out["delta_pass"] = out["pass_at_k"] - out["bench"].map(base["pass_at_k"])
    if "extraction" in out:
        other_mode = out["extraction"] != out["bench"].map(base["extraction"])
        out.loc[other_mode, ["delta_avg", "delta_pass"]] = np.nan
    return out


def paired_deltas(table: pd.DataFrame, baseline_run_id: Optional[str],
                  scores: dict[tuple[str, str], dict[str, float]]) -> pd.DataFrame:
    """Add the paired difference vs the baseline on the SAME problems: ``diff`` (mean of per-problem
    accuracy differences), ``diff_low`` / ``diff_high`` (95 % paired bootstrap interval) and
    ``paired_problems``. ``scores``: (run_id, bench) -> {problem_id: accuracy}. NaN where either
    run has no per-problem results for that bench (or for the baseline row itself)."""
    out = table.copy()
    for col in ("diff", "diff_low", "diff_high", "paired_problems"):
        out[col] = np.nan
    if table.empty or not baseline_run_id:
        return out
    for idx, row in out.iterrows():
        if row["run_id"] == baseline_run_id:
            continue
        a, b = scores.get((row["run_id"], row["bench"])), scores.get((baseline_run_id, row["bench"]))
        if not a or not b:
            continue
        xa, xb = common_scores(a, b)
        if not xa:
            continue
        d, lo, hi = paired_bootstrap(xa, xb)
        out.loc[idx, ["diff", "diff_low", "diff_high", "paired_problems"]] = [d, lo, hi, len(xa)]
    return out


# ----------------------------------------------------------------------------- sweeps


def spearman(x: Sequence[Any], y: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant
    or fewer than 3 complete pairs. Strings are ranked by their sort order."""
    df = pd.DataFrame({"x": list(x), "y": list(y)}).dropna()
    if len(df) < 3:
        return float("nan")
    xs = coerce(df["x"])
    if xs.dtype == object or pd.api.types.is_string_dtype(xs):
        xs = xs.astype(str)
    rx, ry = xs.rank(method="average"), df["y"].astype(float).rank(method="average")
    if rx.nunique() < 2 or ry.nunique() < 2:
        return float("nan")
    return float(np.corrcoef(rx.to_numpy(dtype=float), ry.to_numpy(dtype=float))[0, 1])


def param_importance(trials: pd.DataFrame, params: Sequence[str], objective: str) -> pd.DataFrame:
    """Spearman correlation of each param with the objective column, sorted by |rho| desc.
    Returns param, spearman, abs_spearman, n."""
    rows = []
    for p in params:
        col = param_col(p)
        if col not in trials:
            continue
        rho = spearman(trials[col], trials[objective])
        n = int(trials[[col, objective]].dropna().shape[0])
        rows.append({"param": p, "spearman": rho, "abs_spearman": abs(rho), "n": n})
    out = pd.DataFrame(rows, columns=["param", "spearman", "abs_spearman", "n"])
    return out.sort_values("abs_spearman", ascending=False, na_position="last").reset_index(drop=True)


def optimization_history(trials: pd.DataFrame, objective: str, mode: str = "max") -> pd.DataFrame:
    """Trials in start order with their objective and the best so far.
    Returns trial (1-based), run, value, best."""
    cols = ["trial", "run", "value", "best"]
    df = trials.dropna(subset=[objective])
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = df.sort_values("start_time", kind="stable") if "start_time" in df else df
    values = df[objective].astype(float)
    best = values.cummax() if mode == "max" else values.cummin()
    labels = labels_of(trials)
    return pd.DataFrame({"trial": np.arange(1, len(df) + 1), "run": df["run_id"].map(labels).to_numpy(),
                         "value": values.to_numpy(), "best": best.to_numpy()}, columns=cols)


def parallel_frame(trials: pd.DataFrame, params: Sequence[str], objective: str) -> pd.DataFrame:
    """Long frame for a parallel-coordinates plot: one row per (trial, axis).

    Each axis (params then the objective) is scaled to [0, 1] over the trials (numeric: min-max,
    a constant axis sits at 0.5; categorical: evenly spaced in sorted order).
    Returns run_id, run (label), axis, order, norm, label (the raw value as text), objective.
    """
    cols = ["run_id", "run", "axis", "order", "norm", "label", "objective"]
    labels = labels_of(trials)
    df = trials.dropna(subset=[objective])
    if df.empty:
        return pd.DataFrame(columns=cols)
    axes = ([(p, param_col(p)) for p in params if param_col(p) in df]
            + [(short_metric(objective.split(".", 1)[-1]), objective)])
    parts = []
    for order, (name, col) in enumerate(axes):
        raw = coerce(df[col]) if col != objective else df[col].astype(float)
        if pd.api.types.is_numeric_dtype(raw):
            lo, hi = raw.min(), raw.max()
            norm = (raw - lo) / (hi - lo) if hi > lo else pd.Series(0.5, index=raw.index)
        else:
            cats = sorted(raw.dropna().astype(str).unique())
            pos = {c: (i / (len(cats) - 1) if len(cats) > 1 else 0.5) for i, c in enumerate(cats)}
            norm = raw.astype(str).map(pos)
        parts.append(pd.DataFrame({"run_id": df["run_id"].to_numpy(), "run": df["run_id"].map(labels).to_numpy(),
                                   "axis": name, "order": order,
                                   "norm": norm.to_numpy(dtype=float), "label": raw.astype(str).to_numpy(),
                                   "objective": df[objective].astype(float).to_numpy()}))
    return pd.concat(parts, ignore_index=True)[cols]
