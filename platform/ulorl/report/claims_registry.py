"""The paper's claims as data: the metrics a claim can compare, the arms, and the registry
(:data:`CLAIMS`, the paper's direction of every claim written once). Part of
:mod:`ulorl.report.claims`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ulorl.eval.final import final_bench
from ulorl.eval.paired import (
    LEVEL_DIRECTIONAL,
    LEVEL_EQUIVALENCE,
)
from ulorl.tracking import schema
from ulorl.tracking.schema import ROLE_BASELINE, ROLE_RERUN

HELDOUT = schema.eval_metric("heldout", "avg_at_k")
ENTROPY = "train/entropy"
FINAL_WINDOW = 10        # "final entropy": mean train/entropy over a run's last 10 logged steps
CONFIRM = "heldout_confirm"   # the held-out problems a search did not select on (eval.select_problems)
FINAL = final_bench("heldout")  # eval.final: after the last step, on held-out problems no periodic eval scores

# Metrics a claim can compare (see :func:`run_value`).
M_HELDOUT = "heldout_last"             # last eval/<bench>/avg_at_k (the final evaluation when every run has it)
M_HELDOUT_SAMPLES = "heldout_at_samples"  # last periodic eval within the group's equal trained-samples budget
M_ENTROPY = "entropy_final"            # mean train/entropy over the last FINAL_WINDOW steps
M_SIGMA_GAP = "entropy_gap_to_sigma"   # |entropy_final - algo.mpt.sigma of arm a's run of that seed|
METRIC_TEXT = {
    M_HELDOUT: "held-out avg@k, last eval",
    M_HELDOUT_SAMPLES: "held-out avg@k at equal trained samples",
    M_ENTROPY: f"train/entropy, mean of the last {FINAL_WINDOW} steps",
    M_SIGMA_GAP: f"|train/entropy (last {FINAL_WINDOW} steps) - sigma|",
}
PER_PROBLEM = (M_HELDOUT, M_HELDOUT_SAMPLES)

NOT_RUN = "not run"
# What a verdict rests on (ClaimResult.basis).
B_BOTH, B_PROBLEMS, B_SEEDS, B_NONE = "seeds + problems", "problems only", "seeds only", "—"


# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Arm:
    """Runs of one side of a claim within a sweep.

    ``params``: (param, value) pairs the run's params must equal; value ``max`` / ``min`` = the
    largest / smallest numeric value of that param among the sweep's runs. ``role``: the
    ``ulorl.trial_role`` tag (``baseline``; ``rerun``: the best search trial re-run on seed
    offsets > 0, without the selected search trial itself)."""

    label: str
    params: tuple[tuple[str, str], ...] = ()
    role: str = ""


@dataclass(frozen=True)
class Claim:
    name: str
    paper_refs: tuple[str, ...]     # ulorl.paper_ref tags of the runs it reads
    metric: str                      # one of METRIC_TEXT
    a: Arm
    b: Arm
    direction: int                   # +1: the paper says a > b; -1: a < b; 0: a ~ b (within margin)
    paper_says: str
    sweep: str                       # the command that produces its runs
    margin: Optional[float] = None   # direction 0 only: |a - b| below this counts as equal
    floor: Optional[float] = None    # directional only: the practical-size floor, the smallest effect that matters
    with_baseline: bool = False      # True: sweeps with a baseline trial (headline); False: sweeps without
    bench: str = "heldout"           # held-out metrics: eval/<bench>/avg_at_k and its per-problem CSVs
    paper_effect: Optional[float] = None  # the paper's own a - b where it reports one (accuracy as a fraction)

    @property
    def level(self) -> float:
        """Interval level of its verdict: 90 % for a no-difference claim (TOST at alpha 0.05), else 95 %."""
        return LEVEL_EQUIVALENCE if self.direction == 0 else LEVEL_DIRECTIONAL


OFF = Arm("masking off", (("algo.mpt.mode", "off"),))
STATIC = Arm("static masking", (("algo.mpt.mode", "static"),))
DMMPT = Arm("DMMPTs", (("algo.mpt.mode", "dynamic"),))
TOIS = Arm("TOIS (S=1)", (("algo.is_mode", "tois"),))
SAIS = Arm("SAIS", (("algo.is_mode", "sais"),))
POIS = Arm("POIS", (("algo.is_mode", "pois"),))
LOOSE = Arm("loose (longest max_response_len)", (("rollout.max_response_len", "max"),))
TIGHT = Arm("tight (shortest max_response_len)", (("rollout.max_response_len", "min"),))
S_MPT = "ulorl-sweep sweeps/choice/mpt_mode.yaml"
S_LEN = "ulorl-sweep sweeps/choice/output_length.yaml"
S_IS = "ulorl-sweep sweeps/choice/is_mode.yaml"
S_HEAD = "ulorl-sweep sweeps/choice/mpt_threshold.yaml"

CLAIMS: tuple[Claim, ...] = (
    Claim("fig4_entropy", ("fig4",), M_ENTROPY, STATIC, OFF, +1,
          "Fig. 4: baseline entropy falls, static-masked entropy rises (without bound)", S_MPT),
    Claim("fig4_heldout", ("fig4",), M_HELDOUT, STATIC, OFF, +1,
          "not reported for static masking; implied: masking MPTs counters the over-training the paper "
          "blames for entropy collapse", S_MPT),
    Claim("fig5_entropy", ("fig4", "fig5"), M_ENTROPY, DMMPT, OFF, +1,
          "Fig. 5 vs Fig. 4: entropy under DMMPTs stays near sigma while the baseline's falls", S_MPT),
    Claim("fig5_sigma_gap", ("fig4", "fig5"), M_SIGMA_GAP, DMMPT, OFF, -1,
          "Fig. 5: entropy under DMMPTs stays near the target sigma", S_MPT),
    Claim("fig5_heldout", ("fig4", "fig5"), M_HELDOUT, DMMPT, OFF, +1,
          "Table 2: UloRL-A3B-128k 71.5 vs w/o DMMPTs 67.9 (AVG avg@32)", S_MPT, paper_effect=(71.5 - 67.9) / 100),
    Claim("table3_heldout", ("table3",), M_HELDOUT_SAMPLES, LOOSE, TIGHT, +1,
          "Table 3: longer training outputs score higher (AVG 62.9 at 32k, 69.2 at 64k, 71.5 at 128k)", S_LEN),
    Claim("fig2_pois_vs_tois", ("fig2",), M_HELDOUT, POIS, TOIS, 0,
          "Fig. 2: POIS accuracy nearly overlaps TOIS (equal within our margin 0.05)", S_IS, margin=0.05),
    Claim("fig2_pois_vs_sais", ("fig2",), M_HELDOUT, POIS, SAIS, +1,
          "Fig. 2: POIS beats SAIS at all output lengths", S_IS),
    Claim("fig2_sais_vs_tois", ("fig2",), M_HELDOUT, SAIS, TOIS, -1,
          "implied by Fig. 2: SAIS below POIS, which overlaps TOIS", S_IS),
    Claim("headline", ("fig5",), M_HELDOUT, Arm("best tau x sigma, re-run seeds", role=ROLE_RERUN),
          Arm("baseline (masking off)", role=ROLE_BASELINE), +1,
          "Table 2: DMMPTs 71.5 vs w/o DMMPTs 67.9 (AVG avg@32)", S_HEAD, with_baseline=True, bench=CONFIRM,
          paper_effect=(71.5 - 67.9) / 100),
    # DMMPTs beside the other entropy controls (runs tagged entropy_controls, sweeps/choice/entropy_controls.yaml):
    # each comparator vs off on final entropy and held-out, DMMPTs vs each comparator on held-out. Arms
    # pin both keys: the comparator arms run with algo.mpt.mode off.
    *(Claim(f"ec_{key}_{'entropy' if metric == M_ENTROPY else 'heldout'}", ("entropy_controls",), metric,
            Arm(label, (("algo.mpt.mode", "off"), ("algo.entropy_control.mode", key))),
            Arm("off", (("algo.mpt.mode", "off"), ("algo.entropy_control.mode", "off"))), +1, says,
            "ulorl-sweep sweeps/choice/entropy_controls.yaml")
      for key, label, says_entropy, says_heldout in (
          ("clip_cov", "Clip-Cov", "Cui et al. 2025: Clip-Cov keeps entropy well above the GRPO baseline's",
           "Cui et al. 2025: Clip-Cov +1.8 (Qwen2.5-7B) / +4.5 (32B) avg over 7 math benchmarks vs GRPO"),
          ("kl_cov", "KL-Cov", "Cui et al. 2025: KL-Cov keeps entropy >10x the GRPO baseline's plateau",
           "Cui et al. 2025: KL-Cov +2.0 (Qwen2.5-7B) / +6.4 (32B) avg over 7 math benchmarks vs GRPO"),
          ("high_entropy_minority", "80/20 (top-20 % entropy tokens)",
           "not reported as a figure by Wang et al. 2025; expected: dropping the low-entropy tokens' updates "
           "slows the entropy fall",
           "Wang et al. 2025: the top-20 % entropy tokens match full updates on Qwen3-8B and beat them on "
           "Qwen3-32B (+11.04 AIME'25)"))
      for metric, says in ((M_ENTROPY, says_entropy), (M_HELDOUT, says_heldout))),
    *(Claim(f"ec_dmmpt_vs_{key}_heldout", ("entropy_controls",), M_HELDOUT,
            Arm("DMMPTs", (("algo.mpt.mode", "dynamic"), ("algo.entropy_control.mode", "off"))),
            Arm(label, (("algo.mpt.mode", "off"), ("algo.entropy_control.mode", key))), +1,
            f"compared by no paper; 'holds' = DMMPTs score higher than {label}",
            "ulorl-sweep sweeps/choice/entropy_controls.yaml")
      for key, label in (("clip_cov", "Clip-Cov"), ("kl_cov", "KL-Cov"),
                         ("high_entropy_minority", "80/20 (top-20 % entropy tokens)"))),
)
