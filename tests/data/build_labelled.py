"""Rebuild ``verifier_labelled.jsonl`` from public graders' own answer-equivalence test suites.

    python tests/data/build_labelled.py MATH_VERIFY_GIT MARIO_EVAL_GIT HENDRYCKS_MATH_GIT TORA_GIT OUT_DIR

writes ``OUT_DIR/labelled.jsonl`` (every row), ``OUT_DIR/dev.jsonl`` and ``OUT_DIR/test.jsonl``
(a seeded 50/50 split within each source, made once before any verifier change: tune on dev,
report on test).

Each argument is a git directory (bare clone) of the named repository; the files are read from
its HEAD with ``git show``. Every row keeps the case exactly as its authors wrote it:

* huggingface/Math-Verify (Apache-2.0), ``tests/*.py``: ``(gold, pred, expected)`` parametrize
  tables -> ``answer=gold``, ``response=pred`` (pred is free text, as the cases test extraction),
  ``label=bool(expected)``. Rows whose label depends on a non-default option (``precision``,
  ``strict=False``, ``allow_set_relation_comp=True``) are left out.
* MARIO-Math-Reasoning/MARIO_EVAL (MIT), ``math_evaluation/tests/test_is_equiv.py`` and
  hendrycks/math (MIT), ``modeling/math_equivalence_test.py``: ``test_in`` / ``test_out``
  assignments followed by ``assertTrue`` / ``assertFalse(is_equiv(...))`` -> ``answer=test_in``,
  ``response="\\boxed{" + test_out + "}"`` (these are answer pairs, so the prediction is given
  as a boxed final answer), label from the assertion.
* microsoft/ToRA (MIT), ``src/outputs/llm-agents/{tora-70b-v1.0,tora-code-34b-v1.0}/gsm8k/*.jsonl``:
  the published model responses to GSM8K test problems (``code[0]``), ``answer=gt``,
  ``problem=question``; the label is ToRA's own published grader (``src/eval/grader.py``,
  ``math_equal(pred[0], gt)`` on ToRA's own extraction). The outputs ship without per-item scores,
  so the grader is re-run here; it reproduces the published ``.metrics`` means (84.3 / 80.7).
"""

from __future__ import annotations

import ast
import json
import importlib.util
import os
import random
import subprocess
import sys
import tempfile
from typing import Iterator

SPLIT_SEED = 15


def git_show(git_dir: str, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def git_ls(git_dir: str, prefix: str) -> list[str]:
    out = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "-r", "--name-only", "HEAD", prefix],
                         check=True, capture_output=True, text=True).stdout
    return [p for p in out.splitlines() if p.endswith(".py")]


def _literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError):
        return None


