"""The verifier's errors as reward noise (issue 54): measured error rates, injected into rewards with a
seeded RNG, and the advantage signal they cost a group-normalised update.

A rule verifier misses right answers (false negatives: a reward 1 scored 0) at rates that depend on
the answer's form, and now and then accepts a wrong one (false positives). ``rates_from_rows`` reads
the rates off ``ulorl-bench verifier --out`` rows (per-row label and score), by the reference's
``answer_form``; ``inject`` flips clean rewards at those rates; ``group_signal`` counts what the
flips do to groups: dynamic sampling drops a group whose rewards are all equal (no advantage), so a
false negative that turns a group's only 1 into a 0 loses that group's signal, and a false positive
in an all-0 group gives it a spurious one.

    rates = rates_from_rows(rows)                      # {"fn": {form: p, "all": p}, "fp": p, ...}
    noisy = inject(clean, forms, rates, random.Random(seed))
    signal = group_signal(clean, noisy, group_ids)

Pure functions (no torch, no I/O); the RNG is the caller's.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FORMS = ("integer", "decimal", "fraction", "letter", "list", "expression", "text")
_INT = re.compile(r"^[+-]?\d+$")
_DEC = re.compile(r"^[+-]?\d*\.\d+$")
_FRACTION = re.compile(r"^[+-]?(?:\d+/\d+|\\[dt]?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\})$")
_LETTER = re.compile(r"^\(?[A-J]\)?$")


def answer_form(reference: str) -> str:
    """The form of a reference answer: ``integer`` (``42``, ``1{,}000``), ``decimal``, ``fraction``
    (``3/4``, ``\\frac{3}{4}``), ``letter`` (an option), ``list`` (several top-level items),
    ``text`` (words) or ``expression`` (anything else: radicals, variables, intervals ...)."""
    t = reference.strip().strip("$").strip()
    t = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", t).strip()
    plain = re.sub(r"(?<=\d)(?:,|\{,\}|\\,|\\!)(?=\d{3}\b)", "", t)
    if _INT.match(plain):
        return "integer"
    if _DEC.match(plain):
        return "decimal"
    if _FRACTION.match(t):
        return "fraction"
    if _LETTER.match(t):
        return "letter"
    depth, top_commas = 0, 0
    for c in t:
        depth += 1 if c in "([{" else -1 if c in ")]}" else 0
        top_commas += c == "," and depth == 0
    if top_commas:
        return "list"
    if re.fullmatch(r"[A-Za-z][A-Za-z ,.'-]*", t) and len(t) > 1:
        return "text"
    return "expression"


@dataclass(frozen=True)
class ErrorRates:
    """False-negative rate by answer form (``"all"``: every form pooled, the fallback) and the
    false-positive rate; ``counts`` keeps what each rate was read from."""

    fn: dict[str, float]
    fp: float
    counts: dict[str, Any] = field(default_factory=dict)

    def fn_rate(self, form: str) -> float:
        return self.fn.get(form, self.fn.get("all", 0.0))

    def scaled(self, factor: float) -> ErrorRates:
        """Every rate times ``factor`` (capped at 1): a dose of the same error profile."""
        return ErrorRates({k: min(1.0, v * factor) for k, v in self.fn.items()}, min(1.0, self.fp * factor),
                          dict(self.counts))


def rates_from_rows(rows: Sequence[dict[str, Any]], min_rows: int = 1) -> ErrorRates:
    """Error rates of labelled rows (``ulorl-bench verifier --out``: ``answer``, ``label``,
    ``score``): FN rate = rows labelled right and scored 0 over rows labelled right, per answer form
    (forms with fewer than ``min_rows`` right rows fall back to ``all``); FP rate = rows labelled
    wrong and scored 1 over rows labelled wrong."""
    pos: dict[str, list[int]] = {}
    neg = [0, 0]
    for r in rows:
        scored = float(r["score"]) >= 1.0
        if r["label"]:
            form = answer_form(str(r["answer"]))
            for key in (form, "all"):
                pos.setdefault(key, [0, 0])
                pos[key][0] += not scored
                pos[key][1] += 1
        else:
            neg[0] += scored
            neg[1] += 1
    fn = {k: miss / n for k, (miss, n) in pos.items() if n >= min_rows or k == "all"}
    counts = {"fn": {k: {"missed": miss, "right": n} for k, (miss, n) in pos.items()},
              "fp": {"accepted": neg[0], "wrong": neg[1]}}
    return ErrorRates(fn, neg[0] / neg[1] if neg[1] else 0.0, counts)


def inject(rewards: Sequence[float], forms: Sequence[str], rates: ErrorRates, rng: random.Random,
           eligible: Sequence[bool] | None = None) -> list[float]:
    """``rewards`` [N] (0 / 1) with a verifier's errors drawn: a 1 becomes 0 with its form's FN rate,
    a 0 becomes 1 with the FP rate. ``eligible`` [N] (default all): where False the reward is kept
    (a truncated response scores 0 by rule, not by the verifier). One ``rng.random()`` per eligible
    item, in order, so a seed fixes the draws."""
    if len(forms) != len(rewards) or (eligible is not None and len(eligible) != len(rewards)):
        raise ValueError(f"rewards ({len(rewards)}), forms ({len(forms)}) and eligible must have one length")
    out = []
    for i, (r, form) in enumerate(zip(rewards, forms)):
        if eligible is not None and not eligible[i]:
            out.append(float(r))
            continue
        u = rng.random()
        if r >= 1.0:
            out.append(0.0 if u < rates.fn_rate(form) else 1.0)
        else:
            out.append(1.0 if u < rates.fp else 0.0)
    return out


def group_signal(clean: Sequence[float], noisy: Sequence[float], group_ids: Sequence[int]) -> dict[str, int]:
    """Advantage signal of groups under clean and noisy rewards ([N] each, ``group_ids`` [N]):
    ``groups``; ``mixed_clean`` / ``mixed_noisy`` (groups whose rewards differ: kept by dynamic
    sampling); ``lost`` (mixed clean, all equal noisy: dropped because of the noise); ``spurious``
    (all equal clean, mixed noisy: trained on a signal the noise made); ``flipped_fn`` /
    ``flipped_fp`` (samples 1 -> 0 / 0 -> 1)."""
    if not len(clean) == len(noisy) == len(group_ids):
        raise ValueError("clean, noisy and group_ids must have one length")
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(int(g), []).append(i)
    out = {"groups": len(groups), "mixed_clean": 0, "mixed_noisy": 0, "lost": 0, "spurious": 0,
           "flipped_fn": sum(1 for c, n in zip(clean, noisy) if c >= 1.0 > n),
           "flipped_fp": sum(1 for c, n in zip(clean, noisy) if n >= 1.0 > c)}
    for idx in groups.values():
        mc = len({clean[i] for i in idx}) > 1
        mn = len({noisy[i] for i in idx}) > 1
        out["mixed_clean"] += mc
        out["mixed_noisy"] += mn
        out["lost"] += mc and not mn
        out["spurious"] += mn and not mc
    return out


def add_signal(total: dict[str, int], part: dict[str, int]) -> dict[str, int]:
    """``total`` plus ``part``, key by key (a running sum of ``group_signal`` results)."""
    return {k: total.get(k, 0) + part.get(k, 0) for k in set(total) | set(part)}
