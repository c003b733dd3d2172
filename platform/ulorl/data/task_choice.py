"""The ``choice`` embedded task: running sums where correct solutions differ (profile ``embedded:choice``).

A problem is ``k`` distinct two-digit numbers, ``k`` long-tailed on [2, max_terms]. The response
adds them left to right, one term per line as in the default task, but how it writes the work is
free — every form is verifiably correct (the reward checks only the final ``\\boxed{}``)::

    prompt:     "Add: 23+45+67+12\\n"
    reference:  "23+45=68\\n68+67=135\\n135+12=147\\n\\boxed{147}"   (plain; sets the length bucket)
    also right: "45 + 23=68, 68+67 = 135; 12+135=147\\n\\boxed{147}"  (operand order, spacing, separators)
                "\\boxed{147}"                                          (a short guess)

Choices of a derivation (the shipped law, ``CHOICE_SPEC``): before the lines, derive or guess
(``guess_prob``); on each line, the running sum first or second (commutativity, uniform), ``+`` and
``=`` each spaced or not (``plus_space_prob``, ``eq_space_prob``), and what joins the line to the
next (``separators``, uniform; the last line always ends in a newline). The arithmetic of a line is
always the default task's ``s + x``, so the warm start learns it about as fast as the default's.
A guess is short and almost always wrong beyond two terms, so longer outputs are more accurate:
the length-buys-accuracy trade-off of the paper. The generator also supports lines adding up to
``max_group`` terms with the running sum at any operand slot and continuation lines ``+67+12=214``
(``continue_prob``); the shipped law leaves them off (``max_group = 1``, ``continue_prob = 0``)
because a first build with them stalled at accuracy 0.03 after ~8M tokens.

``sample_solution`` draws from this law (the warm start's targets) and returns the exact
``-log p`` of the choices behind the draw, so the targets' entropy per token is measurable
(``ulorl-data stats --profile choice`` prints it as ``target_entropy``: 0.21 nats/token).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Optional

from ulorl.data.task import (  # noqa: F401  (re-exported: same checks and prompt)
    Split,
    canonical,
    first_items,
    is_correct,
    last_boxed_int,
    long_tail_weights,
    make_prompt,
    split_seed,
    split_terms,
)
from ulorl.data.types import PromptItem

SOURCE = "embedded:choice"


@dataclass(frozen=True)
class ChoiceSpec:
    """Parameters of the ``choice`` generator (its fields enter the warm-start cache key)."""

    min_terms: int = 2
    max_terms: int = 12
    alpha: float = 0.7           # P(k) ∝ (k-1)^-alpha: long-tailed, yet every length bucket is populated
    low: int = 10                # term range, inclusive; the terms of a problem are distinct
    high: int = 99
    max_group: int = 1           # a line adds 1..max_group next terms
    continue_prob: float = 0.0   # share of later lines written as a continuation "+x+y=r"
    guess_prob: float = 0.15     # share of warm-start targets that are a bare boxed answer
    plus_space_prob: float = 0.5  # a line writes " + " rather than "+"
    eq_space_prob: float = 0.5    # a line writes " = " rather than "="
    separators: tuple[str, ...] = ("\n", ", ", "; ", " ")  # what follows a line that is not the last
    heldout_modulus: int = 16
    version: int = 2

    def to_dict(self) -> dict:
        return asdict(self)


CHOICE_SPEC = ChoiceSpec()


def term_count_weights(spec: ChoiceSpec = CHOICE_SPEC) -> dict[int, float]:
    """Normalised P(k) for k in [min_terms, max_terms]."""
    return long_tail_weights(spec.min_terms, spec.max_terms, spec.alpha)


def is_heldout(terms: Sequence[int], spec: ChoiceSpec = CHOICE_SPEC) -> bool:
    """Split membership, a pure function of the problem (salted apart from the default task)."""
    h = int.from_bytes(hashlib.sha256(f"{SOURCE}:{canonical(terms)}".encode()).digest()[:8], "big")
    return h % spec.heldout_modulus == 0


CONTINUE = -1  # slot value of a continuation line


@dataclass(frozen=True)
class LineStyle:
    """How one line is written (arithmetic unchanged): spaced operators and the text after it."""

    plus_space: bool = False
    eq_space: bool = False
    separator: str = "\n"


PLAIN = LineStyle()


def format_line(running: int, group: Sequence[int], slot: int, style: LineStyle = PLAIN) -> str:
    """One derivation line (without its separator): the running sum placed at ``slot``
    (0..len(group)) among the group's terms, then ``=`` and the new running sum; ``slot == CONTINUE``
    leaves the running sum implicit. ``format_line(68, [67, 12], 1) == "67+68+12=147"``,
    ``format_line(68, [67, 12], -1) == "+67+12=147"``, spaced: ``"67 + 68 + 12 = 147"``."""
    ops = [str(x) for x in group]
    plus = " + " if style.plus_space else "+"
    eq = " = " if style.eq_space else "="
    if slot == CONTINUE:
        return plus.lstrip() + plus.join(ops) + f"{eq}{running + sum(group)}"
    if not 0 <= slot <= len(group):
        raise ValueError(f"slot must be in [0, {len(group)}] or CONTINUE, got {slot}")
    ops.insert(slot, str(running))
    return plus.join(ops) + f"{eq}{running + sum(group)}"


def derivation(terms: Sequence[int], groups: Sequence[int], slots: Sequence[int],
               styles: Optional[Sequence[LineStyle]] = None) -> str:
    """Solution text for given group sizes (summing to k-1), running-sum slots and line styles
    (default: plain, one line each), ending in ``\\boxed{}``; the last line is always followed by a newline."""
    if len(terms) < 2:
        raise ValueError(f"need at least 2 terms, got {len(terms)}")
    if sum(groups) != len(terms) - 1 or len(groups) != len(slots) or min(groups, default=1) < 1:
        raise ValueError(f"groups {list(groups)} must be >= 1 and sum to {len(terms) - 1}, one slot each")
    if slots and slots[0] == CONTINUE:
        raise ValueError("the first line cannot be a continuation (there is no running sum yet)")
    styles = list(styles) if styles is not None else [PLAIN] * len(groups)
    if len(styles) != len(groups):
        raise ValueError(f"need one style per line: {len(styles)} styles for {len(groups)} lines")
    parts, s, i = [], terms[0], 1
    for n, (g, slot, st) in enumerate(zip(groups, slots, styles)):
        parts.append(format_line(s, terms[i : i + g], slot, st) + ("\n" if n == len(groups) - 1 else st.separator))
        s += sum(terms[i : i + g])
        i += g
    parts.append(f"\\boxed{{{s}}}")
    return "".join(parts)


def solve(terms: Sequence[int]) -> str:
    """Reference solution: one term per line, running sum first, plain (sets the length bucket)."""
    return derivation(terms, [1] * (len(terms) - 1), [0] * (len(terms) - 1))


def guess(terms: Sequence[int]) -> str:
    return f"\\boxed{{{sum(terms)}}}"


def _coin(rng: random.Random, p: float) -> tuple[bool, float]:
    """A draw with P(True) = p and its self-information (nats)."""
    hit = rng.random() < p
    q = p if hit else 1 - p
    return hit, (-math.log(q) if 0 < p < 1 else 0.0)


def sample_solution(terms: Sequence[int], rng: random.Random, spec: ChoiceSpec = CHOICE_SPEC) -> tuple[str, float]:
    """A correct solution drawn from the target law, and the self-information ``-log p`` (nats) of
    the choices made; its mean over draws is the entropy of the target law for these terms."""
    is_guess, h = _coin(rng, spec.guess_prob)
    if is_guess:
        return guess(terms), h
    groups: list[int] = []
    slots: list[int] = []
    styles: list[LineStyle] = []
    left = len(terms) - 1
    while left:
        opts = min(spec.max_group, left)
        g = rng.randint(1, opts)
        h += math.log(opts)
        cont = False
        if groups:
            cont, hc = _coin(rng, spec.continue_prob)
            h += hc
        if cont:
            slot = CONTINUE
        else:
            slot = rng.randint(0, g)
            h += math.log(g + 1)
        plus_space, hp = _coin(rng, spec.plus_space_prob)
        eq_space, he = _coin(rng, spec.eq_space_prob)
        h += hp + he
        left -= g
        sep = "\n"
        if left:  # the last line's newline before the boxed answer is fixed
            sep = rng.choice(spec.separators)
            h += math.log(len(spec.separators))
        groups.append(g)
        slots.append(slot)
        styles.append(LineStyle(plus_space, eq_space, sep))
    return derivation(terms, groups, slots, styles), h


def make_item(terms: Sequence[int], item_id: str) -> PromptItem:
    terms = list(terms)
    return PromptItem(
        id=item_id,
        problem=f"Compute {canonical(terms)}; any grouping of the additions is fine.",
        answer=str(sum(terms)),
        source=SOURCE,
        prompt=make_prompt(terms),
        meta={"terms": terms, "num_terms": len(terms), "solution": solve(terms)},
    )


def iter_split(split: Split, seed: int = 0, spec: ChoiceSpec = CHOICE_SPEC) -> Iterator[PromptItem]:
    """Endless deterministic stream of items of one split (distinct terms per problem)."""
    terms = split_terms(split, seed, SOURCE, term_count_weights(spec),
                        lambda rng, k: rng.sample(range(spec.low, spec.high + 1), k),
                        lambda t: is_heldout(t, spec))
    if spec.high - spec.low + 1 < spec.max_terms:
        raise ValueError(f"term range [{spec.low}, {spec.high}] cannot hold {spec.max_terms} distinct terms")
    for i, t in enumerate(terms):
        yield make_item(t, f"choice-{split}-{seed}-{i:07d}")


def make_split(split: Split, n: int, seed: int = 0, spec: ChoiceSpec = CHOICE_SPEC) -> list[PromptItem]:
    """The first ``n`` items of ``iter_split(split, seed)``."""
    return first_items(iter_split(split, seed, spec), n)


def training_solution(item: PromptItem, rng: random.Random, spec: ChoiceSpec = CHOICE_SPEC) -> tuple[str, float]:
    """A warm-start target for ``item`` and its ``-log p``: one draw of ``sample_solution``."""
    terms = item.meta.get("terms")
    if not terms:
        raise ValueError(f"item {item.id!r} has no terms in meta; not a choice-task item")
    return sample_solution(terms, rng, spec)