def math_verify_rows(git_dir: str) -> Iterator[dict]:
    for path in git_ls(git_dir, "tests/"):
        tree = ast.parse(git_show(git_dir, path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for dec in fn.decorator_list:
                if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"):
                    continue
                names = [n.strip() for n in str(_literal(dec.args[0])).split(",")]
                if "gold" not in names or "pred" not in names:
                    continue
                label_key = "expected" if "expected" in names else "result" if "result" in names else None
                if label_key is None:
                    continue
                cases = _literal(dec.args[1])
                if not isinstance(cases, list):
                    continue
                for i, case in enumerate(cases):
                    if not isinstance(case, tuple) or len(case) != len(names):
                        continue
                    row = dict(zip(names, case))
                    if "precision" in row or row.get("strict", True) is not True:
                        continue
                    if row.get("allow_set_relation_comp", False):
                        continue
                    gold, pred, exp = row["gold"], row["pred"], row[label_key]
                    if not (isinstance(gold, str) and isinstance(pred, str) and exp in (0, 1, True, False)):
                        continue
                    yield {"response": pred, "answer": gold, "label": bool(exp),
                           "source": "math-verify-tests", "origin": f"huggingface/Math-Verify:{path}::{fn.name}[{i}]"}


def unittest_rows(git_dir: str, path: str, source: str, repo: str) -> Iterator[dict]:
    """``test_in = ...; test_out = ...; self.assertTrue/False(is_equiv(test_in, test_out))``."""
    tree = ast.parse(git_show(git_dir, path))
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        env: dict[str, object] = {}
        k = 0
        for stmt in fn.body:  # in source order: each assertion uses the assignments above it
            node = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr)) else None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                env[stmt.targets[0].id] = _literal(stmt.value)
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("assertTrue", "assertFalse"):
                inner = node.args[0] if node.args else None
                if not isinstance(inner, ast.Call) or not inner.args or len(inner.args) < 2:
                    continue
                fname = getattr(inner.func, "id", getattr(inner.func, "attr", ""))
                if fname not in ("is_equiv", "_test_is_equiv", "_test_is_not_equiv"):
                    continue
                a = env.get(inner.args[0].id) if isinstance(inner.args[0], ast.Name) else _literal(inner.args[0])
                b = env.get(inner.args[1].id) if isinstance(inner.args[1], ast.Name) else _literal(inner.args[1])
                if not (isinstance(a, str) and isinstance(b, str)):
                    continue
                yield {"response": "\\boxed{" + b + "}", "answer": a, "label": node.func.attr == "assertTrue",
                       "source": source, "origin": f"{repo}:{path}::{fn.name}[{k}]"}
                k += 1


def tora_rows(git_dir: str) -> Iterator[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tora_grader.py")
        with open(path, "w") as fh:
            fh.write(git_show(git_dir, "src/eval/grader.py"))
        spec = importlib.util.spec_from_file_location("tora_grader", path)
        grader = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(grader)  # type: ignore[union-attr]
        for model in ("tora-70b-v1.0", "tora-code-34b-v1.0"):
            out = f"src/outputs/llm-agents/{model}/gsm8k/test_tora_-1_seed0_t0.0_s0_e1319.jsonl"
            for line in git_show(git_dir, out).splitlines():
                r = json.loads(line)
                yield {"response": r["code"][0], "answer": str(r["gt"]), "problem": r["question"],
                       "label": bool(grader.math_equal(r["pred"][0], r["gt"])),
                       "source": f"tora-gsm8k-{model.split('-v')[0]}", "origin": f"microsoft/ToRA:{out}#{r['idx']}"}


def split(rows: list[dict], seed: int = SPLIT_SEED) -> tuple[list[dict], list[dict]]:
    """Seeded 50/50 dev/test split within each source (the dev part gets the odd one)."""
    rng = random.Random(seed)
    dev, test = [], []
    for src in sorted({r["source"] for r in rows}):
        part = [r for r in rows if r["source"] == src]
        rng.shuffle(part)
        k = (len(part) + 1) // 2
        dev += part[:k]
        test += part[k:]
    return dev, test


def _write(path: str, rows: list[dict]) -> None:
    with open(path, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def main(argv: list[str]) -> int:
    mv, mario, hendrycks, tora, out_dir = argv
    rows = list(math_verify_rows(mv))
    rows += unittest_rows(mario, "math_evaluation/tests/test_is_equiv.py", "mario-eval-tests",
                          "MARIO-Math-Reasoning/MARIO_EVAL")
    rows += unittest_rows(hendrycks, "modeling/math_equivalence_test.py", "hendrycks-math-tests", "hendrycks/math")
    rows += tora_rows(tora)
    os.makedirs(out_dir, exist_ok=True)
    dev, test = split(rows)
    _write(os.path.join(out_dir, "labelled.jsonl"), rows)
    _write(os.path.join(out_dir, "dev.jsonl"), dev)
    _write(os.path.join(out_dir, "test.jsonl"), test)
    print(f"{len(rows)} rows -> {len(dev)} dev, {len(test)} test in {out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
