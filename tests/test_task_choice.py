"""The ``choice`` embedded task: every drawn solution is correct, its entropy is exact, splits are disjoint."""

from __future__ import annotations

import math
import random

import pytest

from ulorl.data import task_choice as tc
from ulorl.data.profiles import get_profile, parse_embedded, profile_names
from ulorl.data.task import is_correct


def test_line_forms_hand_derived() -> None:
    assert tc.format_line(68, [67, 12], 0) == "68+67+12=147"
    assert tc.format_line(68, [67, 12], 1) == "67+68+12=147"
    assert tc.format_line(68, [67, 12], 2) == "67+12+68=147"
    assert tc.format_line(68, [67], tc.CONTINUE) == "+67=135"
    with pytest.raises(ValueError):
        tc.format_line(68, [67], 2)
    assert tc.solve([23, 45, 67]) == "23+45=68\n68+67=135\n\\boxed{135}"
    assert tc.derivation([23, 45, 67, 12], [2, 1], [1, tc.CONTINUE]) == "45+23+67=135\n+12=147\n\\boxed{147}"
    with pytest.raises(ValueError):
        tc.derivation([23, 45, 67], [1, 1], [tc.CONTINUE, 0])  # no running sum yet
    with pytest.raises(ValueError):
        tc.derivation([23, 45, 67], [1], [0])                    # groups must cover every term


def test_every_sampled_solution_is_correct_and_line_sums_hold() -> None:
    rng = random.Random(1)
    items = tc.make_split("train", 200, seed=2)
    kinds = set()
    for it in items:
        for _ in range(3):
            text, h = tc.sample_solution(it.meta["terms"], rng)
            assert is_correct(text, it.answer), text
            assert h > 0
            lines = text.split("\n")[:-1]
            kinds.add("guess" if not lines else "derive")
            prev = None
            for line in lines:  # each line's arithmetic is right, continuations add to the previous result
                lhs, rhs = line.split("=")
                ops = [int(x) for x in lhs.lstrip("+").split("+")]
                total = sum(ops) + (prev if line.startswith("+") else 0)
                assert total == int(rhs), line
                prev = int(rhs)
    assert kinds == {"guess", "derive"}


def test_self_information_matches_the_law() -> None:
    """k = 2: guess (p = 0.2) or one line with the running sum in slot 0 or 1 (p = 0.4 each)."""
    spec = tc.CHOICE_SPEC
    rng = random.Random(0)
    seen = {}
    for _ in range(400):
        text, h = tc.sample_solution([23, 45], rng, spec)
        seen[text] = h
    assert set(seen) == {"\\boxed{68}", "23+45=68\n\\boxed{68}", "45+23=68\n\\boxed{68}"}
    hb = -(0.2 * math.log(0.2) + 0.8 * math.log(0.8))
    assert seen["\\boxed{68}"] == pytest.approx(hb)
    assert seen["23+45=68\n\\boxed{68}"] == pytest.approx(hb + math.log(2))
    # three terms: first line adds 1 or 2 terms (log 2), slot among g+1; a second line (g = 1) may continue
    _, h = tc.sample_solution([23, 45, 67], random.Random(3), spec)
    assert h > hb


def test_terms_distinct_splits_disjoint_deterministic() -> None:
    tr = tc.make_split("train", 300, seed=0)
    ho = tc.make_split("heldout", 100, seed=0)
    assert {x.prompt for x in tr}.isdisjoint({x.prompt for x in ho})
    assert all(not tc.is_heldout(x.meta["terms"]) for x in tr) and all(tc.is_heldout(x.meta["terms"]) for x in ho)
    assert all(len(set(x.meta["terms"])) == len(x.meta["terms"]) for x in tr + ho)
    assert [x.prompt for x in tc.make_split("heldout", 100, seed=0)] == [x.prompt for x in ho]
    ks = {x.meta["num_terms"] for x in tr}
    assert min(ks) == 2 and max(ks) >= 15  # the long tail reaches the top of the range


def test_profile_registry() -> None:
    assert profile_names() == ["default", "choice"]
    assert parse_embedded("embedded").name == "default"
    assert parse_embedded("embedded:choice").name == "choice"
    assert parse_embedded("data/x.jsonl") is None
    with pytest.raises(ValueError, match="choose one of"):
        parse_embedded("embedded:nope")
    prof = get_profile("choice")
    assert prof.max_response_len == 256 and prof.asset_dir == "embedded_choice"
    items = prof.split("heldout", 3, seed=0)
    assert items[0].source == tc.SOURCE and items[0].prompt.startswith("Add: ")
    d = get_profile("default").training_solution(get_profile("default").split("train", 1)[0], random.Random(0))
    assert d[1] == 0.0
