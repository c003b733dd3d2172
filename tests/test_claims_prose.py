"""Every number in the prose around the generated claims tables is generated or checked here against the
committed results files: the README's "Reproducing the paper" section and paper_claims.md from
"## Verdicts" on. The generated blocks (claims-table, claims-summary, claims-reading) are checked by
tests/test_claims.py; what is left, the hand-written sentences, may only hold numbers that the results
files (or the claims computed from them, the claim registry, the sweep files) give, to the digits
written. The one hand table whose runs no results file holds (the last round, its store lost) is
recomputed from its own per-seed column."""

from __future__ import annotations

import datetime
import math
import re
from pathlib import Path

import numpy as np
import pytest

from ulorl.eval import paired as P
from ulorl.report import claims as C
from ulorl.report.results import ResultsStore, decode_curve, read_records, results_files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
NUMBER = re.compile(r"(?<![\w.])([+\-−]?)(\d+(?:\.\d+)?(?:e[+\-]?\d+)?)(?![\w])")
REFERENCE = re.compile(r"\b(?:Tables?|Figures?|Figs?\.|Fig\.)\s*\d+(?:\s*(?:-|/|,|and|&)\s*\d+)*")
BLOCKS = [(C.DOCS_BEGIN, C.DOCS_END), (C.SUMMARY_BEGIN, C.SUMMARY_END), (C.READING_BEGIN, C.READING_END),
          (C.FINAL_COST_BEGIN, C.FINAL_COST_END)]


def numbers_in(text: str) -> list[str]:
    """The number tokens of hand-written prose: without generated blocks, fenced code, code spans,
    link targets, HTML comments and references to the paper's tables and figures ("Fig. 4 / 5")."""
    for begin, end in BLOCKS:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), " ", text, flags=re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = REFERENCE.sub(" ", text)
    return [sign.replace("−", "-") + num for sign, num in NUMBER.findall(text)]


def matches(token: str, facts: list[float]) -> bool:
    """``token`` is a fact written to its digits: within half a unit of its last digit (a signed
    token must have the fact's sign; an unsigned one may be a magnitude)."""
    signed = token[0] in "+-"
    value = float(token)
    if "e" in token:
        return any(math.isclose(value, f, rel_tol=1e-9) or math.isclose(value, -f, rel_tol=1e-9) for f in facts)
    digits = len(token.split(".")[1]) if "." in token else 0
    tol = 0.5 * 10.0 ** -digits + 1e-12
    return any(abs(g - value) <= tol for f in facts for g in ((f,) if signed else (f, -f)))


