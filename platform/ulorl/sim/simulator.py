"""Rollout cost simulator: what does segment count S buy for a length distribution and hardware?

Model. Algorithm 1 (PAPER.md) in steady state with a fixed policy: every step admits
``prompts_per_step`` x G new samples (natural lengths drawn from a ``LengthDist``), the rollout
batch is every unfinished sample plus the new ones, and each row decodes
``n_i = min(segment_len, min(L_i, max_len) - d_i)`` tokens (``d_i`` = tokens decoded before).
Samples that reach EOS or the global max leave for the experience pool; complete groups (all G)
are released for training. One step costs, in milliseconds::

    step_ms = sum over decode iterations j of (a + b * rows_j + c * sum_{active rows} context)
            + p * prefill_tokens + t * trained_tokens + o

* regime ``static``: every row of the batch is computed at every iteration until the longest
  row of the step is done (``rows_j = B``) — synchronous GPU RL, where the paper's tail lives;
* regime ``compact``: finished rows leave the batch (``rows_j`` = rows still active);
* context ``padded``: a row's context at iteration j is the batch's longest prompt+prefix plus j
  (left-padded batch, one KV cache); ``row``: its own prompt+prefix plus j (paged attention);
  ``bucket``: its context bucket's longest plus j (the hf engine's bucketed caches).

Prefill tokens: with a bench's prefix records (``EmpiricalLengths`` with prefix structure) and an
engine with a prefix forest (``RolloutSetup.share_min_tokens``, the hf fast path), every row's
context is rebuilt (real prompt ids + synthetic responses with the observed common prefixes) and a
step's prefill is counted by the engine's own code (``ulorl.rollout.prefix.prefill_tokens``);
otherwise carried contexts count in full plus the new prompts (``RolloutSetup``).

Since the policy is fixed, the scheduling does not depend on time: ``simulate`` runs the pools
once per (S, regime) and records, per step, the *features* ``[iterations, row-slots,
row-context sum, prefill tokens, trained tokens, 1]``; a ``CostModel`` is the coefficient vector
``(a, b, c, p, t, o)`` and every prediction is ``features @ coefficients``. Fitting is therefore
linear: ``fit_cost_curve`` (a, b, c from measured iteration costs, non-negative least squares),
``fit_s1`` (prefill cost, overhead and a decode scale from S = 1 measurements only) and
``fit_two_points`` (the paper's flat-cost GPU regime from its S = 1 and S = 2 step times).

Everything here is numpy and pure (no I/O except ``load_lengths``). The studies built on it
(``ulorl-sim validate / paper / plan``) are in ``ulorl.sim.studies``.
"""

from __future__ import annotations

import abc
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import Any, Literal, Optional

import numpy as np

from ulorl.rollout.buckets import plan_buckets
from ulorl.rollout.prefix import prefill_tokens as _forest_prefill_tokens
from ulorl.rollout.prefix import sequences_with_lcps
from ulorl.segments import segment_length

__all__ = [
    "CostModel",
    "LengthDist",
    "LogNormalLengths",
    "MixtureLengths",
    "EmpiricalLengths",
    "RolloutSetup",
    "SimTrace",
    "SimResult",
    "simulate",
    "evaluate",
    "fit_cost_curve",
    "fit_s1",
    "S1_FREE",
    "fit_prefill_curve",
    "fit_two_points",
    "load_lengths",
    "parse_lengths",
    "FEATURES",
    "decode_features",
    "effective_context",
    "plan_buckets",
    "add_ratios",
]

Regime = Literal["static", "compact"]
ContextMode = Literal["padded", "row", "bucket"]
FEATURES = ("iters", "row_slots", "row_context", "prefill_tokens", "train_tokens", "one", "extra_bucket_iters")


# ----------------------------------------------------------------------------- cost model


@dataclass(frozen=True)
class CostModel:
    """Milliseconds: per decode iteration ``a``, per row per iteration ``b``, per row per context
    token per iteration ``c``; per prefilled token ``p``; per trained token ``t``; per step ``o``;
    per extra context bucket per iteration ``bk`` (bucketed engines run one attention call per
    bucket and layer; a one-bucket cost curve cannot see it)."""

    a: float = 0.0
    b: float = 0.0
    c: float = 0.0
    p: float = 0.0
    t: float = 0.0
    o: float = 0.0
    bk: float = 0.0

    def vector(self) -> np.ndarray:
        return np.array([self.a, self.b, self.c, self.p, self.t, self.o, self.bk], dtype=float)

    def iter_ms(self, rows: float, context: float) -> float:
        """Cost of one decode iteration with ``rows`` active rows of ``context`` tokens each."""
        return self.a + self.b * rows + self.c * rows * context

    def scaled_decode(self, k: float) -> CostModel:
        return replace(self, a=self.a * k, b=self.b * k, c=self.c * k)

    def decode_vector(self) -> np.ndarray:
        """Coefficients of the decode features (``iters, row_slots, row_context, extra_bucket_iters``)."""
        return np.array([self.a, self.b, self.c, 0.0, 0.0, 0.0, self.bk])

    @classmethod
    def flat(cls, ms_per_iter: float, **kw: float) -> CostModel:
        """GPU-like regime: an iteration costs the same for 3 rows as for 128."""
        return cls(a=ms_per_iter, **kw)


# ----------------------------------------------------------------------------- lengths


