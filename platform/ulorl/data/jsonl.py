"""Prompt datasets from JSONL files, benchmark names and (online) Hugging Face dataset ids.

Every row needs a non-empty ``problem`` and ``answer``; a bad row is an error naming the file and
line, never a silent drop. Blank lines are not rows and are ignored.

    items = resolve_dataset("aime2025", data_dir=None)      # <data_dir or $ULORL_DATA_DIR>/aime2025.jsonl
    items = resolve_dataset("/path/to/train.jsonl", None)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any, Optional

from ulorl.data.types import PromptItem

BENCHMARKS = ("aime2025", "beyondaime", "math_train_sample")
DATA_DIR_ENV = "ULORL_DATA_DIR"
# Files shipped with the package (origins and licences in its README.md); read when no data
# directory is given. aime2025 is not among them (no licence upstream).
PACKAGED_DIR = Path(__file__).resolve().parent / "files"
_KNOWN = {"id", "problem", "answer", "source"}
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(?::[\w.-]+)?$")


class DataError(ValueError):
    """A dataset cannot be found or read; the message names the file (and line) and the fix."""


def _answer_text(value: Any) -> Optional[str]:
    """Answers may be JSON strings or numbers (``70`` -> ``"70"``); anything else is invalid."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return value.strip()
    return None


