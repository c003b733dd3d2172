"""The paper's claims checked over seeds: an effect size, intervals, a minimum detectable effect and
a verdict per claim.

Every claim compares two arms of one sweep (runs with one ``ulorl.sweep`` tag, e.g. masking static
vs off) on one metric, paired by seed: the runs of the two arms with the same (data.seed,
rollout.seed, train.seed) form one pair, and d_s = metric(arm a, seed s) - metric(arm b, seed s).
Runs of one sweep made by several launches (seed offsets added in chunks, ``seed_offsets``) are
pooled when their fixed settings agree (:func:`sweep_groups`); the statistics are
:mod:`ulorl.eval.paired`'s:

- effect = mean_s d_s;
- held-out metrics read the final evaluation (``eval.final``: after the last step, on held-out
  problems no periodic eval scores) when every paired run has it, else the periodic evals;
- across seeds: the t-interval over the d_s, usable only with >= 3 seeds and a non-zero spread;
- over problems (held-out metrics only, where every run logged its per-problem CSV): the paired
  bootstrap over the held-out problems all runs share, each problem's score averaged over the
  seeds of its arm first;
- level: 95 % intervals for "a beats b" claims, 90 % for "a equals b within +-margin" (the two
  one-sided tests at alpha 0.05); the row states it;
- verdict (:func:`ulorl.eval.paired.judge`): directional claims hold when every interval excludes
  zero in the paper's direction, do not hold when every one excludes it in the other; a
  no-difference claim holds when every interval lies inside +-margin, does not hold when every one
  lies wholly outside; either needs the t-interval among the intervals (without it: inconclusive,
  and the row says why); anything else is inconclusive; fewer than 2 paired seeds (or 2 without a
  per-problem interval): "not enough seeds";
- "arms identical" when the two arms' runs are bit-identical on every seed; "refused" for a
  configuration a search selected when no held-out problems the search did not see exist;
- a row that repeats or negates an earlier one on the same runs is dropped (:func:`drop_mirrored_rows`);
- minimum detectable effect (directional claims): the true difference each interval would tell
  from zero with 80 % probability, given the observed spread, seeds and problems; the row shows
  the larger (both intervals must agree); no-difference claims show instead the smallest margin
  the two one-sided tests could establish with 80 % probability and the seeds their margin needs.

The headline claim (best tau x sigma vs masking off) reads only the re-run seeds of the best
configuration (seed 0 of the search picked it) on problems the search did not see: the final
evaluation's, else the confirmation part of the held-out problems (``eval/heldout_confirm/avg_at_k``,
``eval.select_problems``).

The paper's direction of every claim is written once, in :data:`CLAIMS`.

    results = evaluate_claims(RunStore.open(uri))          # or ResultsStore.open("experiments/results")
    Path("claims.md").write_text(claims_markdown(results))

The parts, one job each: :mod:`~ulorl.report.claims_registry` (metrics, arms, the registry),
:mod:`~ulorl.report.claims_select` (which runs a claim reads), :mod:`~ulorl.report.claims_metrics`
(what it reads of a run), :mod:`~ulorl.report.claims_eval` (the statistics and the verdict per row),
:mod:`~ulorl.report.claims_write` (claims.md / claims.json and the docs blocks). This module re-exports
them and the verdict functions of :mod:`ulorl.eval.paired` the claims use.
"""

from __future__ import annotations

from ulorl.eval.paired import (
    ARMS_IDENTICAL,
    FEW_SEEDS,
    HOLDS,
    INCONCLUSIVE,
    NOT_HOLD,
    REFUSED,
    judge,
    pooled_problem_interval,
    t_cdf_two_sided,
    t_interval,
    t_quantile,
    verdict,
)
from ulorl.report.claims_eval import (
    ClaimResult,
    attach_run_provenance,
    drop_mirrored_rows,
    evaluate_claims,
    evaluate_group,
    mirror_of,
)
from ulorl.report.claims_metrics import (
    Value,
    arms_identical,
    eval_noise,
    final_mean,
    run_costs,
    run_value,
)
from ulorl.report.claims_registry import (
    B_BOTH,
    B_NONE,
    B_PROBLEMS,
    B_SEEDS,
    CLAIMS,
    CONFIRM,
    DMMPT,
    ENTROPY,
    FINAL,
    FINAL_WINDOW,
    HELDOUT,
    LOOSE,
    M_ENTROPY,
    M_HELDOUT,
    M_HELDOUT_SAMPLES,
    M_SIGMA_GAP,
    METRIC_TEXT,
    NOT_RUN,
    OFF,
    PER_PROBLEM,
    POIS,
    S_HEAD,
    S_IS,
    S_LEN,
    S_MPT,
    SAIS,
    STATIC,
    TIGHT,
    TOIS,
    Arm,
    Claim,
)
from ulorl.report.claims_select import (
    arm_runs,
    by_seed,
    launch_settings,
    one_config,
    seed_key,
    sweep_groups,
)
from ulorl.report.claims_write import (
    CLAIMS_COLUMNS,
    DOCS_BEGIN,
    DOCS_COLUMNS,
    DOCS_END,
    FINAL_COST_BEGIN,
    FINAL_COST_END,
    PREREG_BEGIN,
    PREREG_END,
    READING_BEGIN,
    READING_END,
    RULES,
    SUMMARY_BEGIN,
    SUMMARY_COLUMNS,
    SUMMARY_END,
    SWEEP_FOLDERS,
    claims_json,
    claims_markdown,
    docs_table,
    final_cost_markdown,
    interval_text,
    mde_text,
    reading_markdown,
    replace_docs_table,
    summary_table,
    update_docs,
    verdict_text,
    write_claims,
)
from ulorl.report.claims_write import (
    _sweep_command as _sweep_command,
)

__all__ = ["ARMS_IDENTICAL", "Arm", "B_BOTH", "B_NONE", "B_PROBLEMS", "B_SEEDS", "CLAIMS", "CLAIMS_COLUMNS", "CONFIRM",
           "Claim", "ClaimResult", "DMMPT", "DOCS_BEGIN", "DOCS_COLUMNS", "DOCS_END", "ENTROPY", "FEW_SEEDS", "FINAL",
           "FINAL_COST_BEGIN", "FINAL_COST_END", "FINAL_WINDOW", "HELDOUT", "HOLDS", "INCONCLUSIVE", "LOOSE",
           "METRIC_TEXT", "M_ENTROPY", "M_HELDOUT", "M_HELDOUT_SAMPLES", "M_SIGMA_GAP", "NOT_HOLD", "NOT_RUN", "OFF",
           "PER_PROBLEM", "POIS", "PREREG_BEGIN", "PREREG_END", "READING_BEGIN", "READING_END", "REFUSED", "RULES",
           "SAIS", "STATIC", "SUMMARY_BEGIN", "SUMMARY_COLUMNS", "SUMMARY_END", "SWEEP_FOLDERS", "S_HEAD", "S_IS",
           "S_LEN", "S_MPT", "TIGHT", "TOIS", "Value", "arm_runs", "arms_identical", "attach_run_provenance",
           "by_seed", "claims_json", "claims_markdown", "docs_table", "drop_mirrored_rows", "eval_noise",
           "evaluate_claims", "evaluate_group", "final_cost_markdown", "final_mean", "interval_text", "judge",
           "launch_settings", "mde_text", "mirror_of", "one_config", "pooled_problem_interval", "reading_markdown",
           "replace_docs_table", "run_costs", "run_value", "seed_key", "summary_table", "sweep_groups",
           "t_cdf_two_sided", "t_interval", "t_quantile", "update_docs", "verdict", "verdict_text", "write_claims"]