class LengthDist(abc.ABC):
    """Natural response lengths (tokens up to and including EOS; may exceed any max), by group."""

    @abc.abstractmethod
    def sample(self, rng: np.random.Generator, n_groups: int, group_size: int) -> np.ndarray:
        """[n_groups, group_size] int64 lengths >= 1."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """JSON-able parameters of the law."""

    def frac_within(self, x: float, n: int = 200_000, seed: int = 0) -> float:
        """Monte Carlo P(L <= x)."""
        draws = self.sample(np.random.default_rng(seed), max(1, n // 8), 8)
        return float((draws <= x).mean())


def _group_normals(rng: np.random.Generator, n_groups: int, group_size: int, rho: float) -> np.ndarray:
    """Standard normals with correlation ``rho`` inside a group, [n_groups, group_size]."""
    z = rng.standard_normal((n_groups, group_size))
    if rho <= 0:
        return z
    zg = rng.standard_normal((n_groups, 1))
    return math.sqrt(rho) * zg + math.sqrt(1.0 - rho) * z


@dataclass(frozen=True)
class LogNormalLengths(LengthDist):
    """log L ~ N(mu, sigma^2); ``rho`` = correlation of log-lengths within a group (prompt difficulty)."""

    mu: float
    sigma: float
    rho: float = 0.0

    def __post_init__(self) -> None:
        if self.sigma < 0 or not 0 <= self.rho <= 1:
            raise ValueError(f"lognormal needs sigma >= 0 and 0 <= rho <= 1, got sigma={self.sigma}, rho={self.rho}")

    def sample(self, rng: np.random.Generator, n_groups: int, group_size: int) -> np.ndarray:
        z = _group_normals(rng, n_groups, group_size, self.rho)
        return np.maximum(1, np.rint(np.exp(self.mu + self.sigma * z))).astype(np.int64)

    @classmethod
    def with_quantile(cls, x: float, q: float, sigma: float, rho: float = 0.0) -> LogNormalLengths:
        """The lognormal of spread ``sigma`` with P(L <= x) = q."""
        return cls(mu=math.log(x) - sigma * _norm_ppf(q), sigma=sigma, rho=rho)

    def describe(self) -> dict[str, Any]:
        return {"kind": "lognormal", "mu": self.mu, "sigma": self.sigma, "rho": self.rho,
                "median": math.exp(self.mu)}


@dataclass(frozen=True)
class MixtureLengths(LengthDist):
    """A mixture of lognormals ``(weight, mu, sigma)``; one component per group (a prompt's
    difficulty class), then ``rho``-correlated draws inside it."""

    components: tuple[tuple[float, float, float], ...]
    rho: float = 0.0

    def __post_init__(self) -> None:
        if not self.components or any(w <= 0 or s < 0 for w, _, s in self.components):
            raise ValueError(f"mixture needs components (weight>0, mu, sigma>=0), got {self.components}")

    def sample(self, rng: np.random.Generator, n_groups: int, group_size: int) -> np.ndarray:
        w = np.array([c[0] for c in self.components], dtype=float)
        mu = np.array([c[1] for c in self.components])
        sg = np.array([c[2] for c in self.components])
        k = rng.choice(len(w), size=n_groups, p=w / w.sum())
        z = _group_normals(rng, n_groups, group_size, self.rho)
        return np.maximum(1, np.rint(np.exp(mu[k, None] + sg[k, None] * z))).astype(np.int64)

    def describe(self) -> dict[str, Any]:
        return {"kind": "mixture", "components": [list(c) for c in self.components], "rho": self.rho}


@dataclass(frozen=True)
class EmpiricalLengths(LengthDist):
    """Resample observed lengths. With ``groups`` (lengths of the G responses of one prompt) whole
    groups are resampled, keeping the within-group correlation; a group of another size is
    resampled member-wise with replacement. Without, lengths are drawn independently.
    Observed lengths at the max of the run they came from stand for truncated responses.

    Prefix structure (optional, from a bench's ``group_prefix`` / ``prefix_prompts``): ``prompts``
    holds the distinct prompts' token ids in the order the bench admitted them, ``group_prompt``
    the prompt of each group, ``group_lcps`` the ``G - 1`` longest common prefixes of neighbouring
    responses of each group in lexicographic order (``groups`` then lists the lengths in that
    order). ``simulate`` then admits the observed groups in a fixed cycle (``sample_structured``)
    and rebuilds every row's context with exactly the observed prefix structure — the real
    prompt ids followed by synthetic response tokens (``ulorl.rollout.prefix.sequences_with_lcps``)
    — so the hf engine's prefix-forest prefill can be counted with the engine's own code. Needs
    more than ``prompts_per_step x S`` distinct prompts (else one prompt can be in flight twice,
    which the bench never does, and its contexts would share the prompt). A setup with another
    group size G ignores the structure (plain ``sample``).
    """

    lengths: tuple[int, ...]
    groups: Optional[tuple[tuple[int, ...], ...]] = None
    source: str = ""
    prompts: Optional[tuple[tuple[int, ...], ...]] = None
    group_prompt: Optional[tuple[int, ...]] = None
    group_lcps: Optional[tuple[tuple[int, ...], ...]] = None
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError(f"empirical length distribution {self.source!r} is empty")
        if min(self.lengths) < 1:
            raise ValueError(f"empirical lengths {self.source!r} contain a value < 1")
        given = [x is not None for x in (self.prompts, self.group_prompt, self.group_lcps)]
        if any(given) and not all(given):
            raise ValueError(f"{self.source}: prefix structure needs prompts, group_prompt and group_lcps together")
        prompts, group_prompt, group_lcps = self.prompts, self.group_prompt, self.group_lcps
        if prompts is not None and group_prompt is not None and group_lcps is not None:
            if not self.groups or len(group_prompt) != len(self.groups) or len(group_lcps) != len(self.groups):
                raise ValueError(f"{self.source}: group_prefix needs one prompt and one LCP list per group")
            if len({len(g) for g in self.groups}) != 1:
                raise ValueError(f"{self.source}: group_prefix groups must all have the same size")
            for i, (g, c, pi) in enumerate(zip(self.groups, group_lcps, group_prompt)):
                if not 0 <= pi < len(prompts) or not prompts[pi]:
                    raise ValueError(f"{self.source}: group_prefix[{i}] names prompt {pi}, which is missing or empty")
                if len(c) != len(g) - 1 or any(not 0 <= x <= min(a, b) for x, a, b in zip(c, g, g[1:])):
                    raise ValueError(f"{self.source}: group_prefix[{i}] LCPs {list(c)} do not fit lengths {list(g)}")
            used = set(group_prompt)
            if len(used) != len(prompts):
                raise ValueError(f"{self.source}: {len(prompts) - len(used)} prompts have no group")

    @property
    def has_prefix_structure(self) -> bool:
        return self.group_lcps is not None

    @property
    def group_size(self) -> Optional[int]:
        return len(self.groups[0]) if self.groups else None

    def sample(self, rng: np.random.Generator, n_groups: int, group_size: int) -> np.ndarray:
        if not self.groups:
            arr = np.asarray(self.lengths, dtype=np.int64)
            return arr[rng.integers(0, len(arr), size=(n_groups, group_size))]
        pick = rng.integers(0, len(self.groups), size=n_groups)
        out = np.empty((n_groups, group_size), dtype=np.int64)
        for i, gi in enumerate(pick):
            g = self.groups[gi]
            if len(g) == group_size:
                out[i] = g
            else:
                out[i] = np.asarray(g)[rng.integers(0, len(g), size=group_size)]
        return out

    def sample_structured(self, rng: np.random.Generator, n_groups: int, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Groups number ``start, start + 1, ...`` of a fixed cycle over all observed groups:
        ``(lengths [n_groups, G], group index [n_groups])``. The cycle takes every prompt's first
        group in prompt order, then every prompt's second group, and so on: each observed group is
        used equally often (the released groups are the steady-state sample), consecutive groups
        belong to consecutive prompts as in the bench's batches, and one prompt comes back only
        after a pass over the prompts. ``rng`` is unused (the cycle is deterministic)."""
        if not self.has_prefix_structure:
            raise ValueError("sample_structured needs prefix structure")
        cycle = self._cache.get("cycle")
        if cycle is None:
            rank: dict[int, int] = {}
            key = []
            for gi, pi in enumerate(self.group_prompt):   # type: ignore[arg-type]
                rank[pi] = rank.get(pi, -1) + 1
                key.append((rank[pi], pi, gi))
            cycle = np.asarray([gi for _, _, gi in sorted(key)], dtype=np.int64)
            self._cache["cycle"] = cycle
        if n_groups <= 0:
            return np.zeros((0, self.group_size or 0), dtype=np.int64), np.zeros(0, dtype=np.int64)
        idx = cycle[(start + np.arange(n_groups)) % cycle.size]
        lens = np.asarray([self.groups[gi] for gi in idx], dtype=np.int64).reshape(n_groups, -1)   # type: ignore[index]
        return lens, idx

    def prompt_of(self, group: int) -> tuple[int, ...]:
        return self.prompts[self.group_prompt[group]]   # type: ignore[index]

    def responses_of(self, group: int) -> list[tuple[int, ...]]:
        """Synthetic response token ids of a group with its observed prefix structure (cached).
        Tokens are >= 2**31 and unique to the group, so they never match a prompt token or
        another group's response."""
        seqs = self._cache.get(("seq", group))
        if seqs is None:
            offs = self._cache.get("offsets")
            if offs is None:
                offs = np.concatenate([[0], np.cumsum([sum(g) for g in self.groups])])   # type: ignore[union-attr]
                self._cache["offsets"] = offs
            seqs = [tuple(x) for x in sequences_with_lcps(self.groups[group], self.group_lcps[group],   # type: ignore[index]
                                                          first_token=(1 << 31) + int(offs[group]))]
            self._cache[("seq", group)] = seqs
        return seqs

    def describe(self) -> dict[str, Any]:
        arr = np.asarray(self.lengths)
        out = {"kind": "empirical", "source": self.source, "n": int(arr.size),
               "groups": None if not self.groups else len(self.groups),
               "mean": float(arr.mean()), "p50": float(np.median(arr)), "max": int(arr.max())}
        if self.has_prefix_structure:
            lc = np.asarray([x for c in self.group_lcps for x in c], dtype=np.float64)   # type: ignore[union-attr]
            out["prefix_structure"] = {"prompts": len(self.prompts),   # type: ignore[arg-type]
                                       "mean_adjacent_lcp": float(lc.mean()) if lc.size else 0.0}
        return out


def parse_lengths(data: Any, source: str = "<data>") -> EmpiricalLengths:
    """Lengths from parsed JSON: a list of ints, a list of lists (groups), or an object with
    ``group_lengths`` and/or ``lengths`` (e.g. a ``ulorl-bench rollout --json`` output). An object
    with ``group_prefix`` (``[{"prompt", "lengths", "lcp"}, ...]``) and ``prefix_prompts`` (token
    ids per prompt) also carries the groups' prefix structure (``EmpiricalLengths``); its groups
    are then those records."""
    groups = None
    prefix_kw: dict[str, Any] = {}
    if isinstance(data, dict):
        if data.get("group_prefix"):
            recs, prompts = data["group_prefix"], data.get("prefix_prompts")
            if not isinstance(prompts, list) or not isinstance(recs, list):
                raise ValueError(f"{source}: 'group_prefix' needs a list 'prefix_prompts' beside it")
            try:
                groups = [r["lengths"] for r in recs]
                prefix_kw = {"prompts": tuple(tuple(int(t) for t in p) for p in prompts),
                             "group_prompt": tuple(int(r["prompt"]) for r in recs),
                             "group_lcps": tuple(tuple(int(x) for x in r["lcp"]) for r in recs)}
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{source}: bad 'group_prefix' record ({exc!r}); "
                                 "need {'prompt': int, 'lengths': [...], 'lcp': [...]}") from None
            flat = [x for g in groups for x in g]
        elif data.get("group_lengths"):
            groups = data["group_lengths"]
            flat = [x for g in groups for x in g]
        elif "lengths" in data:
            flat = data["lengths"]
        else:
            raise ValueError(f"{source}: object has neither 'lengths' nor 'group_lengths'")
    elif isinstance(data, list) and data and all(isinstance(x, list) for x in data):
        groups = data
        flat = [x for g in data for x in g]
    elif isinstance(data, list):
        flat = data
    else:
        raise ValueError(f"{source}: expected a list of lengths, a list of groups or an object, "
                         f"got {type(data).__name__}")
    try:
        flat_i = tuple(int(x) for x in flat)
        groups_i = tuple(tuple(int(x) for x in g) for g in groups if g) if groups else None
    except (TypeError, ValueError):
        raise ValueError(f"{source}: lengths must be integers") from None
    if prefix_kw and groups and groups_i is not None and len(groups_i) != len(groups):   # an empty record
        raise ValueError(f"{source}: 'group_prefix' has a record with no lengths")
    return EmpiricalLengths(lengths=flat_i, groups=groups_i, source=source, **prefix_kw)


