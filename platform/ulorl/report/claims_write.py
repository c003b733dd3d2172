"""The claims as text: claims.md / claims.json (:func:`write_claims`) and the generated blocks of
paper_claims.md and the README (:func:`update_docs`). Part of :mod:`ulorl.report.claims`."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from ulorl.eval.paired import (
    ARMS_IDENTICAL,
    FEW_SEEDS,
    INCONCLUSIVE,
    MIN_T_SEEDS,
    POWER,
    REFUSED,
)
from ulorl.report.claims_eval import (
    ClaimResult,
    evaluate_claims,
)
from ulorl.report.claims_registry import (
    B_NONE,
    CLAIMS,
    FINAL,
    NOT_RUN,
    Claim,
)
from ulorl.report.preregistration import (
    PREREG_RULE,
    UNKNOWN,
    preregistration_markdown,
    preregistration_of,
    repo_root,
)
from ulorl.report.store import RunSource

# ----------------------------------------------------------------------------- writers


def _f(x: Optional[float], digits: int = 4) -> str:
    return "—" if x is None else f"{x:+.{digits}f}"


def _pct(level: float) -> str:
    return f"{100 * level:.0f}"


def interval_text(r: ClaimResult) -> str:
    """``seeds t95 [lo, hi]; problems boot95 [lo, hi] (P)`` (each part only when it exists)."""
    parts = []
    if r.t_low is not None:
        parts.append(f"seeds t{_pct(r.level)} [{_f(r.t_low)}, {_f(r.t_high)}]")
    if r.problem_low is not None:
        parts.append(f"problems boot{_pct(r.level)} [{_f(r.problem_low)}, {_f(r.problem_high)}] ({r.problems})")
    return "; ".join(parts) or "—"


def mde_text(r: ClaimResult, digits: int = 4) -> str:
    """``0.0512 (seeds 0.0512, problems 0.0301)``; a no-difference claim: ``margin 0.0700 (seeds 0.0700,
    problems 0.0410); +-0.05 needs ~14 seeds``; ``—`` without an interval."""
    if r.direction == 0:
        best, pairs = r.eq_margin, (("seeds", r.eq_margin_seeds), ("problems", r.eq_margin_problems))
    else:
        best, pairs = r.mde, (("seeds", r.mde_seeds), ("problems", r.mde_problems))
    if best is None:
        return "—"
    parts = [f"{name} {v:.{digits}f}" for name, v in pairs if v is not None]
    text = f"{best:.{digits}f}" + (f" ({', '.join(parts)})" if len(parts) > 1 else f" ({parts[0].split()[0]})")
    if r.direction == 0:
        text = "margin " + text + _needs(r)
    return text + _floor(r)


def _floor(r: ClaimResult) -> str:
    """The practical-size floor beside the MDE, when the claim sets one."""
    return "" if r.floor is None else f"; floor {r.floor:g}"


def _needs(r: ClaimResult) -> str:
    if r.margin is None or r.seeds_for_margin is None:
        return ""
    return f"; +-{r.margin:g} needs ~{r.seeds_for_margin} seeds"


def verdict_text(r: ClaimResult) -> str:
    """The verdict cell's reason, when the verdict is not one the intervals decided: no t-interval
    across seeds, a refused verdict; "" otherwise (the notes hold every reason in full)."""
    if r.verdict == REFUSED:
        return "no selection / confirmation split"
    if r.verdict in (INCONCLUSIVE, FEW_SEEDS) and "no t-interval" in r.why:
        return "no t-interval across seeds; the problem bootstrap alone decides nothing"
    return ""


CLAIMS_COLUMNS = ("Claim", "Paper says", "Arms (a vs b)", "Metric", "Sweep", "Seeds", "Effect (a - b)", "Interval",
                  "Level", "Verdict rests on", "MDE", "Verdict", "Run ids")

RULES = [
    "- Effect: mean over seeds of the per-seed difference a - b (runs paired by data.seed, rollout.seed, "
    "train.seed, within one sweep; launches of one sweep pooled when their fixed settings agree). seeds tNN: "
    f"t-interval over the per-seed differences, used only with >= {MIN_T_SEEDS} seeds and a non-zero spread; "
    "problems bootNN: paired bootstrap over the held-out problems every run shares, each problem averaged over "
    "seeds first. Level: 95 % for 'a beats b' claims, 90 % for 'a equals b within +-margin' (two one-sided "
    "tests at alpha 0.05).",
    "- Verdict: a directional claim 'holds' only if every interval excludes zero in the paper's direction, 'does "
    "not hold' if every one excludes it in the opposite direction; a no-difference claim holds if every interval "
    "lies inside +-margin (ours), does not hold if every one lies wholly outside it; else 'inconclusive'. Fewer "
    "than 2 paired seeds, or 2 without an interval over problems: 'not enough seeds'. Only FINISHED runs count.",
    f"- 'holds' / 'does not hold' need the t-interval across seeds (>= {MIN_T_SEEDS} seeds with a spread): without "
    "it the row is 'inconclusive' whatever the problem bootstrap says (it sees one draw of the training seeds). "
    f"'{ARMS_IDENTICAL}': the two arms' runs are bit-identical on every seed. '{REFUSED}': a configuration a "
    "search selected, with no held-out problems the search did not see (no eval.final, no eval.select_problems). "
    "A row that repeats or negates another on the same runs is not shown (the other row's notes say so).",
    f"- MDE (minimum detectable effect): the true difference an interval of the row's level would tell from zero "
    f"with {100 * POWER:.0f} % probability given the observed spread: (t_(1+level)/2,n-1 + t_{POWER:.2f},n-1) x "
    "sd / sqrt(n) over seeds, (z_(1+level)/2 + z_0.80) x sd / sqrt(P) over problems; the larger one is shown "
    "first (both intervals must agree). An inconclusive row leaves effects of about this size undecided. "
    f"A no-difference claim shows instead the smallest margin its design could establish with {100 * POWER:.0f} % "
    "probability when the true difference is 0 (two one-sided tests at alpha 0.05: (t_0.95,n-1 + t_0.90,n-1) x "
    "sd / sqrt(n), z over problems) and the seeds its own margin would need at the observed spread.",
    "- Run ids: first 8 characters (claims.json has them in full, per seed).",
]


def claims_markdown(results: Sequence[ClaimResult]) -> str:
    """The verdict table with one row per (claim, sweep) and the notes under it."""
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["### The paper's claims over seeds", "",
             "| " + " | ".join(CLAIMS_COLUMNS) + " |", "|" + "|".join("---" for _ in CLAIMS_COLUMNS) + "|"]
    for r in results:
        per_seed = ", ".join(_f(p["diff"]) for p in r.per_seed)
        effect = _f(r.effect) + (f" (per seed {per_seed})" if len(r.per_seed) > 1 else "")
        metric = r.metric + (f" ({r.bench})" if r.bench and r.bench != "heldout" else "")
        level = f"{_pct(r.level)} %" + (f", margin +-{r.margin:g}" if r.margin is not None else "")
        cells = [r.claim, r.paper_says, r.arms, metric, r.sweep or "—", str(r.seeds), effect, interval_text(r),
                 level, r.basis, mde_text(r), f"**{r.verdict}**" + (f" ({verdict_text(r)})" if verdict_text(r) else ""),
                 " ".join(rid[:8] for rid in r.run_ids) or "—"]
        lines.append("| " + " | ".join(esc(c) for c in cells) + " |")
    lines += [""] + RULES
    for r in results:
        lines += [f"- {r.claim} ({r.sweep or 'no sweep'}): {n}" for n in r.notes]
    return "\n".join(lines) + "\n"


DOCS_COLUMNS = ("claim", "sweep", "seeds", "effect a - b (per seed)", "t-interval across seeds",
                "paired bootstrap over problems", "MDE (no-difference claims: smallest margin)", "verdict")
DOCS_BEGIN, DOCS_END = "<!-- claims-table:begin -->", "<!-- claims-table:end -->"


# A sweep named <folder>_<rest> in these folders is sweeps/<folder>/<rest>.yaml (its ``name:``).
SWEEP_FOLDERS = ("choice", "entropy")


def _sweep_command(r: ClaimResult, claims: Sequence[Claim]) -> str:
    name = r.sweep.split(" ")[0]
    for folder in SWEEP_FOLDERS:
        if name.startswith(folder + "_"):
            return f"`ulorl-sweep sweeps/{folder}/{name[len(folder) + 1:]}.yaml`"
    cmd = next((c.sweep for c in claims if c.name == r.claim), "")
    return f"`{cmd}`" if cmd else "—"


@dataclass(frozen=True)
class _Cells:
    """The cells both claims tables share, formatted once: held-out metrics to 3 decimals, entropy
    (nats / token) to 4."""
    digits: int
    claim: str
    t: str
    problems: str
    mde: str
    margin: str

    @classmethod
    def of(cls, r: ClaimResult) -> _Cells:
        d = 3 if r.bench else 4
        return cls(
            digits=d,
            claim=f"{r.claim}: {r.arms}" + (f", {r.bench}" if r.bench and r.bench != "heldout" else ""),
            t=f"[{_f(r.t_low, d)}, {_f(r.t_high, d)}]" if r.t_low is not None else "—",
            problems=f"[{_f(r.problem_low, d)}, {_f(r.problem_high, d)}]" if r.problem_low is not None else "—",
            mde=_mde_cell(r, d),
            margin=f", margin +-{r.margin:g}" if r.margin is not None else "",
        )


def _mde_cell(r: ClaimResult, d: int) -> str:
    """The MDE of a directional row; a no-difference row's smallest establishable margin and the seeds
    its own margin would need."""
    if r.direction == 0:
        return "—" if r.eq_margin is None else f"margin {r.eq_margin:.{d}f}{_needs(r)}"
    return ("—" if r.mde is None else f"{r.mde:.{d}f}") + _floor(r)


def _verdict_cell(r: ClaimResult, c: _Cells, level: str = "") -> str:
    """``**inconclusive** (95 %, seeds + problems)``, with the reason when the intervals did not decide."""
    inside = ", ".join(x for x in (level, r.basis if r.basis != B_NONE else "") if x) + (
        c.margin if r.basis != B_NONE else "")
    why = verdict_text(r)
    inside = "; ".join(x for x in (inside, why) if x)
    return f"**{r.verdict}**" + (f" ({inside})" if inside else "")


def _table_head(columns: Sequence[str]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]


def _table_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def docs_table(results: Sequence[ClaimResult], claims: Sequence[Claim] = CLAIMS) -> str:
    """The claims table of ``platform/ulorl/docs/paper_claims.md`` (between :data:`DOCS_BEGIN` and
    :data:`DOCS_END`): three decimals, the level beside each interval and verdict."""
    lines = _table_head(DOCS_COLUMNS)
    for r in results:
        c = _Cells.of(r)
        per_seed = ", ".join(_f(p["diff"], c.digits) for p in r.per_seed)
        effect = _f(r.effect, c.digits) + (f" ({per_seed})" if len(r.per_seed) > 1 else "")
        level = f"{_pct(r.level)} %"
        t = f"{c.t} ({level})" if r.t_low is not None else c.t
        pb = f"{c.problems} ({level}, {r.problems} problems)" if r.problem_low is not None else c.problems
        lines.append(_table_row((c.claim, _sweep_command(r, claims), str(r.seeds), effect, t, pb, c.mde,
                                 _verdict_cell(r, c))))
    return "\n".join(lines) + "\n"


SUMMARY_COLUMNS = ("claim (paper)", "seeds", "effect a - b", "t-interval across seeds",
                   "bootstrap over problems", "MDE (no-difference: smallest margin)", "verdict", "command")
SUMMARY_BEGIN, SUMMARY_END = "<!-- claims-summary:begin -->", "<!-- claims-summary:end -->"


def summary_table(results: Sequence[ClaimResult], claims: Sequence[Claim] = CLAIMS) -> str:
    """The README's short claims table (between :data:`SUMMARY_BEGIN` and :data:`SUMMARY_END`): the
    paper's own claims only (the entropy-control comparisons stay on the docs page), without the
    per-seed differences."""
    paper = {c.name for c in claims if "entropy_controls" not in c.paper_refs}
    lines = _table_head(SUMMARY_COLUMNS)
    for r in results:
        if r.claim not in paper:
            continue
        c = _Cells.of(r)
        v = _verdict_cell(r, c, f"{_pct(r.level)} %" if r.basis != B_NONE else "")
        lines.append(_table_row((c.claim, str(r.seeds), _f(r.effect, c.digits), c.t, c.problems, c.mde, v,
                                 _sweep_command(r, claims))))
    return "\n".join(lines) + "\n"


READING_BEGIN, READING_END = "<!-- claims-reading:begin -->", "<!-- claims-reading:end -->"


def _sweep_name(r: ClaimResult) -> str:
    return r.sweep.split(" ")[0]


def _seeds(n: int) -> str:
    return f"{n} seed" + ("s" if n != 1 else "")


def reading_markdown(results: Sequence[ClaimResult]) -> str:
    """What the claims table says, in sentences whose every number comes from ``results`` (the block
    between :data:`READING_BEGIN` and :data:`READING_END` of ``platform/ulorl/docs/paper_claims.md``):
    per row with runs its effect, how many seeds point each way, the interval(s), the verdict and
    why, what the design could have detected (or the smallest margin a no-difference claim could
    establish), the paper's own difference beside it; then per sweep what its runs cost."""
    lines = []
    for r in results:
        if not r.seeds and r.verdict == NOT_RUN:
            lines.append(f"- **{r.claim}** ({r.arms}): not run; {_sweep_command(r, CLAIMS)} produces it.")
            continue
        c = _Cells.of(r)
        d = c.digits
        head = f"- **{r.claim}** ({r.arms}; `{_sweep_name(r)}`, {_seeds(r.seeds)}" + (
            f", {r.bench}" if r.bench and r.bench != "heldout" else "") + ")"
        if r.verdict == REFUSED:
            lines.append(f"{head}: **{r.verdict}**: {r.why}.")
            continue
        if r.verdict == ARMS_IDENTICAL:
            lines.append(f"{head}: **{r.verdict}**: the two arms' runs are bit-identical on all {r.seeds} seeds, "
                         "so there is no difference to test.")
            continue
        diffs = [p["diff"] for p in r.per_seed]
        up, down = sum(x > 0 for x in diffs), sum(x < 0 for x in diffs)
        ivs = [f"seeds t{_pct(r.level)} {c.t}"] * (r.t_low is not None) + [
            f"problems boot{_pct(r.level)} {c.problems} over {r.problems} problems"] * (r.problem_low is not None)
        text = (f"{head}: a - b = {_f(r.effect, d)}, above zero in {up} and below in {down} of {_seeds(len(diffs))}"
                + (f"; {'; '.join(ivs)}" if ivs else "") + f": **{r.verdict}**")
        text += f" ({r.why})." if r.why and r.verdict in (INCONCLUSIVE, FEW_SEEDS) and "no t-interval" in r.why \
            else "."
        if r.direction == 0 and r.eq_margin is not None and r.margin is not None:
            side = "above" if r.eq_margin > r.margin else "inside"
            text += (f" The smallest margin this design could establish with {100 * POWER:.0f} % power is "
                     f"{r.eq_margin:.{d}f}, {side} its +-{r.margin:g}")
            text += (f"; +-{r.margin:g} would need about {r.seeds_for_margin} seeds at this spread."
                     if r.seeds_for_margin else ".")
        elif r.mde is not None and r.verdict == INCONCLUSIVE:
            text += f" A true difference below about {r.mde:.{d}f} could hide here ({100 * POWER:.0f} % power)."
        if r.eval_noise_share is not None:
            text += (f" Evaluation sampling alone (k = {r.eval_k}, {r.problems} problems) explains about "
                     f"{100 * r.eval_noise_share:.0f} % of the per-seed differences' variance.")
        if r.paper_effect is not None and r.mde is not None:
            rel = "below" if abs(r.paper_effect) < r.mde else "above"
            text += f" The paper's own difference, {r.paper_effect:+.3f}, is {rel} this MDE"
            text += (f"; detecting it at this spread would take about {r.seeds_for_paper_effect} seeds."
                     if r.seeds_for_paper_effect else ".")
        lines.append(text)
    done: set[str] = set()
    cost_lines = []
    for r in results:
        name = _sweep_name(r)
        if not all(r.costs.get(arm) for arm in ("a", "b")) or name in done:
            continue
        done.add(name)
        parts = []
        for label, k in zip(r.arms.split(" vs "), (r.costs["a"], r.costs["b"])):
            text = f"{label}: {k['wall_s'] / 60:.1f} min per run"
            if "eval_share" in k:
                text += f", {100 * k['eval_share']:.1f} % of it in periodic evals"
            if "final_share" in k:
                text += f", {100 * k['final_share']:.1f} % in the final evaluation"
            parts.append(text)
        counts = {int(r.costs[arm]["runs"]) for arm in ("a", "b")}
        read = "" if counts == {r.seeds} else f", {'/'.join(str(int(r.costs[arm]['runs'])) for arm in ('a', 'b'))} " \
            "of them in one sitting"
        cost_lines.append(f"- `{name}` ({_seeds(r.seeds)}{read}): " + "; ".join(parts) + ".")
    if cost_lines:
        lines += ["", "Wall time of the runs (`time/wall_s`, `time/eval_s`, `time/final_eval_s` in the results files; "
                  "runs resumed from a checkpoint left out; the machines were shared, see below):", ""] + cost_lines
    return "\n".join(lines) + "\n"


