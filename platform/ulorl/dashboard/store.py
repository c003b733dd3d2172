"""Read runs, metric histories and artifacts from an MLflow store (no Streamlit here).

Every function takes an ``MlflowClient`` so tests can point it at a real temporary store.
Only names from :mod:`ulorl.tracking.schema` are interpreted.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import ViewType

from ulorl.sweep.spec import values_summary
from ulorl.tracking import schema

# Metrics whose maximum over the run's history is shown as "best" in the runs table.
BEST_METRICS: tuple[str, ...] = ("train/reward_mean", schema.eval_metric("heldout", "avg_at_k"))
# Every-step metric whose history length gives the number of steps a run logged.
STEP_METRIC = "time/step_s"
SAMPLES_DIR = "samples"
CHECKPOINTS_DIR = "checkpoints"
_SAMPLE_FILE = re.compile(r"step_(\d+)\.jsonl$")


def sqlite_path(uri: str) -> Optional[Path]:
    """``sqlite:////abs/mlflow.db`` -> ``Path('/abs/mlflow.db')``; None for other schemes."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):])
    return None


def store_exists(uri: str) -> bool:
    """False only for a sqlite URI whose file is missing (opening it would create an empty DB)."""
    path = sqlite_path(uri)
    return path is None or path.is_file()


def open_client(uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=uri)


def _ms_to_time(ms: Optional[int]) -> Optional[pd.Timestamp]:
    """Epoch milliseconds -> a naive UTC timestamp (tz-aware columns make pyarrow warn in pandas 3)."""
    return pd.to_datetime(ms, unit="ms") if ms else None


def _iter_runs(client: MlflowClient, experiment_ids: list[str]) -> Iterable[Any]:
    token: Optional[str] = None
    while True:
        page = client.search_runs(experiment_ids, run_view_type=ViewType.ACTIVE_ONLY,
                                  max_results=1000, order_by=["attributes.start_time DESC"], page_token=token)
        yield from page
        token = page.token
        if not token:
            break


def metric_history(client: MlflowClient, run_id: str, key: str) -> pd.DataFrame:
    """History of one metric: columns step, value, timestamp (ms), sorted by step then time."""
    rows = [(m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key)]
    df = pd.DataFrame(rows, columns=["step", "value", "timestamp"])
    return df.sort_values(["step", "timestamp"], kind="stable").reset_index(drop=True)


def unique_labels(run_ids: Sequence[str], names: Sequence[Optional[str]]) -> list[str]:
    """Display label of each run: its name, with `` (<first 8 chars of the id>)`` appended when
    another run in the list has the same name. Runs are identities, names are labels: charts key
    on the label only because it is unique (``unique_labels(["a1", "b2"], ["q", "q"]) ==
    ["q (a1)", "q (b2)"]``)."""
    shown = [n if isinstance(n, str) and n else r[:8] for r, n in zip(run_ids, names)]
    counts = Counter(shown)
    out = [f"{n} ({r[:8]})" if counts[n] > 1 else n for r, n in zip(run_ids, shown)]
    if len(set(out)) < len(out):  # ids sharing 8 chars under one name: use the whole id
        out = [f"{n} ({r})" if counts[n] > 1 else n for r, n in zip(run_ids, shown)]
    return out


def trial_label(role: str, variant: Optional[str], seed_offset: Any, values: dict[str, Any]) -> str:
    """Short name of a sweep trial for legends: its role and what was swept,
    ``trial_label("search", None, "0", {"algo.mpt.tau": "0.9", "algo.mpt.sigma": "0.0931234"}) ==
    "search tau=0.9 sigma=0.0931"``; baseline and reference trials name their variant
    (``baseline masking_off seed+1``, ``reference non_segmented``)."""
    try:
        seed = int(float(seed_offset))
    except (TypeError, ValueError):
        seed = 0
    swept = values_summary({k: schema.typed_param(v) for k, v in values.items()}) if role in ("search", "rerun") else ""
    parts = (role, variant or "", swept, f"seed+{seed}" if seed else "")
    return " ".join(p for p in parts if p)