def read_json_objects(path: str | os.PathLike[str],
                      missing: str = "file not found") -> list[tuple[int, dict[str, Any]]]:
    """``(1-based line, object)`` of every non-blank line of a JSONL file.

    Raises ``DataError`` naming the file (``missing`` when it does not exist) or ``file:line`` for a
    line that is not UTF-8, not valid JSON or not a JSON object.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: {missing}")
    rows: list[tuple[int, dict[str, Any]]] = []
    with p.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                fixed = p.with_name(f"{p.stem}.utf8{p.suffix}")
                raise DataError(
                    f"{p}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
                    f"JSONL files must be UTF-8: convert it, e.g. iconv -f latin1 -t utf-8 {p} > {fixed}"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{p}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{p}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append((lineno, row))
    return rows


def load_jsonl_prompts(path: str | os.PathLike[str]) -> list[PromptItem]:
    """Read ``path`` (one JSON object per line with ``problem`` and ``answer``) into prompt items.

    ``id`` defaults to ``<file stem>-<line>``, ``source`` to the file path; other fields go to
    ``meta``. Raises ``DataError`` naming the file and 1-based line for: invalid JSON, a row that
    is not an object, a missing / empty / non-string ``problem``, a missing / empty ``answer``,
    a duplicate ``id``; and for a missing or empty file.
    """
    p = Path(path)
    items: list[PromptItem] = []
    first_line: dict[str, int] = {}
    for lineno, row in read_json_objects(p, missing="dataset file not found"):
        where = f"{p}:{lineno}"
        problem = row.get("problem")
        if not isinstance(problem, str) or not problem.strip():
            what = "missing" if "problem" not in row else "empty or not a string"
            raise DataError(f"{where}: field 'problem' is {what}")
        if "answer" not in row:
            raise DataError(f"{where}: field 'answer' is missing")
        answer = _answer_text(row["answer"])
        if not answer:
            raise DataError(f"{where}: field 'answer' is empty or not a string/number ({row['answer']!r})")
        item_id = str(row.get("id") or f"{p.stem}-{lineno}")
        if item_id in first_line:
            raise DataError(f"{where}: duplicate id {item_id!r} (first on line {first_line[item_id]})")
        first_line[item_id] = lineno
        items.append(
            PromptItem(
                id=item_id,
                problem=problem.strip(),
                answer=answer,
                source=str(row.get("source") or p),
                meta={k: v for k, v in row.items() if k not in _KNOWN},
            )
        )
    if not items:
        raise DataError(f"{p}: no rows (the file is empty)")
    return items


def _data_dir(data_dir: Optional[str]) -> tuple[Optional[Path], str]:
    if data_dir:
        return Path(data_dir).expanduser(), "the data_dir argument / --data-dir flag"
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser(), f"${DATA_DIR_ENV}"
    return None, ""


def resolve_dataset(spec: str, data_dir: Optional[str] = None) -> list[PromptItem]:
    """Load a dataset from ``spec``:

    - a path to a ``.jsonl`` file (or any existing file);
    - a benchmark name (``aime2025``, ``beyondaime``, ``math_train_sample``) read from
      ``<data_dir>/<name>.jsonl``, where ``data_dir`` is the argument, else ``$ULORL_DATA_DIR``;
    - a Hugging Face dataset id (contains ``/``, not a file; ``owner/name`` or
      ``owner/name:split``), loaded with the ``datasets`` library when installed and online.
    """
    spec = spec.strip()
    if not spec:
        raise DataError("empty dataset spec: give a .jsonl path, a benchmark name or a HF dataset id")
    path = Path(spec).expanduser()
    if path.is_file():
        return load_jsonl_prompts(path)
    if path.is_dir():
        raise DataError(f"{spec}: is a directory; give a .jsonl file (or a benchmark name with --data-dir {spec})")
    looks_like_path = spec.endswith((".jsonl", ".json")) or spec.startswith(("/", ".", "~")) or (
        os.sep in spec and not _HF_ID.match(spec)
    )
    if looks_like_path:
        raise DataError(f"{spec}: dataset file not found (cwd {Path.cwd()})")
    if spec in BENCHMARKS:
        folder, origin = _data_dir(data_dir)
        if folder is None and (PACKAGED_DIR / f"{spec}.jsonl").is_file():
            return load_jsonl_prompts(PACKAGED_DIR / f"{spec}.jsonl")
        if folder is None:
            raise DataError(
                f"benchmark {spec!r} needs a data directory holding {spec}.jsonl: pass --data-dir DIR "
                f"(data.data_dir in the experiment) or set {DATA_DIR_ENV}=DIR"
            )
        f = folder / f"{spec}.jsonl"
        if not f.is_file():
            raise DataError(
                f"benchmark {spec!r}: looked for {f} (data directory from {origin}) and it does not "
                f"exist; point --data-dir / {DATA_DIR_ENV} at the folder holding {spec}.jsonl"
            )
        return load_jsonl_prompts(f)
    if _HF_ID.match(spec):
        return _load_hf_dataset(spec)
    raise DataError(
        f"unknown dataset {spec!r}: expected a .jsonl path, a benchmark name "
        f"({', '.join(BENCHMARKS)}) or a Hugging Face dataset id (owner/name[:split])"
    )


def _load_hf_dataset(spec: str) -> list[PromptItem]:
    """Lazily load ``owner/name[:split]`` with ``datasets`` (fields problem|question, answer)."""
    name, _, split = spec.partition(":")
    split = split or "train"
    if importlib.util.find_spec("datasets") is None:
        raise DataError(
            f"{spec!r} looks like a Hugging Face dataset id, but the `datasets` library is not "
            "installed (pip install datasets); or download it and pass a .jsonl path instead"
        )
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            raise DataError(
                f"{spec!r} looks like a Hugging Face dataset id, but {var} is set (offline); "
                "pass a local .jsonl path instead"
            )
    import datasets  # noqa: PLC0415 -- optional dependency, loaded only here

    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as exc:  # noqa: BLE001 -- network / hub errors of every kind
        raise DataError(f"{spec!r}: could not load Hugging Face dataset ({type(exc).__name__}: {exc})") from exc
    items: list[PromptItem] = []
    for i, row in enumerate(ds):
        problem = row.get("problem") or row.get("question") or row.get("Problem") or row.get("Question")
        answer = _answer_text(row.get("answer", row.get("Answer")))
        if not isinstance(problem, str) or not problem.strip() or not answer:
            raise DataError(f"{spec} (split {split}) row {i}: needs non-empty problem/question and answer fields")
        items.append(
            PromptItem(
                id=str(row.get("id") or f"{name}-{split}-{i}"), problem=problem.strip(), answer=answer, source=spec
            )
        )
    if not items:
        raise DataError(f"{spec} (split {split}): no rows")
    return items
