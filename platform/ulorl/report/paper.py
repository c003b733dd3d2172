"""The paper's published numbers, as data (Du et al., "UloRL", arXiv 2507.19766, Tables 1-3).

Used by ``ulorl-tables`` (printed beside our measurements) and the dashboard. Scores are avg@32
in percent; times are seconds per training step. Nothing here is computed: it is transcribed from
the paper (see platform/ulorl/docs/PAPER.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PAPER_REF = "Du, Liu, Yang, Chen, Li. UloRL. arXiv 2507.19766 (2025)"


@dataclass(frozen=True)
class Table1Row:
    """Segment count vs. time per step (Qwen3-30B-A3B, 64k outputs)."""

    segments: int
    time_per_step_s: float
    speedup: float


TABLE1: tuple[Table1Row, ...] = (
    Table1Row(1, 1240.0, 1.0),
    Table1Row(2, 774.0, 1.6),
    Table1Row(4, 601.0, 2.06),
)
TABLE1_SETTING = {"model": "Qwen3-30B-A3B", "max_response_len": 65536, "batching": "paper (verl)"}


@dataclass(frozen=True)
class ScoreRow:
    """One model row of Table 2 or 3: avg@32 (%) on AIME-2025 and BeyondAIME, and their mean.

    ``max_response_len`` / ``segments`` are set for Table 3 rows (training output length).
    """

    model: str
    aime2025: float
    beyondaime: float
    avg: float
    max_response_len: Optional[int] = None
    segments: Optional[int] = None


TABLE2: tuple[ScoreRow, ...] = (
    ScoreRow("DeepSeek-R1-0528", 87.5, 63.3, 75.4),
    ScoreRow("Seed-1.6-thinking", 86.0, 56.3, 71.2),
    ScoreRow("Qwen3-235B-A22B", 81.5, 59.0, 70.3),
    ScoreRow("Qwen3-30B-A3B", 70.9, 50.7, 60.8),
    ScoreRow("UloRL-A3B-128k", 82.8, 60.2, 71.5),
    ScoreRow("UloRL-A3B-w/o-DMMPTs", 78.6, 57.1, 67.9),
    ScoreRow("UloRL-A3B-128k-Yarn", 85.1, 61.9, 73.5),
)

TABLE3: tuple[ScoreRow, ...] = (
    ScoreRow("Qwen3-30B-A3B", 70.9, 50.7, 60.8),
    ScoreRow("UloRL-A3B-32k", 73.5, 52.3, 62.9, max_response_len=32 * 1024, segments=1),
    ScoreRow("UloRL-A3B-64k", 79.9, 58.5, 69.2, max_response_len=64 * 1024, segments=4),
    ScoreRow("UloRL-A3B-96k", 81.6, 59.4, 70.5, max_response_len=96 * 1024, segments=8),
    ScoreRow("UloRL-A3B-128k", 82.8, 60.2, 71.5, max_response_len=128 * 1024, segments=8),
)

# Benchmarks of Tables 2 and 3, as (benchmark name used by ulorl-eval, column header).
BENCHMARKS: tuple[tuple[str, str], ...] = (("aime2025", "AIME-2025"), ("beyondaime", "BeyondAIME"))

# Evaluation protocol (section 5 of PAPER.md).
EVAL_K = 32
EVAL_SAMPLING = {"temperature": 0.85, "top_p": 0.95, "top_k": 20}
YARN_140K = {"rope_type": "yarn", "factor": 1.5, "original_max_position_embeddings": 95232}

# Training defaults (section 5), for reference in reports.
TRAIN_SETTINGS = {
    "lr": 1e-6, "prompts_per_step": 128, "group_size": 8, "temperature": 0.85, "top_p": 1.0,
    "top_k": -1, "max_response_len": 128 * 1024, "segments": 8, "tau": 0.99, "sigma": 0.2,
}


def table1_by_segments() -> dict[int, Table1Row]:
    return {r.segments: r for r in TABLE1}