def short_names(df: pd.DataFrame) -> list[str]:
    """Each run's short name: :func:`trial_label` for a sweep trial (tag ``ulorl.trial_role``; the swept
    keys come from its parent's ``space.<key>`` params), else its run name."""
    space: dict[str, list[str]] = {}
    for _, r in df[df["kind"] == "sweep"].iterrows():
        space[r["run_id"]] = [c[len("params.space."):] for c in df.columns
                              if c.startswith("params.space.") and isinstance(r.get(c), str)]
    role_col, seed_col = f"tags.{schema.ROLE_TAG}", f"tags.{schema.SEED_TAG}"
    out = []
    for _, r in df.iterrows():
        role = r.get(role_col)
        if not isinstance(role, str) or not role:
            out.append(r["run_name"])
            continue
        keys = space.get(r.get("parent_run_id") or "", [])
        values = {k: r.get(f"params.{k}") for k in keys if isinstance(r.get(f"params.{k}"), str)}
        variant = r.get("variant") if isinstance(r.get("variant"), str) else None
        out.append(trial_label(role, variant, r.get(seed_col), values))
    return out


def load_runs(client: MlflowClient, best_metrics: Iterable[str] = BEST_METRICS) -> pd.DataFrame:
    """One row per active run of every active experiment.

    Columns: run_id, run_name, label (unique short display name: :func:`short_names` made unique by
    :func:`unique_labels`), experiment,
    experiment_id, kind, status, start_time, end_time, duration_s, parent_run_id, parent, sweep, config,
    variant, paper_ref, model_label, benchmark,
    steps, ``params.<key>`` (strings as logged), ``metrics.<key>`` (latest value),
    ``best.<key>`` (max over history, for ``best_metrics``) and ``tags.<key>``.
    """
    experiments = {e.experiment_id: e.name for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)}
    if not experiments:
        return pd.DataFrame(columns=["run_id", "run_name", "label", "experiment", "kind", "status"])
    rows: list[dict[str, Any]] = []
    for run in _iter_runs(client, list(experiments)):
        info, data = run.info, run.data
        tags = data.tags
        row: dict[str, Any] = {
            "run_id": info.run_id,
            "run_name": info.run_name or info.run_id[:8],
            "experiment": experiments.get(info.experiment_id, info.experiment_id),
            "experiment_id": info.experiment_id,
            "kind": tags.get(schema.KIND_TAG, "other"),
            "status": info.status,
            "start_time": _ms_to_time(info.start_time),
            "end_time": _ms_to_time(info.end_time),
            "duration_s": (info.end_time - info.start_time) / 1000.0 if info.end_time and info.start_time else None,
            "parent_run_id": tags.get(schema.PARENT_TAG),
            "config": tags.get(schema.EXPERIMENT_TAG),
            "variant": tags.get(schema.VARIANT_TAG),
            "paper_ref": tags.get(schema.PAPER_REF_TAG),
            "model_label": tags.get(schema.MODEL_LABEL_TAG),
            "benchmark": tags.get(schema.BENCHMARK_TAG),
            "sweep_tag": tags.get(schema.SWEEP_TAG),
        }
        row.update({f"params.{k}": v for k, v in data.params.items()})
        row.update({f"metrics.{k}": v for k, v in data.metrics.items()})
        row.update({f"tags.{k}": v for k, v in tags.items() if not k.startswith("mlflow.log-model")})
        for key in best_metrics:
            if key in data.metrics:
                hist = metric_history(client, info.run_id, key)
                row[f"best.{key}"] = float(hist["value"].max()) if len(hist) else None
        if STEP_METRIC in data.metrics:
            hist = metric_history(client, info.run_id, STEP_METRIC)
            row["steps"] = int(hist["step"].max()) if len(hist) else 0
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=["run_id", "run_name", "label", "experiment", "kind", "status"])
    if "steps" not in df:
        df["steps"] = pd.NA
    df.insert(2, "label", unique_labels(list(df["run_id"]), short_names(df)))
    names = dict(zip(df["run_id"], df["run_name"]))
    kind_of = dict(zip(df["run_id"], df["kind"]))
    tag_of = {r: t for r, t in zip(df["run_id"], df["sweep_tag"]) if isinstance(t, str) and t}
    parent_of = {r: p for r, p in zip(df["run_id"], df["parent_run_id"]) if isinstance(p, str) and p}

    def sweep_of(run_id: str, depth: int = 0) -> Optional[str]:
        """Own ulorl.sweep tag; else the sweep parent's tag (or name); an eval nested under a
        trial inherits the trial's sweep. Unknown parents give None."""
        if run_id in tag_of:
            return tag_of[run_id]
        pid = parent_of.get(run_id)
        if pid is None or pid not in kind_of or depth > 3:
            return None
        if kind_of[pid] == "sweep":
            return tag_of.get(pid, names.get(pid))
        return sweep_of(pid, depth + 1)

    labels = dict(zip(df["run_id"], df["label"]))
    df["parent"] = [labels.get(p, p[:8]) if isinstance(p, str) and p else None for p in df["parent_run_id"]]
    df["sweep"] = [sweep_of(r) for r in df["run_id"]]
    return df.reset_index(drop=True)


