"""The embedded synthetic verifiable task: running partial sums with a long-tailed term count.

A problem is ``k`` two-digit numbers; the reference solution writes one line per addition
(the running sum) and ends with the total in ``\\boxed{}``::

    prompt:    "Add: 23+45+67\\n"
    solution:  "23+45=68\\n68+67=135\\n\\boxed{135}"      (the model then emits EOS)

``k`` is drawn from a truncated power law, P(k) ∝ (k-1)^-alpha on [2, max_terms], so most
solutions are short and a few are 5-10x longer: the long-tail rollout problem of the paper in
miniature. Generation is deterministic given ``(split, seed)``; a problem belongs to the held-out
split iff a hash of its canonical text falls in a fixed residue class, so the two splits can
never share a problem whatever seeds and sizes are used.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Literal, Optional

from ulorl.data.types import PromptItem

Split = Literal["train", "heldout"]
SOURCE = "embedded:running_sum"


@dataclass(frozen=True)
class TaskSpec:
    """Parameters of the default generator (its fields enter the warm-start cache key)."""

    min_terms: int = 2
    max_terms: int = 28
    alpha: float = 1.5          # tail exponent of P(k) ∝ (k-1)^-alpha
    low: int = 10               # term range, inclusive
    high: int = 99
    heldout_modulus: int = 16   # 1/16 of all problems are held-out problems
    version: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


DEFAULT_SPEC = TaskSpec()


def long_tail_weights(min_terms: int, max_terms: int, alpha: float) -> dict[int, float]:
    """Normalised P(k) ∝ (k - min_terms + 1)^-alpha for k in [min_terms, max_terms]."""
    raw = {k: float(k - min_terms + 1) ** -alpha for k in range(min_terms, max_terms + 1)}
    z = sum(raw.values())
    return {k: w / z for k, w in raw.items()}


def term_count_weights(spec: TaskSpec = DEFAULT_SPEC) -> dict[int, float]:
    """Normalised P(k) for k in [min_terms, max_terms]."""
    return long_tail_weights(spec.min_terms, spec.max_terms, spec.alpha)


def canonical(terms: Sequence[int]) -> str:
    """``[23, 45]`` -> ``"23+45"`` (the identity used for split membership)."""
    return "+".join(str(t) for t in terms)


def is_heldout(terms: Sequence[int], spec: TaskSpec = DEFAULT_SPEC) -> bool:
    """Split membership, a pure function of the problem: sha256(canonical) mod modulus == 0."""
    h = int.from_bytes(hashlib.sha256(canonical(terms).encode()).digest()[:8], "big")
    return h % spec.heldout_modulus == 0


def solve(terms: Sequence[int]) -> str:
    """Reference solution text (no EOS): one ``s+x=s'`` line per addition, then ``\\boxed{total}``."""
    if len(terms) < 2:
        raise ValueError(f"need at least 2 terms, got {len(terms)}")
    lines = []
    s = terms[0]
    for x in terms[1:]:
        lines.append(f"{s}+{x}={s + x}")
        s += x
    lines.append(f"\\boxed{{{s}}}")
    return "\n".join(lines)


def make_prompt(terms: Sequence[int]) -> str:
    """Model-facing prompt (plain text, no chat template): ``"Add: 23+45+67\\n"``."""
    return f"Add: {canonical(terms)}\n"


def make_item(terms: Sequence[int], item_id: str) -> PromptItem:
    terms = list(terms)
    return PromptItem(
        id=item_id,
        problem=f"Compute {canonical(terms)} step by step, keeping a running sum.",
        answer=str(sum(terms)),
        source=SOURCE,
        prompt=make_prompt(terms),
        meta={"terms": terms, "num_terms": len(terms), "solution": solve(terms)},
    )


def split_seed(source: str, split: Split, seed: int) -> int:
    """Seed of one task's split stream: a hash of (task source, split, seed)."""
    return int.from_bytes(hashlib.sha256(f"{source}:{split}:{seed}".encode()).digest()[:8], "big")


