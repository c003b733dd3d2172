"""Every number in the hand-written prose around the claims tables is traced to the row and field it
comes from: the README's "Reproducing the paper" section and the WHOLE of paper_claims.md.

The generated blocks (claims-table, claims-summary, claims-reading, claims-final-cost,
claims-preregistration) are checked byte for byte by tests/test_claims.py. What is left may only hold
numbers of a small table of named facts (:func:`fact_table`, name -> value): each claims row's fields
(``row[fig4_heldout@entropy_regime_eval (ade61e88)].t_low``), its per-seed values and costs; the
results files' run counts and the few run values the prose cites (named by run); the sweep files and
the base experiment the page runs (``spec[mpt_threshold.yaml].eval.select_problems``); the paper's
numbers as the claim registry quotes them; the statistics' constants. A number matches a fact when
the fact, written at the number's own digits, IS the number (a signed number needs a signed fact, a
difference, of its sign; an unsigned number an unsigned fact); :func:`trace` names the facts a number
matches, and a number that matches none fails the test. The one hand table whose runs no results file
holds (the last round, its store lost) is recomputed from its own per-seed column instead."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from ulorl.eval import paired as P
from ulorl.report import claims as C
from ulorl.report.results import ResultsStore, decode_curve, read_records, results_files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
PAGE = ROOT / "platform" / "ulorl" / "docs" / "paper_claims.md"
NUMBER = re.compile(r"(?<![\w.])([+\-−]?)(\d+(?:\.\d+)?(?:e[+\-]?\d+)?)(?![\w])")
REFERENCE = re.compile(r"\b(?:Tables?|Figures?|Figs?\.|Fig\.)\s*\d+(?:\s*(?:-|/|,|and|&)\s*\d+)*")
PREREG = ("<!-- claims-preregistration:begin -->", "<!-- claims-preregistration:end -->")
BLOCKS = [(C.DOCS_BEGIN, C.DOCS_END), (C.SUMMARY_BEGIN, C.SUMMARY_END), (C.READING_BEGIN, C.READING_END),
          (C.FINAL_COST_BEGIN, C.FINAL_COST_END), PREREG]
LAST_ROUND = "**The last round, re-judged**"
LAST_ROUND_END = "i.e. +0.036)."
SPECS = [*sorted((ROOT / "sweeps" / "choice").glob("*.yaml")), ROOT / "sweeps" / "entropy" / "regime_eval.yaml",
         ROOT / "experiments" / "quickstart_choice.yaml"]

# A fact is (value, signed): a signed fact is a difference a - b, which only a signed number ("+0.027",
# "-0.079") may cite; an unsigned one (a count, an MDE, a setting) only an unsigned number. A run's step-1 entropy is
# cited only to show two runs bit-identical: it matches a number written to >= FULL digits only.
Facts = dict[str, tuple[float, bool]]
FULL = 9


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


def written_as(value: float, token: str) -> bool:
    """Whether ``value`` written at ``token``'s digits (and sign, for a signed token) is ``token``."""
    if "e" in token:
        return math.isclose(abs(value), abs(float(token)), rel_tol=1e-9) and (token[0] not in "+-"
                                                                            or (value < 0) == (token[0] == "-"))
    digits = len(token.split(".")[1]) if "." in token else 0
    if token[0] in "+-":
        return f"{value:+.{digits}f}" == token or (token[1:] == f"{0:.{digits}f}" and f"{value:+.{digits}f}"[1:]
                                                     == token[1:])
    return f"{abs(value):.{digits}f}" == token


def trace(token: str, facts: Facts) -> list[str]:
    """The names of the facts ``token`` is written from."""
    signed = token[0] in "+-"
    digits = len(token.split(".")[1]) if "." in token else 0
    return [name for name, (value, is_signed) in facts.items()
            if is_signed == signed and (digits >= FULL or not name.endswith("[full]"))
            and written_as(value, token)]


def _numbers_of(text: Any) -> list[float]:
    """Every number inside a string (``"Xeon(R) @ 2.60GHz"`` -> [2.6], ``"0-2"`` -> [0, 2])."""
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?", str(text))]