def histories(client: MlflowClient, run_ids: Iterable[str], keys: Iterable[str]) -> pd.DataFrame:
    """Long frame of metric histories: run_id, metric, step, value, timestamp (ms)."""
    parts = []
    for run_id in run_ids:
        for key in keys:
            h = metric_history(client, run_id, key)
            if len(h):
                h.insert(0, "metric", key)
                h.insert(0, "run_id", run_id)
                parts.append(h)
    if not parts:
        return pd.DataFrame(columns=["run_id", "metric", "step", "value", "timestamp"])
    return pd.concat(parts, ignore_index=True)


def list_artifacts(client: MlflowClient, run_id: str, path: Optional[str] = None) -> list[dict[str, Any]]:
    """Direct children of an artifact folder: dicts with path, is_dir, size."""
    try:
        infos = client.list_artifacts(run_id, path)
    except Exception:  # a missing folder or an unreachable artifact root reads as empty
        return []
    return [{"path": f.path, "is_dir": f.is_dir, "size": f.file_size} for f in infos]


def _tree_size(client: MlflowClient, run_id: str, path: str, depth: int = 3) -> tuple[int, int]:
    """(files, bytes) under an artifact folder, descending at most ``depth`` levels."""
    files = size = 0
    for entry in list_artifacts(client, run_id, path):
        if entry["is_dir"]:
            if depth > 0:
                f, s = _tree_size(client, run_id, entry["path"], depth - 1)
                files, size = files + f, size + s
        else:
            files, size = files + 1, size + int(entry["size"] or 0)
    return files, size


def list_checkpoints(client: MlflowClient, run_id: str) -> pd.DataFrame:
    """Checkpoint folders under ``checkpoints/``: columns name, path, files, size_mb."""
    rows = []
    for entry in list_artifacts(client, run_id, CHECKPOINTS_DIR):
        if entry["is_dir"]:
            files, size = _tree_size(client, run_id, entry["path"])
            rows.append({"name": Path(entry["path"]).name, "path": entry["path"],
                         "files": files, "size_mb": round(size / 1e6, 3)})
    return pd.DataFrame(rows, columns=["name", "path", "files", "size_mb"])


def list_sample_files(client: MlflowClient, run_id: str) -> list[tuple[int, str]]:
    """``samples/step_<NNNNNN>.jsonl`` artifacts as (step, path), sorted by step."""
    out = []
    for entry in list_artifacts(client, run_id, SAMPLES_DIR):
        m = _SAMPLE_FILE.search(entry["path"])
        if m and not entry["is_dir"]:
            out.append((int(m.group(1)), entry["path"]))
    return sorted(out)


def read_text_artifact(client: MlflowClient, run_id: str, path: str) -> Optional[str]:
    """Text of one artifact file, or None when it does not exist."""
    with tempfile.TemporaryDirectory(prefix="ulorl-dash-") as tmp:
        try:
            local = client.download_artifacts(run_id, path, tmp)
        except Exception:
            return None
        p = Path(local)
        return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None


def read_jsonl_artifact(client: MlflowClient, run_id: str, path: str) -> list[dict[str, Any]]:
    """Records of a JSONL artifact; unparsable lines are skipped."""
    text = read_text_artifact(client, run_id, path)
    records = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records