FINAL_COST_BEGIN, FINAL_COST_END = "<!-- claims-final-cost:begin -->", "<!-- claims-final-cost:end -->"
PREREG_BEGIN, PREREG_END = "<!-- claims-preregistration:begin -->", "<!-- claims-preregistration:end -->"


def final_cost_markdown(results: Sequence[ClaimResult]) -> str:
    """What the final evaluation (``eval.final``) cost, per sweep whose claim rows read it, from the
    paired runs' ``time/final_eval_s``, ``time/eval_s`` and ``time/wall_s`` (:func:`run_costs`): per arm
    its seconds, its share of a run's wall time, what it adds to the run without it, and how many times
    the run's periodic evals together it took (the block between :data:`FINAL_COST_BEGIN` and
    :data:`FINAL_COST_END` of ``platform/ulorl/docs/paper_claims.md``)."""
    lines, done = [], set()
    for r in results:
        name = _sweep_name(r)
        arms = [r.costs.get(arm, {}) for arm in ("a", "b")]
        if r.bench != FINAL or name in done or not all("final_eval_s" in k for k in arms):
            continue
        done.add(name)
        size = ""
        if all("final_k" in k for k in arms) and len({(k["final_k"], k["final_problems"]) for k in arms}) == 1:
            size = f", k = {arms[0]['final_k']:.0f} on {arms[0]['final_problems']:.0f} problems"
        parts = []
        for label, k in zip(r.arms.split(" vs "), arms):
            lo, hi, n = k["final_min_s"], k["final_max_s"], int(k["runs"])
            secs = f"{lo:.0f} s" if n == 1 else f"{lo:.0f}-{hi:.0f} s over {n} runs"
            text = (f"{label}: {secs}, {100 * k['final_share']:.1f} % of a run "
                    f"(+{100 * k['final_added']:.1f} % on the run without it)")
            if "final_vs_periodic" in k:
                text += f", {k['final_vs_periodic']:.1f} x its periodic evals together"
            parts.append(text)
        lines.append(f"- `{name}` ({_seeds(r.seeds)}{size}): " + "; ".join(parts) + ".")
    if not lines:
        return "No results file holds a final evaluation yet.\n"
    return ("The final evaluation's cost, measured on each arm's paired runs that ran in one sitting (a run "
            "resumed from a checkpoint is left out: its wall time spans sittings). The machines were shared "
            "with other work, so the seconds of one run and the next differ many times over; the shares are "
            "each run's own, averaged:\n\n" + "\n".join(lines) + "\n")


