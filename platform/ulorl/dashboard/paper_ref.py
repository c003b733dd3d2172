"""The paper's Tables 1-3 as DataFrames, from :mod:`ulorl.report.paper` (the single source)."""

from __future__ import annotations

import pandas as pd

from ulorl.report import paper


def table1() -> pd.DataFrame:
    """segments, time_per_step_s, speedup (Qwen3-30B-A3B, 64k outputs)."""
    return pd.DataFrame([{"segments": r.segments, "time_per_step_s": r.time_per_step_s, "speedup": r.speedup}
                         for r in paper.TABLE1])


def _scores(rows) -> pd.DataFrame:
    out = []
    for r in rows:
        row = {"model": r.model}
        for bench, header in paper.BENCHMARKS:
            row[header] = getattr(r, bench)
        row["AVG"] = r.avg
        if r.max_response_len is not None:
            row["max_len"] = r.max_response_len
            row["segments"] = r.segments
        out.append(row)
    return pd.DataFrame(out)


def table2() -> pd.DataFrame:
    """model, AIME-2025, BeyondAIME, AVG (avg@32, percent)."""
    return _scores(paper.TABLE2)


def table3() -> pd.DataFrame:
    """model, AIME-2025, BeyondAIME, AVG, max_len, segments (output-length ablation)."""
    return _scores(paper.TABLE3)


CITATION = paper.PAPER_REF
TABLE1_SETTING = paper.TABLE1_SETTING
EVAL_K = paper.EVAL_K
