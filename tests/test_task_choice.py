"""The ``choice`` embedded task: every drawn solution is correct, its entropy is exact, splits are disjoint."""

from __future__ import annotations

import math
import random
import re

import pytest

from ulorl.data import task_choice as tc
from ulorl.data.profiles import get_profile, parse_embedded, profile_names
from ulorl.data.task import is_correct


def test_line_forms_hand_derived() -> None:
    assert tc.format_line(68, [67, 12], 0) == "68+67+12=147"
    assert tc.format_line(68, [67, 12], 1) == "67+68+12=147"
    assert tc.format_line(68, [67, 12], 2) == "67+12+68=147"
    assert tc.format_line(68, [67], tc.CONTINUE) == "+67=135"
    spaced = tc.LineStyle(plus_space=True, eq_space=True)
    assert tc.format_line(68, [67], 1, spaced) == "67 + 68 = 135"
    assert tc.format_line(68, [67], 0, tc.LineStyle(eq_space=True)) == "68+67 = 135"
    assert tc.format_line(68, [67], tc.CONTINUE, spaced) == "+ 67 = 135"
    with pytest.raises(ValueError):
        tc.format_line(68, [67], 2)
    assert tc.solve([23, 45, 67]) == "23+45=68\n68+67=135\n\\boxed{135}"
    assert tc.derivation([23, 45, 67, 12], [2, 1], [1, tc.CONTINUE]) == "45+23+67=135\n+12=147\n\\boxed{147}"
    styles = [tc.LineStyle(separator=", "), tc.LineStyle(plus_space=True, separator="; "), tc.LineStyle(separator=" ")]
    # a line's separator joins it to the next; the last line always ends in a newline before the answer
    assert tc.derivation([23, 45, 67, 12], [1, 1, 1], [0, 1, 0], styles) == "23+45=68, 67 + 68=135; 135+12=147\n\\boxed{147}"
    with pytest.raises(ValueError):
        tc.derivation([23, 45, 67], [1, 1], [tc.CONTINUE, 0])  # no running sum yet
    with pytest.raises(ValueError):
        tc.derivation([23, 45, 67], [1], [0])                    # groups must cover every term
    with pytest.raises(ValueError, match="one style per line"):
        tc.derivation([23, 45, 67], [1, 1], [0, 0], styles)


def _lines(text: str) -> list[str]:
    """The derivation lines of a solution (separators and the boxed answer removed)."""
    body = text.rsplit("\n", 1)[0] if "\n" in text else ""
    return [ln for ln in re.split(r"\n|, |; |(?<=\d) (?=\d)", body) if ln]


def test_every_sampled_solution_is_correct_and_line_sums_hold() -> None:
    rng = random.Random(1)
    items = tc.make_split("train", 200, seed=2)
    kinds, seps, swapped, spaced = set(), set(), 0, 0
    for it in items:
        terms = it.meta["terms"]
        for _ in range(3):
            text, h = tc.sample_solution(terms, rng)
            assert is_correct(text, it.answer), text
            assert h > 0
            lines = _lines(text)
            kinds.add("derive" if lines else "guess")
            if lines:
                assert len(lines) == len(terms) - 1, text  # one term per line (max_group 1)
            seps.update(sep for sep in ("\n", ", ", "; ") if sep in text.rsplit("\n", 1)[0])
            prev = terms[0]
            for j, line in enumerate(lines):  # each line adds the next term to the running sum, either order
                lhs, rhs = line.replace(" ", "").split("=")
                ops = [int(x) for x in lhs.split("+")]
                assert sorted(ops) == sorted([prev, terms[j + 1]]) and sum(ops) == int(rhs), text
                swapped += ops[0] != prev
                spaced += " " in line
                prev = int(rhs)
    assert kinds == {"guess", "derive"} and seps == {"\n", ", ", "; "}
    assert swapped > 100 and spaced > 100


def test_self_information_matches_the_law() -> None:
    """k = 2: a guess (p = 0.15) or one line: running sum first or second, '+' and '=' spaced or not
    (8 forms, p = 0.85 / 8 each; the last line's newline is fixed)."""
    spec = tc.CHOICE_SPEC
    rng = random.Random(0)
    seen = {}
    for _ in range(2000):
        text, h = tc.sample_solution([23, 45], rng, spec)
        seen[text] = h
    assert len(seen) == 9
    assert seen["\\boxed{68}"] == pytest.approx(-math.log(0.15))
    for form in ("23+45=68", "45 + 23=68", "23+45 = 68", "45 + 23 = 68"):
        assert seen[form + "\n\\boxed{68}"] == pytest.approx(-math.log(0.85 / 8))
    # three terms: the first line's separator is a choice among four
    text, h = tc.sample_solution([23, 45, 67], random.Random(3), spec)
    if not text.startswith("\\boxed"):
        assert h == pytest.approx(-math.log(0.85 / 8 / 8 / 4))
    # the mean self-information is the law's entropy: k = 2 has H = H(0.15) + 0.85 ln 8
    draws = [tc.sample_solution([23, 45], random.Random(i), spec)[1] for i in range(4000)]
    h_law = -(0.15 * math.log(0.15) + 0.85 * math.log(0.85)) + 0.85 * math.log(8)
    assert sum(draws) / len(draws) == pytest.approx(h_law, rel=0.03)


def test_terms_distinct_splits_disjoint_deterministic() -> None:
    tr = tc.make_split("train", 300, seed=0)
    ho = tc.make_split("heldout", 100, seed=0)
    assert {x.prompt for x in tr}.isdisjoint({x.prompt for x in ho})
    assert all(not tc.is_heldout(x.meta["terms"]) for x in tr) and all(tc.is_heldout(x.meta["terms"]) for x in ho)
    assert all(len(set(x.meta["terms"])) == len(x.meta["terms"]) for x in tr + ho)
    assert [x.prompt for x in tc.make_split("heldout", 100, seed=0)] == [x.prompt for x in ho]
    ks = {x.meta["num_terms"] for x in tr}
    assert min(ks) == 2 and max(ks) == 12  # the long tail reaches the top of the range


def test_profile_registry() -> None:
    assert profile_names() == ["default", "choice"]
    assert parse_embedded("embedded").name == "default"
    assert parse_embedded("embedded:choice").name == "choice"
    assert parse_embedded("data/x.jsonl") is None
    with pytest.raises(ValueError, match="choose one of"):
        parse_embedded("embedded:nope")
    prof = get_profile("choice")
    assert prof.max_response_len == 192 and tuple(prof.length_edges) == (32, 64, 128) and prof.asset_dir == "embedded_choice"
    items = prof.split("heldout", 3, seed=0)
    assert items[0].source == tc.SOURCE and items[0].prompt.startswith("Add: ")
    d = get_profile("default").training_solution(get_profile("default").split("train", 1)[0], random.Random(0))
    assert d[1] == 0.0