def load_lengths(path: str | Path) -> EmpiricalLengths:
    """Read lengths from JSON (see ``parse_lengths``) or JSONL (one int, one list = one group,
    or one object with ``response_len`` / ``length`` per line)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"lengths file not found: {p}")
    text = p.read_text()
    try:
        return parse_lengths(json.loads(text), str(p))
    except json.JSONDecodeError:
        pass
    rows: list[Any] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{p}:{i}: not JSON") from None
        if isinstance(item, dict):
            key = next((k for k in ("response_len", "length", "len") if k in item), None)
            if key is None:
                raise ValueError(f"{p}:{i}: object without 'response_len' / 'length'")
            item = item[key]
        rows.append(item)
    return parse_lengths(rows, str(p))


def _norm_ppf(q: float) -> float:
    """Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    if not 0 < q < 1:
        raise ValueError(f"quantile must be in (0, 1), got {q}")
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    lo, hi = 0.02425, 1 - 0.02425
    if q < lo:
        r = math.sqrt(-2 * math.log(q))
        return (((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]) / \
            ((((d[0] * r + d[1]) * r + d[2]) * r + d[3]) * r + 1)
    if q > hi:
        return -_norm_ppf(1 - q)
    r = q - 0.5
    s = r * r
    return (((((a[0] * s + a[1]) * s + a[2]) * s + a[3]) * s + a[4]) * s + a[5]) * r / \
        (((((b[0] * s + b[1]) * s + b[2]) * s + b[3]) * s + b[4]) * s + 1)


# ----------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class RolloutSetup:
    """One rollout configuration (mirrors ``rollout.*`` of the experiment config) and the engine
    traits that shape its cost.

    ``context``: how a row's attention context is counted at a decode iteration — ``padded`` (the
    batch's longest prompt+prefix: one left-padded cache), ``row`` (its own: paged / ragged
    attention, vLLM), ``bucket`` (its context bucket's longest, buckets planned as the hf engine's
    ``plan_buckets`` with ``max_buckets`` / ``bucket_overhead``).
    ``prompt_lens``: observed prompt lengths to draw from (else every prompt has ``prompt_len``).
    ``share_prompt_prefill``: the G new samples of a prompt share one prefill (hf engine, vLLM
    prefix cache). ``compact_min_frac``: in the compact regime, finished rows are dropped only
    once at least this fraction of the batch is done (0 = at once; the hf engine uses 0.125).
    ``share_min_tokens``: the hf engine's prefix-forest prefill (``HFEngine(share_min_tokens=)``).
    When set, ``context`` is not ``padded`` and the length distribution carries prefix structure
    (``EmpiricalLengths`` from a bench with ``group_prefix``), a step's prefill tokens are counted
    as the engine counts them (``ulorl.rollout.prefix.prefill_tokens``: the batch's distinct
    contexts — new prompts and carried prompt + response-so-far — in one prefix forest, a shared
    prefix kept when ``(users - 1) * tokens >= share_min_tokens``), and ``share_prompt_prefill``
    is moot. Otherwise: carried rows' full contexts plus the new prompts (once per group when
    ``share_prompt_prefill``, else G times); ``padded``: rows x longest context.
    """

    max_len: int
    segments: int
    prompts_per_step: int
    group_size: int
    regime: Regime = "static"
    prompt_len: int = 0
    context: ContextMode = "padded"
    prompt_lens: Optional[tuple[int, ...]] = None   # if set, each prompt's length is drawn from these
    min_ready_groups: int = 1
    max_unfinished: Optional[int] = None
    share_prompt_prefill: bool = False
    compact_min_frac: float = 0.0
    max_buckets: int = 4
    bucket_overhead: float = 256.0
    share_min_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        if self.max_len < 1 or not 1 <= self.segments <= self.max_len:
            raise ValueError(f"need 1 <= segments ({self.segments}) <= max_len ({self.max_len})")
        if self.prompts_per_step < 1 or self.group_size < 1:
            raise ValueError("prompts_per_step and group_size must be >= 1")
        if self.regime not in ("static", "compact"):
            raise ValueError(f"regime must be 'static' or 'compact', got {self.regime!r}")
        if self.context not in ("padded", "row", "bucket"):
            raise ValueError(f"context must be 'padded', 'row' or 'bucket', got {self.context!r}")
        if not 0.0 <= self.compact_min_frac <= 1.0:
            raise ValueError(f"compact_min_frac must be in [0, 1], got {self.compact_min_frac}")

    @property
    def segment_len(self) -> int:
        return segment_length(self.max_len, self.segments)


def effective_context(ctx0: np.ndarray, setup: RolloutSetup, decode_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row context base ``e_i`` (tokens attended at the row's first decode iteration) and
    per-row bucket index (all 0 unless ``context == "bucket"``)."""
    zeros = np.zeros(ctx0.shape, dtype=np.int64)
    if setup.context == "padded":
        return np.full(ctx0.shape, ctx0.max(), dtype=np.int64), zeros
    if setup.context == "row":
        return ctx0.astype(np.int64), zeros
    order = np.argsort(ctx0, kind="stable")
    srt = ctx0[order]
    out = np.empty_like(srt)
    lab = np.empty_like(srt)
    for bi, (a, b) in enumerate(plan_buckets(srt.tolist(), decode_len, setup.max_buckets, setup.bucket_overhead)):
        out[a:b] = srt[b - 1]
        lab[a:b] = bi
    res, labels = np.empty_like(out), np.empty_like(lab)
    res[order], labels[order] = out, lab
    return res, labels


def decode_features(n: np.ndarray, e: np.ndarray, regime: str, compact_min_frac: float = 0.0
                    ) -> tuple[int, int, float]:
    """``(iterations, row-slots, row-context sum)`` of one batch decode.

    Row i decodes ``n[i]`` tokens from context base ``e[i]``; at iteration j a row in the batch
    attends ``e[i] + j`` tokens. static: every row stays for all ``max(n)`` iterations. compact:
    the engine checks before each iteration j >= 1 and drops the done rows once at least
    ``max(1, ceil(compact_min_frac * rows))`` are done (0 = every iteration).
    """
    N = int(n.size)
    if N == 0:
        return 0, 0, 0.0
    iters = int(n.max())
    if regime == "static":
        return iters, N * iters, float(iters * e.sum()) + N * iters * (iters - 1) / 2.0
    if compact_min_frac <= 0.0:
        return iters, int(n.sum()), float((n * e).sum()) + float((n * (n - 1)).sum()) / 2.0
    order = np.argsort(-n, kind="stable")
    s = n[order]                                    # descending: the batch is always a prefix
    ce = np.cumsum(e[order].astype(float))
    asc = s[::-1]
    slots, ctx, j0, Bc = 0, 0.0, 0, N
    while True:
        K = Bc - max(1, math.ceil(compact_min_frac * Bc))
        j_end = min(max(j0 + 1, int(s[K])), iters)
        span = j_end - j0
        slots += Bc * span
        ctx += span * ce[Bc - 1] + Bc * (j0 + j_end - 1) * span / 2.0
        if j_end >= iters:
            return iters, slots, ctx
        j0 = j_end
        Bc = N - int(np.searchsorted(asc, j0, side="right"))     # rows with n > j0


@dataclass
class SimTrace:
    """Per measured step: cost features ``[steps, 7]`` (``FEATURES``) and outcome counts."""

    setup: RolloutSetup
    features: np.ndarray          # [steps, 7]
    completed: np.ndarray         # [steps] samples done (EOS or truncated) this step
    truncated: np.ndarray         # [steps]
    useful_tokens: np.ndarray     # [steps] tokens decoded that belong to a response
    batch_rows: np.ndarray        # [steps]
    unfinished: np.ndarray        # [steps] pool size after the step
    released_groups: np.ndarray   # [steps]
    multi_segment: int            # completed samples decoded over > 1 step
    staleness_sum: int            # sum over completed samples of (last step - first step)
    warmup: int

    @property
    def steps(self) -> int:
        return int(self.features.shape[0])


def simulate(setup: RolloutSetup, dist: LengthDist, *, steps: int = 400, warmup: Optional[int] = None,
             seed: int = 0) -> SimTrace:
    """Run Algorithm 1 for ``warmup + steps`` steps; record the last ``steps``.

    Every sample finishes within ``segments`` steps of its admission, so the pools are stationary
    after ``segments`` steps; the default warmup is ``2 * segments + 2``.
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    warmup = 2 * setup.segments + 2 if warmup is None else warmup
    rng = np.random.default_rng(seed)
    rng_prompt = np.random.default_rng([seed, 1])
    plens = None if not setup.prompt_lens else np.asarray(setup.prompt_lens, dtype=np.int64)
    G, P, M, seg = setup.group_size, setup.prompts_per_step, setup.max_len, setup.segment_len
    # prefix structure is used when its groups have the setup's G (else plain group resampling)
    structured = bool(getattr(dist, "has_prefix_structure", False)) and dist.group_size == G   # type: ignore[attr-defined]
    forest = structured and setup.share_min_tokens is not None and setup.context != "padded"
    total = warmup + steps
    n_groups_max = total * P
    group_left = np.zeros(n_groups_max, dtype=np.int64)      # members not done yet
    group_tokens = np.zeros(n_groups_max, dtype=np.int64)    # prompt + response tokens when done
    ready: list[int] = []
    pool_L = np.zeros(0, dtype=np.int64)
    pool_d = np.zeros(0, dtype=np.int64)
    pool_g = np.zeros(0, dtype=np.int64)
    pool_first = np.zeros(0, dtype=np.int64)
    pool_pl = np.zeros(0, dtype=np.int64)
    pool_rec = np.zeros(0, dtype=np.int64)     # structured: group record and member of each row
    pool_mem = np.zeros(0, dtype=np.int64)
    next_gid = 0
    rec: dict[str, list[Any]] = {k: [] for k in (
        "features", "completed", "truncated", "useful", "rows", "unfinished", "released")}
    multi = stale = 0
    for step in range(total):
        admit = P if setup.max_unfinished is None or pool_L.size < setup.max_unfinished else 0
        if structured:
            grp, recs = dist.sample_structured(rng, admit, next_gid)   # type: ignore[attr-defined]
            new_L = grp.reshape(-1)
            group_pl = np.asarray([len(dist.prompt_of(int(r))) for r in recs], dtype=np.int64)   # type: ignore[attr-defined]
            row_rec = np.concatenate([pool_rec, np.repeat(recs, G)])
            row_mem = np.concatenate([pool_mem, np.tile(np.arange(G, dtype=np.int64), admit)])
        else:
            new_L = dist.sample(rng, admit, G).reshape(-1) if admit else np.zeros(0, dtype=np.int64)
            group_pl = (plens[rng_prompt.integers(0, plens.size, size=admit)] if plens is not None
                        else np.full(admit, setup.prompt_len, dtype=np.int64))
            row_rec = row_mem = np.full(pool_L.size + new_L.size, -1, dtype=np.int64)
        gids = np.repeat(np.arange(next_gid, next_gid + admit), G)
        pl = np.concatenate([pool_pl, np.repeat(group_pl, G)])
        group_left[next_gid:next_gid + admit] = G
        next_gid += admit
        L = np.concatenate([pool_L, new_L])
        d = np.concatenate([pool_d, np.zeros(new_L.size, dtype=np.int64)])
        g = np.concatenate([pool_g, gids])
        first = np.concatenate([pool_first, np.full(new_L.size, step, dtype=np.int64)])
        B = L.size
        L_eff = np.minimum(L, M)
        n = np.minimum(seg, L_eff - d)
        done = d + n == L_eff
        ctx0 = pl + d
        if B == 0:
            feat: list[float] = [0, 0, 0, 0, 0, 1, 0]
        else:
            budget = int(np.minimum(seg, M - d).max())
            e, labels = effective_context(ctx0, setup, budget)
            iters, row_slots, row_ctx = decode_features(n, e, setup.regime, setup.compact_min_frac)
            # a bucket is computed while any of its rows decodes (static: for the whole batch)
            n_b = int(labels.max()) + 1
            if setup.regime == "static":
                extra = (n_b - 1) * iters
            else:
                dur = np.zeros(n_b, dtype=np.int64)
                np.maximum.at(dur, labels, n)
                extra = int(dur.sum()) - iters
            if setup.context == "padded":
                prefill = B * int(ctx0.max())
            elif forest:
                ctxs = [dist.prompt_of(int(row_rec[i]))   # type: ignore[attr-defined]
                        + dist.responses_of(int(row_rec[i]))[int(row_mem[i])][:int(d[i])]   # type: ignore[attr-defined]
                        for i in range(B)]
                prefill = _forest_prefill_tokens(ctxs, int(setup.share_min_tokens))   # type: ignore[arg-type]
            else:
                n_new = new_L.size
                carried_tokens = int(ctx0[: B - n_new].sum())
                new_ctx = int(group_pl.sum()) * (1 if setup.share_prompt_prefill else G)
                prefill = carried_tokens + new_ctx
            feat = [iters, row_slots, row_ctx, prefill, 0, 1, extra]
        # group gating and release
        if done.any():
            dg = g[done]
            np.subtract.at(group_left, dg, 1)
            np.add.at(group_tokens, dg, L_eff[done] + pl[done])
            for gid in np.unique(dg):
                if group_left[gid] == 0:
                    ready.append(int(gid))
        released = 0
        if len(ready) >= setup.min_ready_groups:
            feat[4] = int(group_tokens[ready].sum())
            released = len(ready)
            ready.clear()
        if step >= warmup:
            rec["features"].append(feat)
            rec["completed"].append(int(done.sum()))
            rec["truncated"].append(int((done & (L > M)).sum()))
            rec["useful"].append(int(n.sum()))
            rec["rows"].append(B)
            rec["unfinished"].append(int((~done).sum()))
            rec["released"].append(released)
            spans = step - first[done]
            multi += int((spans > 0).sum())
            stale += int(spans.sum())
        keep = ~done
        pool_L, pool_d, pool_g, pool_first, pool_pl = L[keep], (d + n)[keep], g[keep], first[keep], pl[keep]
        pool_rec, pool_mem = row_rec[keep], row_mem[keep]
    return SimTrace(
        setup=setup,
        features=np.asarray(rec["features"], dtype=float),
        completed=np.asarray(rec["completed"]),
        truncated=np.asarray(rec["truncated"]),
        useful_tokens=np.asarray(rec["useful"]),
        batch_rows=np.asarray(rec["rows"]),
        unfinished=np.asarray(rec["unfinished"]),
        released_groups=np.asarray(rec["released"]),
        multi_segment=multi,
        staleness_sum=stale,
        warmup=warmup,
    )


@dataclass
class SimResult:
    """Predictions for one (S, regime); times in seconds."""

    segments: int
    regime: str
    step_time_s: float            # mean
    step_time_median_s: float
    finished_per_s: float         # samples done (EOS or truncated) per second
    tokens_per_s: float           # useful decoded tokens per second
    decode_utilization: float     # useful tokens / row-slots computed
    prefill_frac: float
    train_frac: float
    iters_per_finished: float     # decode iterations per finished sample (hardware independent)
    decode_iters_per_step: float
    batch_rows_mean: float
    unfinished_mean: float
    finished_per_step: float
    truncated_frac: float
    multi_segment_frac: float     # finished samples generated by more than one policy step
    staleness_mean: float         # mean policy versions between first and last segment
    prefill_tokens_per_finished: float = 0.0
    ratio_vs_s1: Optional[float] = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(trace: SimTrace, cost: CostModel) -> SimResult:
    """Apply a cost model to a simulated trace (no re-simulation)."""
    theta = cost.vector()
    ms = trace.features @ theta
    total_s = float(ms.sum()) / 1000.0
    f = trace.features
    completed = int(trace.completed.sum())
    useful = int(trace.useful_tokens.sum())
    decode_ms = float((f @ cost.decode_vector()).sum())
    prefill_ms = float(f[:, 3].sum() * cost.p)
    train_ms = float(f[:, 4].sum() * cost.t)
    inf = float("inf")
    return SimResult(
        segments=trace.setup.segments,
        regime=trace.setup.regime,
        step_time_s=float(ms.mean()) / 1000.0,
        step_time_median_s=float(np.median(ms)) / 1000.0,
        finished_per_s=completed / total_s if total_s > 0 else inf,
        tokens_per_s=useful / total_s if total_s > 0 else inf,
        decode_utilization=useful / float(f[:, 1].sum()) if f[:, 1].sum() else 0.0,
        prefill_frac=prefill_ms / (total_s * 1000.0) if total_s > 0 else 0.0,
        train_frac=train_ms / (total_s * 1000.0) if total_s > 0 else 0.0,
        iters_per_finished=float(f[:, 0].sum()) / completed if completed else inf,
        decode_iters_per_step=float(f[:, 0].mean()),
        batch_rows_mean=float(trace.batch_rows.mean()),
        unfinished_mean=float(trace.unfinished.mean()),
        finished_per_step=completed / trace.steps,
        truncated_frac=int(trace.truncated.sum()) / completed if completed else 0.0,
        multi_segment_frac=trace.multi_segment / completed if completed else 0.0,
        staleness_mean=trace.staleness_sum / completed if completed else 0.0,
        prefill_tokens_per_finished=float(f[:, 3].sum()) / completed if completed else inf,
        extra={"decode_s_per_step": decode_ms / 1000.0 / trace.steps},
    )


def add_ratios(results: Sequence[SimResult]) -> None:
    """Set ``ratio_vs_s1`` = finished/s relative to S = 1 of the same regime (when present)."""
    base = {r.regime: r.finished_per_s for r in results if r.segments == 1}
    for r in results:
        if r.regime in base and base[r.regime] > 0:
            r.ratio_vs_s1 = r.finished_per_s / base[r.regime]


# ----------------------------------------------------------------------------- fitting


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of columns (exhaustive over active sets)."""
    k = X.shape[1]
    best, best_err = np.zeros(k), float(np.sum(y ** 2))
    for m in range(1, k + 1):
        for cols in combinations(range(k), m):
            sol, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
            if np.any(sol < 0):
                continue
            err = float(np.sum((X[:, cols] @ sol - y) ** 2))
            if err < best_err - 1e-12 * max(1.0, best_err):
                best, best_err = np.zeros(k), err
                best[list(cols)] = sol
    return best


def fit_cost_curve(points: Iterable[dict[str, float]]) -> tuple[CostModel, dict[str, float]]:
    """Fit ``ms = a + b*rows + c*rows*context`` (a, b, c >= 0) to ``{"rows","context","ms_per_iter"}``
    points, weighting relative errors. Returns the model and fit quality (max / mean |rel. error|)."""
    pts = list(points)
    if len(pts) < 1:
        raise ValueError("cost curve is empty")
    try:
        rows = np.array([float(p["rows"]) for p in pts])
        ctx = np.array([float(p["context"]) for p in pts])
        ms = np.array([float(p["ms_per_iter"]) for p in pts])
    except KeyError as exc:
        raise ValueError(f"cost curve point without {exc.args[0]!r} (need rows, context, ms_per_iter)") from None
    X = np.stack([np.ones_like(rows), rows, rows * ctx], axis=1)
    w = 1.0 / np.maximum(ms, 1e-9)
    sol = _nnls(X * w[:, None], ms * w)
    pred = X @ sol
    rel = np.abs(pred - ms) / np.maximum(ms, 1e-9)
    return CostModel(a=float(sol[0]), b=float(sol[1]), c=float(sol[2])), {
        "points": len(pts), "max_rel_err": float(rel.max()), "mean_rel_err": float(rel.mean())}


def fit_prefill_curve(points: Iterable[dict[str, float]]) -> tuple[float, dict[str, float]]:
    """Prefill ms per token from ``{"tokens", "ms"}`` points (``ms = q + p * tokens``, q, p >= 0;
    the per-call ``q`` is left to the per-step overhead). Returns ``p`` and fit quality."""
    pts = list(points)
    try:
        tok = np.array([float(x["tokens"]) for x in pts])
        ms = np.array([float(x["ms"]) for x in pts])
    except KeyError as exc:
        raise ValueError(f"prefill curve point without {exc.args[0]!r} (need tokens, ms)") from None
    if not pts:
        raise ValueError("prefill curve is empty")
    X = np.stack([np.ones_like(tok), tok], axis=1)
    w = 1.0 / np.maximum(ms, 1e-9)
    sol = _nnls(X * w[:, None], ms * w)
    rel = np.abs(X @ sol - ms) / np.maximum(ms, 1e-9)
    return float(sol[1]), {"points": len(pts), "call_ms": float(sol[0]), "max_rel_err": float(rel.max())}


S1_FREE = ("scale", "overhead", "bucket")


def fit_s1(decode: CostModel, traces: dict[str, SimTrace], measured: dict[str, dict[str, float]],
           *, free: Sequence[str] = ("scale", "overhead"), prefill_ms_per_token: Optional[float] = None
           ) -> tuple[CostModel, dict[str, Any]]:
    """Calibrate the in-run cost on S = 1 measurements only (``traces[regime]`` are S = 1
    simulations, ``measured[regime]`` the bench rows with ``finished_per_s`` and ``prefill_frac``).

    * prefill ``p``: ``prefill_ms_per_token`` when given, else the in-run prefill time per prefilled
      token at S = 1 (``prefill_frac`` x mean step time / simulated prefill tokens);
    * then non-negative least squares of the remaining mean step time (from ``finished_per_s``) on
      the ``free`` terms: ``scale`` (factor k on the cost curve's a, b, c; else k = 1),
      ``overhead`` (ms per step), ``bucket`` (ms per extra context bucket per iteration). With two
      regimes and two free terms the fit is exact when the solution is non-negative.
    """
    bad = [f for f in free if f not in S1_FREE]
    if bad:
        raise ValueError(f"unknown free terms {bad}; choose from {S1_FREE}")
    regimes = [r for r in ("static", "compact") if r in traces and r in measured]
    if not regimes:
        raise ValueError("fit_s1 needs S=1 measurements of at least one regime")
    D, P, T, one, bkt = [], [], [], [], []
    base = replace(CostModel(), a=decode.a, b=decode.b, c=decode.c)
    for r in regimes:
        tr, m = traces[r], measured[r]
        if (m.get("finished_per_s") or 0) <= 0:
            raise ValueError(f"S=1 {r}: measured finished_per_s must be > 0")
        f = tr.features.mean(0)
        D.append(float(f @ base.decode_vector()))
        P.append(float(f[3]))
        one.append(1.0)
        bkt.append(float(f[6]))
        T.append(float(tr.completed.mean()) / m["finished_per_s"] * 1000.0)   # mean step ms
    D_, P_, T_ = map(np.array, (D, P, T))
    fracs = np.array([float(measured[r].get("prefill_frac") or 0.0) for r in regimes])
    if prefill_ms_per_token is not None:
        p = float(prefill_ms_per_token)
    else:
        p = float(np.sum(fracs * T_) / np.sum(P_)) if np.sum(P_) > 0 else 0.0
    rest = T_ - p * P_
    cols = {"scale": D_, "overhead": np.array(one), "bucket": np.array(bkt)}
    use = [f for f in free if np.any(cols[f] != 0)]
    if "scale" not in use:
        rest = rest - D_
    sol = _nnls(np.stack([cols[f] for f in use], axis=1), rest) if use else np.zeros(0)
    got = dict(zip(use, map(float, sol)))
    k = got.get("scale", 1.0)
    model = replace(decode.scaled_decode(k), p=p, o=got.get("overhead", 0.0), bk=got.get("bucket", 0.0))
    resid = (np.stack([cols[f] for f in use], axis=1) @ sol if use else 0.0) - rest
    return model, {"decode_scale": k, "prefill_ms_per_token": p, "overhead_ms": model.o,
                   "bucket_iter_ms": model.bk, "free": list(free),
                   "max_abs_resid_ms": float(np.max(np.abs(resid))) if use else None}


def fit_two_points(trace1: SimTrace, trace2: SimTrace, t1_s: float, t2_s: float, *,
                   base: CostModel = CostModel(), second: Literal["overhead", "prefill"] = "overhead"
                   ) -> CostModel:
    """Flat-cost regime: solve ``a`` (ms per iteration) and ``o`` (per-step ms, e.g. training) — or
    ``p`` (ms per prefilled token) with ``second="prefill"`` — so the two traces' mean step times
    equal ``t1_s`` and ``t2_s`` exactly. Other coefficients come from ``base``."""
    col = {"overhead": 5, "prefill": 3}[second]
    fixed = base.vector().copy()
    fixed[0] = fixed[col] = 0.0
    rows, rhs = [], []
    for tr, t in ((trace1, t1_s), (trace2, t2_s)):
        f = tr.features.mean(0)
        rows.append([f[0], f[col]])
        rhs.append(t * 1000.0 - float(f @ fixed))
    sol = np.linalg.solve(np.array(rows), np.array(rhs))
    v = fixed.copy()
    v[0], v[col] = sol
    return CostModel(*map(float, v))