def split_terms(
    split: Split,
    seed: int,
    source: str,
    weights: dict[int, float],
    draw: Callable[[random.Random, int], list[int]],
    heldout: Callable[[Sequence[int]], bool],
) -> Iterator[list[int]]:
    """Endless deterministic stream of the term lists of one split, shared by the task generators.

    Per item: ``k ~ weights`` (term count -> probability), then ``terms = draw(rng, k)`` redrawn
    until ``heldout(terms)`` matches the split (rejection keeps k's law and moves a problem to its
    own split). The rng is seeded by ``split_seed(source, split, seed)``. Raises ValueError (at
    once) for a split other than 'train' / 'heldout'.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = random.Random(split_seed(source, split, seed))
    ks, ps = list(weights), list(weights.values())
    want_heldout = split == "heldout"

    def stream() -> Iterator[list[int]]:
        while True:
            k = rng.choices(ks, ps)[0]
            while True:
                terms = draw(rng, k)
                if heldout(terms) == want_heldout:
                    break
            yield terms

    return stream()


def first_items(items: Iterator[PromptItem], n: int) -> list[PromptItem]:
    """The first ``n`` items of an endless split stream (a prefix: larger n extends smaller n)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [next(items) for _ in range(n)]


def iter_split(split: Split, seed: int = 0, spec: TaskSpec = DEFAULT_SPEC) -> Iterator[PromptItem]:
    """Endless deterministic stream of items of one split (duplicates possible within a split)."""
    terms = split_terms(split, seed, SOURCE, term_count_weights(spec),
                        lambda rng, k: [rng.randint(spec.low, spec.high) for _ in range(k)],
                        lambda t: is_heldout(t, spec))
    for i, t in enumerate(terms):
        yield make_item(t, f"sum-{split}-{seed}-{i:07d}")


def make_split(split: Split, n: int, seed: int = 0, spec: TaskSpec = DEFAULT_SPEC) -> list[PromptItem]:
    """The first ``n`` items of ``iter_split(split, seed)`` (a prefix: larger n extends smaller n)."""
    return first_items(iter_split(split, seed, spec), n)


def reference_solution(item: PromptItem) -> str:
    """The reference response text of an item (without EOS)."""
    sol = item.meta.get("solution")
    if sol:
        return sol
    terms = item.meta.get("terms")
    if not terms:
        raise ValueError(f"item {item.id!r} has no terms in meta; not an embedded-task item")
    return solve(terms)


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def last_boxed_int(text: str) -> Optional[int]:
    """Integer in the last ``\\boxed{...}`` (flat braces only), or None.

    A fast exact check for the warm-start stopping rule; the task's answers are integers, so this
    agrees with the math-verify reward on well-formed outputs.
    """
    found = _BOXED.findall(text)
    if not found:
        return None
    s = found[-1].strip()
    return int(s) if re.fullmatch(r"-?\d+", s) else None


def is_correct(response: str, answer: str) -> bool:
    """Exact-integer check of the last boxed answer against the reference integer string."""
    got = last_boxed_int(response)
    return got is not None and got == int(answer)


LENGTH_EDGES = (32, 64, 128, 256)


def length_bucket(n_tokens: int, edges: Sequence[int] = LENGTH_EDGES) -> str:
    """Bucket label of a reference length in tokens: ``"<=32"``, ``"33-64"``, ..., ``">256"``."""
    lo = 0
    for e in edges:
        if n_tokens <= e:
            return f"<={e}" if lo == 0 else f"{lo + 1}-{e}"
        lo = e
    return f">{edges[-1]}"


def bucket_labels(edges: Sequence[int] = LENGTH_EDGES) -> list[str]:
    labels, lo = [], 0
    for e in edges:
        labels.append(f"<={e}" if lo == 0 else f"{lo + 1}-{e}")
        lo = e
    return labels + [f">{edges[-1]}"]