def _leaves(node: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [x for k, v in node.items() for x in _leaves(v, f"{path}.{k}" if path else str(k))]
    if isinstance(node, list):
        return [x for i, v in enumerate(node) for x in _leaves(v, f"{path}[{i}]")]
    return [(path, node)]


def row_facts(results: list[C.ClaimResult]) -> Facts:
    """Each claims row's fields, per-seed values, counts and costs, named by row and field."""
    out: Facts = {}
    signed = ("effect", "t_low", "t_high", "problem_effect", "problem_low", "problem_high", "paper_effect")
    plain = ("seeds", "problems", "mde", "mde_seeds", "mde_problems", "eq_margin", "eq_margin_seeds",
             "eq_margin_problems", "seeds_for_margin", "seeds_for_paper_effect", "margin", "eval_k")
    for r in results:
        row = f"row[{r.claim}@{r.sweep}]"
        for f in signed + plain:
            v = getattr(r, f)
            if v is not None:
                out[f"{row}.{f}"] = (float(v), f in signed)
        if r.eval_noise_share is not None:
            out[f"{row}.eval_noise_share%"] = (100 * r.eval_noise_share, False)
        diffs = [p["diff"] for p in r.per_seed]
        for i, p in enumerate(r.per_seed):
            out[f"{row}.per_seed[{i}].diff"] = (p["diff"], True)
        out[f"{row}.seeds_above_zero"] = (float(sum(x > 0 for x in diffs)), False)
        out[f"{row}.seeds_below_zero"] = (float(sum(x < 0 for x in diffs)), False)
        for arm, k in r.costs.items():
            if "wall_s" not in k:
                continue
            out[f"{row}.cost[{arm}].wall_min"] = (k["wall_s"] / 60, False)
            for x in ("eval_s", "final_eval_s", "runs", "final_min_s", "final_max_s", "final_vs_periodic"):
                if x in k:
                    out[f"{row}.cost[{arm}].{x}"] = (float(k[x]), False)
            for x in ("eval_share", "final_share", "final_added"):
                if x in k:
                    out[f"{row}.cost[{arm}].{x}%"] = (100 * k[x], False)
    return out


def results_file_facts() -> Facts:
    """Per results file: its runs and arms, first start to last end (minutes); per run the values the
    prose cites of it: its step-1 entropy, its last held-out value, the selection score and tau /
    sigma of a search trial, and the CPU / cores its tags name."""
    out: Facts = {}
    for path in results_files([RESULTS]):
        records = read_records(path)
        name = path.stem
        if not records or "tags" not in records[0]:
            continue
        out[f"file[{name}].runs"] = (float(len(records)), False)
        out[f"file[{name}].arms"] = (float(len({r["tags"].get("ulorl.variant", "") for r in records})), False)
        starts = [r["start_time"] for r in records]
        ends = [r["start_time"] + 1000 * r["metrics"].get("time/wall_s", 0.0) for r in records]
        out[f"file[{name}].span_min"] = ((max(ends) - min(starts)) / 60_000, False)
        for r in records:
            run = f"run[{name}:{r['run_id'][:8]}]"
            if C.ENTROPY in r["curves"]:
                out[f"{run}.entropy[step 1][full]"] = (float(decode_curve(r["curves"][C.ENTROPY])[1][0]), False)
            if C.HELDOUT in r["curves"]:
                out[f"{run}.heldout[last]"] = (float(decode_curve(r["curves"][C.HELDOUT])[1][-1]), False)
            if "eval/heldout_select/avg_at_k" in r["metrics"]:
                out[f"{run}.heldout_select"] = (float(r["metrics"]["eval/heldout_select/avg_at_k"]), False)
                for key in ("algo.mpt.tau", "algo.mpt.sigma"):
                    out[f"{run}.{key}"] = (float(r["params"][key]), False)
            for tag in ("ulorl.hw.cpu", "ulorl.hw.cores"):
                for j, v in enumerate(_numbers_of(r["tags"].get(tag, ""))):
                    out[f"{run}.{tag}[{j}]"] = (v, False)
        out.update(_arm_differences(name, records))
    return out


def _arm_differences(name: str, records: list[dict[str, Any]]) -> Facts:
    """Per seed, each arm minus the file's masking-off arm (variant "off"), on final entropy (mean of the
    last 10 steps) and the last held-out value: what the page cites of arms no claims row compares."""
    by_arm: dict[str, dict[str, dict[str, Any]]] = {}
    for rec in records:
        by_arm.setdefault(rec["tags"].get("ulorl.variant", ""), {})[rec["tags"].get("ulorl.seed_offset", "0")] = rec

    def value(rec: dict[str, Any], key: str) -> float | None:
        if key not in rec["curves"]:
            return None
        values = decode_curve(rec["curves"][key])[1]
        return float(np.mean(values[-C.FINAL_WINDOW:])) if key == C.ENTROPY else float(values[-1])

    out: Facts = {}
    for arm in sorted(set(by_arm) - {"off"}):
        for seed in sorted(set(by_arm[arm]) & set(by_arm.get("off", {}))):
            for key, label in ((C.ENTROPY, "entropy"), (C.HELDOUT, "heldout")):
                va, vb = value(by_arm[arm][seed], key), value(by_arm["off"][seed], key)
                if va is not None and vb is not None:
                    out[f"file[{name}].{arm}-off[seed {seed}].{label}"] = (va - vb, True)
    return out


def spec_facts() -> Facts:
    """The values of the sweep files and the base experiment the page runs (YAML values, not comments;
    a seed range "0-2" gives its ends)."""
    out: Facts = {}
    for path in SPECS:
        for key, value in _leaves(yaml.safe_load(path.read_text())):
            if isinstance(value, bool):
                continue
            for j, v in enumerate(_numbers_of(value) if isinstance(value, str) else [value]):
                if isinstance(v, (int, float)):
                    out[f"spec[{path.name}].{key}" + (f"[{j}]" if j else "")] = (float(v), False)
    return out


def derived_facts() -> Facts:
    """The embedded task's held-out items the final evaluation draws from (eval/final.py): its default
    split is items 0..num_heldout-1, the final candidates the next eval.final.num_problems."""
    from ulorl.config import DataConfig

    split = DataConfig().task.num_heldout
    final = yaml.safe_load((ROOT / "sweeps/choice/output_length.yaml").read_text())["overrides"]
    return {"derived.heldout_split_last_item": (float(split - 1), False),
            "derived.final_candidates_first_item": (float(split), False),
            "derived.final_candidates_last_item": (float(split + final["eval.final.num_problems"] - 1), False)}


def fact_table(results: list[C.ClaimResult]) -> Facts:
    facts: Facts = {"const.level_directional%": (100 * P.LEVEL_DIRECTIONAL, False),
                    "const.level_equivalence%": (100 * P.LEVEL_EQUIVALENCE, False),
                    "const.power%": (100 * P.POWER, False), "const.min_t_seeds": (float(P.MIN_T_SEEDS), False),
                    "const.alpha": (P.ALPHA, False), "const.final_window": (float(C.FINAL_WINDOW), False)}
    facts.update(row_facts(results))
    for c in C.CLAIMS:
        for j, v in enumerate(_numbers_of(c.paper_says)):
            facts[f"claim[{c.name}].paper_says[{j}]"] = (v, False)
        for j, v in enumerate(_numbers_of(c.a.label) + _numbers_of(c.b.label)):
            facts[f"claim[{c.name}].arm_label[{j}]"] = (v, False)
        if c.paper_effect is not None:
            facts[f"claim[{c.name}].paper_effect"] = (c.paper_effect, True)
    facts.update(results_file_facts())
    facts.update(spec_facts())
    facts.update(derived_facts())
    return {k: (v, s) for k, (v, s) in facts.items() if math.isfinite(v)}


@pytest.fixture(scope="module")
def facts() -> Facts:
    return fact_table(C.evaluate_claims(ResultsStore.open(RESULTS)))


def _section(text: str, heading: str) -> str:
    """From ``heading`` to the next heading of its level (or the end)."""
    start = text.index(heading)
    level = heading.split(" ")[0] + " "
    nxt = text.find("\n" + level, start + len(heading))
    return text[start: nxt if nxt >= 0 else len(text)]


def prose(path: str) -> str:
    """README: its "Reproducing the paper" section; paper_claims.md: the whole page but the last round's
    table and the sentence under it (recomputed from its own per-seed column below)."""
    text = (ROOT / path).read_text()
    if path == "README.md":
        return _section(text, "## Reproducing the paper")
    start, stop = text.index(LAST_ROUND), text.index(LAST_ROUND_END) + len(LAST_ROUND_END)
    return text[:start] + text[stop:]


def untraced(text: str, facts: Facts) -> list[str]:
    return [t for t in numbers_in(text) if not trace(t, facts)]


@pytest.mark.parametrize("path", ["README.md", "platform/ulorl/docs/paper_claims.md"])
def test_every_number_in_the_claims_prose_is_traced_to_a_row_and_field(path: str, facts: Facts) -> None:
    tokens = numbers_in(prose(path))
    assert len(tokens) > 20, f"{path}: few numbers found: the section moved?"
    unknown = untraced(prose(path), facts)
    assert not unknown, f"{path}: numbers no row, field, results file or spec gives: {unknown}"


def test_a_planted_wrong_number_fails_the_check(facts: Facts) -> None:
    text = prose("platform/ulorl/docs/paper_claims.md")
    # the headline's best search trial scored 0.727 on the selection problems; Table 3's row +0.116
    assert trace("0.727", facts) and any(".heldout_select" in n for n in trace("0.727", facts))
    assert any(n.startswith("row[table3_heldout@") and n.endswith(".effect") for n in trace("+0.116", facts))
    assert "0.727" in text and "row holds:\n+0.116" in text and not untraced(text, facts)
    for right, wrong, token in (("scored 0.727", "scored 0.737", "0.737"),
                                ("row holds:\n+0.116", "row holds:\n+0.917", "+0.917"),
                                ("53 min from", "58 min from", "58")):
        assert not trace(token, facts), token
        planted = text.replace(right, wrong, 1)
        assert planted != text
        assert untraced(planted, facts) == [token], wrong


def test_random_numbers_are_mostly_rejected(facts: Facts) -> None:
    # the old check accepted ~74 % of random signed 3-decimal numbers in [0, 0.3]; a trace to a named fact
    # at the written digits accepts 28 % of them (the per-seed differences of 23 rows) and 15 % of unsigned ones
    rng = random.Random(0)
    signed = [f"{rng.choice('+-')}{rng.randint(0, 300) / 1000:.3f}" for _ in range(1000)]
    plain = [f"{rng.randint(0, 300) / 1000:.3f}" for _ in range(1000)]
    signed_rate = sum(bool(trace(t, facts)) for t in signed) / len(signed)
    plain_rate = sum(bool(trace(t, facts)) for t in plain) / len(plain)
    assert signed_rate < 0.35 and plain_rate < 0.20, (signed_rate, plain_rate)


def test_number_matching_reads_the_digits_written() -> None:
    facts: Facts = {"d": (0.1075093, False), "e": (0.02734, True), "m": (52.8, False), "n": (-0.02734, True)}
    assert trace("0.108", facts) == ["d"] and trace("+0.027", facts) == ["e"] and trace("-0.027", facts) == ["n"]
    assert trace("0.11", facts) == ["d"] and not trace("0.12", facts) and not trace("+0.108", facts)
    assert not trace("0.027", facts)                 # a difference is cited with its sign
    assert trace("53", facts) == ["m"] and not trace("54", facts)
    assert not trace("0.196", {"run[x].entropy[step 1][full]": (0.196258723735809, False)})
    assert trace("0.196258723735809", {"run[x].entropy[step 1][full]": (0.196258723735809, False)})
    assert numbers_in("seeds 0-7 (`--seeds 3-7`) of Fig. 4 / 5, +0.036 and 1/128 [x](paper_claims.md)") == \
        ["0", "7", "+0.036", "1", "128"]


def _last_round_rows() -> list[list[str]]:
    text = PAGE.read_text()
    block = text[text.index(LAST_ROUND):]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| claim")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows]


def test_the_last_round_table_is_recomputed_from_its_per_seed_column() -> None:
    rows = _last_round_rows()
    assert len(rows) == 13
    spreads: dict[str, list[float]] = {"heldout": [], "entropy": []}
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
        word = P.verdict(0 if equivalence else 1, [(lo, hi)], len(diffs), 0.05 if equivalence else None,
                         t_usable=True)
        assert now.replace("**", "").split(":")[0] == word, claim
        if not equivalence:
            spreads["entropy" if entropy else "heldout"].append(float(mde))
    # the sentence under it: the ranges of those MDEs, the paper's difference
    text = PAGE.read_text()
    sentence = text[text.index("With three seeds the design"):]
    assert f"{min(spreads['heldout']):.3f}-{max(spreads['heldout']):.3f}" in sentence
    assert f"{min(spreads['entropy']):.4f}-{max(spreads['entropy']):.3f}" in sentence
    headline = next(c for c in C.CLAIMS if c.name == "headline")
    assert headline.paper_effect is not None and f"{headline.paper_effect:+.3f}" in sentence


def test_paper_effects_are_the_papers_own_numbers() -> None:
    paper = (ROOT / "platform/ulorl/docs/PAPER.md").read_text()
    for c in C.CLAIMS:
        if c.paper_effect is None:
            continue
        m = re.search(r"(\d+\.\d) vs [^\d]*(\d+\.\d)", c.paper_says)
        assert m is not None
        a, b = (float(x) for x in m.groups())
        assert c.paper_effect == pytest.approx((a - b) / 100)
        assert f"| {a} |" in paper and f"| {b} |" in paper          # Table 2's AVG column


def test_the_fact_table_is_small_and_names_its_sources(facts: Facts) -> None:
    # the old pool held ~16,000 numbers (every param, tag, date and curve end of every run); this one
    # names each fact by its row / file / spec and field
    assert len(facts) < 2500
    assert all(re.match(r"(const|row|claim|file|run|spec|derived)[\[.]", name) for name in facts)
    assert any(n.endswith(".mde") for n in trace("0.113", facts))           # the headline's MDE
    assert not trace("0.0251", facts) and not trace("+0.3141", facts)
    assert np.isfinite([v for v, _ in facts.values()]).all()
