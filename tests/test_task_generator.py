"""The embedded running-sum task: solutions, determinism, split disjointness, long tail."""

from __future__ import annotations

import numpy as np
import pytest

from ulorl.data.task import (
    DEFAULT_SPEC,
    bucket_labels,
    canonical,
    is_correct,
    is_heldout,
    iter_split,
    last_boxed_int,
    length_bucket,
    make_item,
    make_split,
    reference_solution,
    solve,
    term_count_weights,
)
from ulorl.data.types import PromptItem
from ulorl.models.tokenizer import build_tokenizer


def test_solution_hand_derived() -> None:
    assert solve([23, 45, 67]) == "23+45=68\n68+67=135\n\\boxed{135}"
    assert solve([10, 99]) == "10+99=109\n\\boxed{109}"
    with pytest.raises(ValueError):
        solve([5])


def test_item_fields() -> None:
    it = make_item([23, 45, 67], "x")
    assert isinstance(it, PromptItem)
    assert it.prompt == "Add: 23+45+67\n"
    assert it.answer == "135"
    assert it.meta == {"terms": [23, 45, 67], "num_terms": 3, "solution": solve([23, 45, 67])}
    assert reference_solution(it) == it.meta["solution"]
    bare = PromptItem(id="y", problem="", answer="135", meta={"terms": [23, 45, 67]})
    assert reference_solution(bare) == it.meta["solution"]


def test_deterministic_and_prefix() -> None:
    a = make_split("train", 50, seed=3)
    b = make_split("train", 50, seed=3)
    assert [(x.id, x.prompt, x.answer) for x in a] == [(x.id, x.prompt, x.answer) for x in b]
    longer = make_split("train", 80, seed=3)
    assert [x.prompt for x in longer[:50]] == [x.prompt for x in a]
    other = make_split("train", 50, seed=4)
    assert [x.prompt for x in other] != [x.prompt for x in a]


def test_items_are_consistent() -> None:
    for it in make_split("heldout", 200, seed=1):
        terms = it.meta["terms"]
        assert DEFAULT_SPEC.min_terms <= len(terms) <= DEFAULT_SPEC.max_terms
        assert all(DEFAULT_SPEC.low <= t <= DEFAULT_SPEC.high for t in terms)
        assert int(it.answer) == sum(terms)
        assert is_correct(reference_solution(it), it.answer)


def test_splits_never_overlap() -> None:
    train = {canonical(x.meta["terms"]) for s in (0, 1) for x in make_split("train", 4000, seed=s)}
    held = {canonical(x.meta["terms"]) for s in (0, 1) for x in make_split("heldout", 1000, seed=s)}
    assert train and held and not (train & held)
    assert all(not is_heldout(map(int, p.split("+"))) for p in train)
    assert all(is_heldout(list(map(int, p.split("+")))) for p in held)
    with pytest.raises(ValueError):
        next(iter_split("test"))  # type: ignore[arg-type]


def test_term_count_law_is_long_tailed() -> None:
    w = term_count_weights()
    assert abs(sum(w.values()) - 1) < 1e-12
    # P(k) ∝ (k-1)^-1.5: P(3)/P(2) = 2^-1.5
    assert w[3] / w[2] == pytest.approx(2**-1.5)
    assert list(w) == list(range(2, 29))


def test_length_distribution_property() -> None:
    """Reference length in tokens: max >= 6 x median, p90 >= 2.5 x median, max well below 512."""
    tok = build_tokenizer()
    items = make_split("heldout", 2000, seed=0)
    lens = np.array([len(tok(reference_solution(x), add_special_tokens=False)["input_ids"]) + 1 for x in items])
    med = np.median(lens)
    assert lens.max() >= 6 * med
    assert np.percentile(lens, 90) >= 2.5 * med
    prompts = np.array([len(tok(x.prompt)["input_ids"]) for x in items])
    assert lens.max() <= 400 and (lens + prompts).max() <= 512
    # the worst case the generator can produce (28 terms, all 99) still fits below 512
    worst = make_item([99] * DEFAULT_SPEC.max_terms, "w")
    assert len(tok(reference_solution(worst))["input_ids"]) + 1 < 450


def test_boxed_integer_check() -> None:
    assert last_boxed_int("a \\boxed{12} b \\boxed{ 135 }") == 135
    assert last_boxed_int("no box") is None
    assert last_boxed_int("\\boxed{1/2}") is None
    assert is_correct("68+67=135\n\\boxed{135}", "135")
    assert not is_correct("\\boxed{134}", "135")
    assert not is_correct("\\boxed{135", "135")


def test_length_buckets() -> None:
    assert bucket_labels() == ["<=32", "33-64", "65-128", "129-256", ">256"]
    assert [length_bucket(n) for n in (1, 32, 33, 64, 65, 256, 257)] == [
        "<=32", "<=32", "33-64", "33-64", "65-128", "129-256", ">256"]


def test_split_terms_rejects_into_the_right_split_hand_case() -> None:
    from itertools import count

    from ulorl.data.task import first_items, split_terms

    def stream(split):
        c = count()
        # always k = 2; the n-th draw is [n, n]; a problem is held out iff n % 3 == 0
        return split_terms(split, 0, "test", {2: 1.0}, lambda rng, k: [next(c)] * k, lambda t: t[0] % 3 == 0)

    train, heldout = stream("train"), stream("heldout")
    assert [next(train) for _ in range(4)] == [[1, 1], [2, 2], [4, 4], [5, 5]]
    assert [next(heldout) for _ in range(3)] == [[0, 0], [3, 3], [6, 6]]
    with pytest.raises(ValueError, match="split must be 'train' or 'heldout'"):
        split_terms("test", 0, "test", {2: 1.0}, lambda rng, k: [0] * k, lambda t: True)   # at once, not on next()
    assert first_items(iter([]), 0) == []
    with pytest.raises(ValueError, match="n must be >= 0"):
        first_items(iter([]), -1)