def replace_docs_table(text: str, table: str, begin: str = DOCS_BEGIN, end: str = DOCS_END) -> str:
    """``text`` with the block between ``begin`` and ``end`` replaced by ``table``."""
    m = re.search(re.escape(begin) + r"\n.*?" + re.escape(end), text, flags=re.S)
    if m is None:
        raise ValueError(f"no {begin} ... {end} block to replace")
    return text[: m.start()] + begin + "\n" + table + end + text[m.end():]


def update_docs(text: str, results: Sequence[ClaimResult]) -> str:
    """``text`` with every claims block it holds rewritten: the full table (:func:`docs_table`), the
    README's summary (:func:`summary_table`), the reading of the table (:func:`reading_markdown`) and
    the final evaluation's cost (:func:`final_cost_markdown`); a ValueError when it holds none."""
    blocks = ((DOCS_BEGIN, DOCS_END, docs_table), (SUMMARY_BEGIN, SUMMARY_END, summary_table),
              (READING_BEGIN, READING_END, reading_markdown),
              (FINAL_COST_BEGIN, FINAL_COST_END, final_cost_markdown),
              (PREREG_BEGIN, PREREG_END, preregistration_markdown))
    present = [(b, e, make) for b, e, make in blocks if b in text]
    if not present:
        raise ValueError(f"no {DOCS_BEGIN} or {SUMMARY_BEGIN} block to replace")
    for begin, end, make in present:
        text = replace_docs_table(text, make(results), begin, end)
    return text


def claims_json(results: Sequence[ClaimResult]) -> str:
    return json.dumps([{**asdict(r), "mde": r.mde} for r in results], indent=1)


def write_claims(source: RunSource, out_dir: str | Path) -> dict[str, Any]:
    """Write ``claims.md`` and ``claims.json`` into ``out_dir``; returns ``{"files": [...], "rows":
    [{claim, sweep, seeds, effect, verdict, level, mde}, ...], "results": [ClaimResult, ...]}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = evaluate_claims(source)
    md, js = out / "claims.md", out / "claims.json"
    md.write_text(claims_markdown(results) + "\n### Pre-registration\n\n" + PREREG_RULE + "\n\n"
                  + preregistration_markdown(results))
    js.write_text(claims_json(results))
    repo = repo_root()
    prereg = {id(r): p.status for r in results if (p := preregistration_of(r, repo)) is not None}
    rows = [{"claim": r.claim, "sweep": r.sweep, "seeds": r.seeds, "effect": r.effect, "verdict": r.verdict,
             "level": r.level, "mde": r.mde, "basis": r.basis, "preregistered": prereg.get(id(r), UNKNOWN)}
            for r in results]
    return {"files": [str(md), str(js)], "rows": rows, "results": results}
