"""Rebuild ``verifier_hard.jsonl``: real model responses to competition problems, and olympiad graders' cases.

    python tests/data/build_hard_labelled.py MATH_V_GIT NEMO_SKILLS_GIT OLYMPIADBENCH_GIT OUT.jsonl

Each argument is a git directory (bare clone) of the named repository; files are read from its HEAD
with ``git show``. Every row keeps the third party's verdict as ``source_label``; ``label`` is that
verdict, except where ``verifier_hard_audit.json`` (next to this script) records a hand check that
found it wrong (``label_note`` says why). ``split`` is ``dev`` or ``test``: a seeded 50/50 split
within each source, made before any verifier change (tune on dev, report on test).

* mathllm/MATH-V (MIT), ``outputs/**/{GPT4-CoT (Text Only),Gemini-Pro-CoT,Qwen-VL-Max-CoT,
  InternLM-XComposer2-VL-CoT}.jsonl``: published responses of four models to MATH-Vision test
  problems (3,040 problems from real mathematics competitions: Kangaroo, AMC, AIME, ...).
  ``answer`` = the problem's reference (an option letter for multiple choice), ``problem`` = the
  question with its option texts (when the options are not bare letters), ``source_label`` = the
  published ``correct`` field (MATH-V's own grader, ``evaluation/utils.py``). Per model a seeded
  sample of ``PER_LABEL`` rows labelled correct and ``PER_LABEL`` labelled wrong (the models get
  8-14 % right, so a plain sample would hold few correct responses).
* NVIDIA/NeMo-Skills (Apache-2.0), ``tests/test_math_equal.py``: ``math_equal(a, b)`` cases, which
  the tests assert in both argument orders -> two rows per case, ``response = "\\boxed{pred}"``.
* OpenBMB/OlympiadBench (MIT), ``eval/scoring_examples.json``: its grader's cases ``GT`` vs
  ``answer`` with ``equal``; cases that set a numeric ``precision`` are left out.
"""

from __future__ import annotations

import ast
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator

SPLIT_SEED = 29
SAMPLE_SEED = 29
PER_LABEL = 200
MATHV_MODELS = {
    "mathv-gpt4-cot": "outputs/closed-source/GPT/GPT4-CoT (Text Only).jsonl",
    "mathv-gemini-pro-cot": "outputs/closed-source/Gemini/Gemini-Pro-CoT.jsonl",
    "mathv-qwen-vl-max-cot": "outputs/closed-source/Qwen/Qwen-VL-Max-CoT.jsonl",
    "mathv-internlm-xc2-cot": "outputs/open-source/Internlm/InternLM-XComposer2-VL-CoT.jsonl",
}
AUDIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verifier_hard_audit.json")