def _numbers_of(text: str) -> list[float]:
    """Every number inside a string (``"Xeon(R) @ 2.60GHz"`` -> [2.6])."""
    return [float(x) for x in re.findall(r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?", str(text).replace("−", "-"))]


def _arm_differences(records: list[dict]) -> list[float]:
    """Per-seed differences between every two arms (variants) of one sweep, on final entropy (mean
    of the last 10 steps) and the last held-out value: what a sentence may cite beyond the claim rows."""
    by_arm: dict[str, dict[str, dict]] = {}
    for rec in records:
        by_arm.setdefault(rec["tags"].get("ulorl.variant", ""), {})[rec["tags"].get("ulorl.seed_offset", "0")] = rec
    def value(rec: dict, key: str) -> float | None:
        curve = rec["curves"].get(key)
        if curve is None:
            return None
        values = decode_curve(curve)[1]
        return float(np.mean(values[-C.FINAL_WINDOW:])) if key == C.ENTROPY else values[-1]
    out = []
    for a in by_arm:
        for b in by_arm:
            for seed in set(by_arm[a]) & set(by_arm[b]):
                for key in (C.ENTROPY, C.HELDOUT):
                    va, vb = value(by_arm[a][seed], key), value(by_arm[b][seed], key)
                    if a != b and va is not None and vb is not None:
                        out.append(va - vb)
    return out


def results_facts() -> list[float]:
    """Every number the committed results files give, and the claims computed from them."""
    results = C.evaluate_claims(ResultsStore.open(RESULTS))
    facts: list[float] = [100 * P.LEVEL_DIRECTIONAL, 100 * P.LEVEL_EQUIVALENCE, 100 * P.POWER, P.MIN_T_SEEDS]
    for r in results:
        for v in (r.seeds, r.effect, r.t_low, r.t_high, r.problem_effect, r.problem_low, r.problem_high, r.problems,
                  r.mde, r.mde_seeds, r.mde_problems, r.eq_margin, r.eq_margin_seeds, r.eq_margin_problems,
                  r.seeds_for_margin, r.seeds_for_paper_effect, r.paper_effect, r.margin, r.eval_k,
                  None if r.eval_noise_share is None else 100 * r.eval_noise_share):
            if v is not None:
                facts.append(float(v))
        diffs = [p["diff"] for p in r.per_seed]
        facts += diffs + [p["a"] for p in r.per_seed] + [p["b"] for p in r.per_seed]
        facts += [sum(x > 0 for x in diffs), sum(x < 0 for x in diffs), len(diffs)]
        for k in r.costs.values():
            if "wall_s" in k:
                facts += [k["wall_s"], k["wall_s"] / 60]
                facts += [k[x] for x in ("eval_s", "final_eval_s") if x in k]
                facts += [100 * k[x] / k["wall_s"] for x in ("eval_s", "final_eval_s") if x in k]
                facts += [k[x] for x in ("runs", "final_min_s", "final_max_s", "final_vs_periodic") if x in k]
                facts += [100 * k[x] for x in ("eval_share", "final_share", "final_added") if x in k]
    for c in C.CLAIMS:
        facts += _numbers_of(c.paper_says) + _numbers_of(c.a.label) + _numbers_of(c.b.label)
    for path in results_files([RESULTS]):
        records = read_records(path)
        facts.append(len(records))
        arms = {rec["tags"].get("ulorl.variant", "") for rec in records}
        facts.append(len(arms))
        starts = [rec["start_time"] for rec in records]
        ends = [rec["start_time"] + 1000 * rec["metrics"].get("time/wall_s", 0.0) for rec in records]
        facts.append((max(ends) - min(starts)) / 60_000)                       # first start to last end, minutes
        facts += _arm_differences(records)
        for rec in records:
            for v in list(rec["params"].values()) + list(rec["tags"].values()):
                facts += _numbers_of(v)
            for curve in rec["curves"].values():
                _, values = decode_curve(curve)
                facts += [values[0], values[-1]]
            day = datetime.datetime.fromtimestamp(rec["start_time"] / 1000, datetime.UTC)
            facts += [day.year, day.month, day.day]
    for spec in sorted((ROOT / "sweeps" / "choice").glob("*.yaml")):
        facts += _numbers_of(spec.read_text())
    return [f for f in facts if math.isfinite(f)]


@pytest.fixture(scope="module")
def facts() -> list[float]:
    return results_facts()


def _section(text: str, heading: str) -> str:
    """From ``heading`` to the next heading of its level (or the end)."""
    start = text.index(heading)
    level = heading.split(" ")[0] + " "
    nxt = text.find("\n" + level, start + len(heading))
    return text[start: nxt if nxt >= 0 else len(text)]


LAST_ROUND = "**The last round, re-judged**"


@pytest.mark.parametrize("path, heading", [("README.md", "## Reproducing the paper"),
                                           ("platform/ulorl/docs/paper_claims.md", "## Verdicts")])
def test_every_number_in_the_prose_around_the_claims_tables_comes_from_the_results(
        path: str, heading: str, facts: list[float]) -> None:
    text = _section((ROOT / path).read_text(), heading)
    if LAST_ROUND in text:          # its table and the sentence under it: the next test
        text = text[: text.index(LAST_ROUND)]
    tokens = numbers_in(text)
    assert tokens, f"{path}: no numbers found: the section moved?"
    unknown = [t for t in tokens if not matches(t, facts)]
    assert not unknown, f"{path} ({heading}): numbers no results file gives: {unknown}"


def test_number_matching_reads_the_digits_written() -> None:
    assert matches("0.108", [0.1075093]) and matches("+0.027", [0.02734]) and not matches("-0.027", [0.02734])
    assert matches("0.027", [-0.02734]) and matches("0.11", [0.1075093]) and not matches("0.12", [0.1075093])
    assert matches("53", [52.8]) and not matches("54", [52.8])
    assert numbers_in("seeds 0-7 (`--seeds 3-7`) of Fig. 4 / 5, +0.036 and 1/128 [x](paper_claims.md)") == \
        ["0", "7", "+0.036", "1", "128"]


def _last_round_rows() -> list[list[str]]:
    text = (ROOT / "platform/ulorl/docs/paper_claims.md").read_text()
    block = text[text.index(LAST_ROUND):]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| claim")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows]


def test_the_last_round_table_is_recomputed_from_its_per_seed_column() -> None:
    rows = _last_round_rows()
    assert len(rows) == 13
    spreads = {"heldout": [], "entropy": []}
    for claim, per_seed, interval, mde, _then, now in rows:
        diffs = [float(x) for x in re.findall(r"[+-]\d+\.\d+", per_seed)]
        if "selected" in claim or "selected" in per_seed:   # the withdrawn headline: 2 identical re-runs
            assert not P.seed_interval_usable(diffs[1:])[0] and mde == "—"
            continue
        digits = len(re.findall(r"[+-]\d+\.(\d+)", interval)[0])
        entropy = "entropy" in claim
        if not entropy:   # held-out: multiples of 1/128
            diffs = [round(x * 128) / 128 for x in diffs]
        equivalence = "within +-0.05" in claim
        level = P.LEVEL_EQUIVALENCE if equivalence else P.LEVEL_DIRECTIONAL
        _, lo, hi = P.t_interval(diffs, 1 - level)
        # the per-seed column is rounded (entropy: to its printed digits): one unit of the last digit of slack
        tol = 1.5 * 10.0 ** -digits
        written = [float(x) for x in re.findall(r"[+-]\d+\.\d+", interval)]
        assert written == pytest.approx([lo, hi], abs=tol) and f"({100 * level:.0f} %)" in interval, claim
        value = P.equivalence_margin_seeds(diffs) if equivalence else P.mde_seeds(diffs, level)
        assert value is not None and mde.startswith("margin " if equivalence else "0"), claim
        assert float(mde.split()[-1]) == pytest.approx(value, abs=tol), claim
        word = P.verdict(0 if equivalence else 1, [(lo, hi)], len(diffs), 0.05 if equivalence else None)
        assert now.replace("**", "").split(":")[0] == word, claim
        if not equivalence:
            spreads["entropy" if entropy else "heldout"].append(float(mde))
    # the sentence under it: the ranges of those MDEs, the paper's difference
    text = (ROOT / "platform/ulorl/docs/paper_claims.md").read_text()
    sentence = text[text.index("With three seeds the design"):]
    assert f"{min(spreads['heldout']):.3f}-{max(spreads['heldout']):.3f}" in sentence
    assert f"{min(spreads['entropy']):.4f}-{max(spreads['entropy']):.3f}" in sentence
    headline = next(c for c in C.CLAIMS if c.name == "headline")
    assert f"{headline.paper_effect:+.3f}" in sentence


def test_paper_effects_are_the_papers_own_numbers() -> None:
    paper = (ROOT / "platform/ulorl/docs/PAPER.md").read_text()
    for c in C.CLAIMS:
        if c.paper_effect is None:
            continue
        a, b = (float(x) for x in re.search(r"(\d+\.\d) vs [^\d]*(\d+\.\d)", c.paper_says).groups())
        assert c.paper_effect == pytest.approx((a - b) / 100)
        assert f"| {a} |" in paper and f"| {b} |" in paper          # Table 2's AVG column


def test_results_facts_see_the_committed_files(facts: list[float]) -> None:
    # a guard against a vacuous check: the headline's effect, MDE and search scores are facts, a
    # number no file gives is not
    assert matches("+0.027", facts) and matches("0.108", facts) and matches("0.727", facts)
    assert not matches("0.0251", facts) and not matches("+0.3141", facts)