def git_show(git_dir: str, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def _letters_only(options: list[str]) -> bool:
    return all(len(o.strip().strip("().").strip()) == 1 for o in options)


def mathv_problem(item: dict) -> str:
    """The question, with ``(A) ... (B) ...`` option texts appended when the options have texts."""
    q = item["question"]
    opts = item["options"]
    if opts and not _letters_only(opts):
        q += "\n\nChoices: " + " ".join(f"({chr(65 + i)}) {o}" for i, o in enumerate(opts))
    return q


def mathv_rows(git_dir: str) -> Iterator[dict]:
    problems = {}
    for line in git_show(git_dir, "data/test.jsonl").splitlines():
        if line.strip():
            p = json.loads(line)
            problems[p["id"]] = p
    for source, path in MATHV_MODELS.items():
        rows = [json.loads(line) for line in git_show(git_dir, path).splitlines() if line.strip()]
        rng = random.Random(f"{SAMPLE_SEED}:{source}")
        picked = []
        for want in (True, False):
            part = [r for r in rows if bool(r["correct"]) is want]
            picked += rng.sample(part, min(PER_LABEL, len(part)))
        for r in sorted(picked, key=lambda r: int(r["id"])):
            p = problems[r["id"]]
            yield {"response": r["response"], "answer": str(p["answer"]), "problem": mathv_problem(p),
                   "source_label": bool(r["correct"]), "source": source,
                   "origin": f"mathllm/MATH-V:{path}#{r['id']}"}


def _as_text(x: object) -> str:
    return x if isinstance(x, str) else repr(x)


def nemo_rows(git_dir: str) -> Iterator[dict]:
    path = "tests/test_math_equal.py"
    tree = ast.parse(git_show(git_dir, path))
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name not in ("test_correct_examples", "test_incorrect_examples"):
            continue
        label = fn.name == "test_correct_examples"
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"):
                continue
            for i, node in enumerate(dec.args[1].elts):  # type: ignore[attr-defined]
                try:
                    a, b = ast.literal_eval(node)
                except ValueError:  # a constant expression such as (5 / 2, "\\frac{5}{2}")
                    a, b = eval(compile(ast.Expression(node), path, "eval"), {"__builtins__": {}})  # noqa: S307
                if a is None or b is None:
                    continue
                for k, (gold, pred) in enumerate(((a, b), (b, a))):
                    yield {"response": "\\boxed{" + _as_text(pred) + "}", "answer": _as_text(gold),
                           "source_label": label, "source": "nemo-skills-tests",
                           "origin": f"NVIDIA/NeMo-Skills:{path}::{fn.name}[{i}]{'ab'[k]}"}


def olympiadbench_rows(git_dir: str) -> Iterator[dict]:
    path = "eval/scoring_examples.json"
    for i, case in enumerate(json.loads(git_show(git_dir, path))):
        for j, ans in enumerate(case["Ans"]):
            if "precision" in ans:
                continue
            pred = ans["answer"]
            response = pred if "\\boxed" in pred else "\\boxed{" + pred + "}"
            yield {"response": response, "answer": case["GT"], "source_label": bool(ans["equal"]),
                   "source": "olympiadbench-scoring", "origin": f"OpenBMB/OlympiadBench:{path}#{i}.{j}"}


def split(rows: list[dict], seed: int = SPLIT_SEED) -> None:
    """Seeded 50/50 dev/test split within each source, written into each row (dev gets the odd one)."""
    rng = random.Random(seed)
    for src in sorted({r["source"] for r in rows}):
        part = [r for r in rows if r["source"] == src]
        rng.shuffle(part)
        k = (len(part) + 1) // 2
        for n, r in enumerate(part):
            r["split"] = "dev" if n < k else "test"


def apply_audit(rows: list[dict], audit: dict[str, dict]) -> None:
    """``label`` = the source's verdict unless a hand check in ``audit`` (origin -> {label, note}) says otherwise."""
    by_origin = {r["origin"]: r for r in rows}
    for origin in audit:
        if origin not in by_origin:
            raise SystemExit(f"{AUDIT}: origin {origin!r} is not a row of the set")
    for r in rows:
        a = audit.get(r["origin"])
        r["label"] = bool(a["label"]) if a else r["source_label"]
        if a:
            r["label_note"] = a["note"]


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    mathv, nemo, olympiad, out = argv
    rows = list(mathv_rows(mathv)) + list(nemo_rows(nemo)) + list(olympiadbench_rows(olympiad))
    split(rows)
    audit = json.load(open(AUDIT)) if os.path.exists(AUDIT) else {}
    apply_audit(rows, {k: v for k, v in audit.items() if not k.startswith("_")})
    keys = ("response", "answer", "problem", "label", "source_label", "label_note", "source", "origin", "split")
    with open(out, "w") as fh:
        for r in rows:
            fh.write(json.dumps({k: r[k] for k in keys if k in r}, ensure_ascii=False) + "\n")
    print(f"{len(rows)} rows ({sum(r['split'] == 'test' for r in rows)} test) -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
