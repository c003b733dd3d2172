"""Sweep specs: a base experiment, a search space over dotted experiment keys, and how to search it.

Example (``sweeps/mpt_threshold.yaml``)::

    name: mpt_threshold
    base: ../experiments/quickstart.yaml      # relative to this file
    overrides: {train.max_steps: 20}           # applied to every trial
    space:
      algo.mpt.tau: {choice: [0.9, 0.95, 0.99]}
      algo.mpt.sigma: {uniform: [0.1, 0.6]}
    search: {algorithm: optuna, seed: 0}
    metric: eval/heldout/avg_at_k
    mode: max
    num_samples: 4
    max_concurrent: 2
    resources: {cpu: 1, gpu: 0}
    baseline:                                  # an extra trial outside the searcher
      name: masking_off
      overrides: {algo.mpt.mode: 'off'}
      seeds: 2                                 # baseline and best trial also re-run on seed offset 1
    references:                                # more reference trials outside the searcher
      - name: non_segmented
        overrides: {rollout.segments: 1, algo.mpt.mode: 'off'}
        purpose: speedup                       # the S = 1 run the summary's speedup is measured against

Every error (unknown key in the space, a value the experiment schema rejects, ASHA with several
objectives, a missing base file) is raised by ``load_sweep`` before anything starts, with the key path.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ulorl.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    check_path_component,
    config_from_dict,
    known_keys,
    read_utf8_text,
    read_yaml,
    yaml_file_problem,
)
from ulorl.eval.final import FINAL_SUFFIX
from ulorl.seeds import parse_seed_offsets
from ulorl.tracking.schema import SEED_KEYS


class SweepError(ValueError):
    """A sweep spec is invalid; the message names the file and key path."""


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DISTRIBUTIONS: tuple[str, ...] = ("choice", "grid", "uniform", "loguniform", "randint")
DISTRIBUTION_EXAMPLE = "{choice: [0.9, 0.99]}, {grid: [1, 2]}, {uniform: [0.1, 0.6]}, {loguniform: [1e-6, 1e-4]}, " \
    "{randint: [1, 8]}"


class Dim(_S):
    """One search dimension: exactly one of the fields is set."""

    choice: Optional[list[Any]] = None
    grid: Optional[list[Any]] = None
    uniform: Optional[tuple[float, float]] = None
    loguniform: Optional[tuple[float, float]] = None
    randint: Optional[tuple[int, int]] = Field(None, description="integers in [low, high] inclusive")

    @model_validator(mode="after")
    def _one(self) -> Dim:
        set_ = [k for k in ("choice", "grid", "uniform", "loguniform", "randint") if getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError("give exactly one of choice / grid / uniform / loguniform / randint, "
                             f"got {set_ or 'none'}")
        kind = set_[0]
        if kind in ("choice", "grid") and not getattr(self, kind):
            raise ValueError(f"{kind} needs at least one value")
        if kind in ("uniform", "loguniform", "randint"):
            lo, hi = getattr(self, kind)
            if not lo < hi:
                raise ValueError(f"{kind} needs low < high, got [{lo}, {hi}]")
            if kind == "loguniform" and lo <= 0:
                raise ValueError("loguniform needs low > 0")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("choice", "grid", "uniform", "loguniform", "randint") if getattr(self, k) is not None)

    def probe_values(self) -> list[Any]:
        """Values that must all validate against the experiment schema."""
        k = self.kind
        if k in ("choice", "grid"):
            return list(getattr(self, k))
        lo, hi = getattr(self, k)
        return [lo, hi]


class Variant(_S):
    name: str
    overrides: dict[str, Any] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)


class Baseline(_S):
    """The configuration every trial is compared with: the base experiment plus the sweep's fixed
    overrides plus these overrides, same seeds and data order as the trials. It is run outside the
    searcher (so it never enters the Optuna study or importance statistics); with ``seeds: 2`` the
    baseline and the best search trial are also re-run with seed offset 1 (:func:`seed_overrides`)."""

    name: str = Field("baseline", description="label of the baseline trial (run name and ranking)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="dotted experiment keys of the baseline")
    seeds: int = Field(2, ge=1, le=10, description="seed offsets 0..seeds-1 for the baseline and the best trial "
                       "(the spec's seed_offsets replaces them)")


class Reference(_S):
    """A reference trial outside the searcher for a comparison other than the ranking's. With
    ``purpose: speedup`` it is the S = 1 run that the sweep summary's (and the Speedup page's)
    speedup is measured against: same seeds, data order and batching as the trials, run on seed
    offsets 0..seeds-1, never ranked, never re-run as the best trial."""

    name: str = Field(description="label of the reference trial (run name and ranking)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="dotted experiment keys of the reference")
    purpose: Literal["speedup"] = Field("speedup", description="what the reference is compared in")
    seeds: int = Field(1, ge=1, le=5, description="seed offsets 0..seeds-1")


class SearchConfig(_S):
    algorithm: Literal["optuna", "grid"] = "optuna"
    seed: int = 0


class SchedulerConfig(_S):
    """Pruning of search trials (``ulorl.sweep.prune``): a Tune scheduler on the objective, read at the
    trial's periodic evals only, and/or the entropy-collapse rule. Baselines and re-runs are never pruned."""

    type: Literal["asha", "hyperband", "median", "none"] = Field(
        "asha", description="asha: successive halving at steps grace_period * reduction_factor^k; hyperband: "
        "asynchronous HyperBand (ASHA with `brackets` brackets); median: stop a trial whose best objective is "
        "below the median of the other trials' running means at the same step; none: the entropy rule only")
    grace_period: int = Field(5, ge=1, description="training steps before a trial can be pruned on the objective "
                              "(at least eval.every: the objective is only read at evals)")
    reduction_factor: float = Field(2.0, gt=1, description="asha / hyperband: 1 in reduction_factor goes on per rung")
    brackets: int = Field(3, ge=1, description="hyperband: number of brackets")
    min_samples: int = Field(3, ge=1, description="median: other trials needed at a step before stopping there")
    entropy_below: Optional[float] = Field(None, gt=0, description="entropy collapse: prune a trial whose "
                                           "train/entropy (nats/token) stays below this ...")
    entropy_steps: int = Field(3, ge=1, description="... for this many consecutive training steps")

    @model_validator(mode="after")
    def _rule_given(self) -> SchedulerConfig:
        if self.type == "none" and self.entropy_below is None:
            raise ValueError("scheduler.type none prunes nothing without scheduler.entropy_below")
        return self


class TrialResources(_S):
    cpu: float = Field(1.0, gt=0)
    gpu: float = Field(0.0, ge=0)


class StopConfig(_S):
    steps: Optional[int] = Field(None, ge=1, description="sets train.max_steps of every trial")
    wall_s: Optional[float] = Field(None, gt=0, description="sets train.max_wall_s of every trial")


class SweepSpec(_S):
    name: str
    base: str

    @field_validator("name")
    @classmethod
    def _one_folder(cls, v: str) -> str:
        check_path_component(v, "the sweep's folder <output-dir>/sweeps/<name>")
        return v
    overrides: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, Dim] = Field(default_factory=dict)
    variants: list[Variant] = Field(default_factory=list)
    repeats: int = Field(1, ge=1, description="seeds per configuration: repeat r adds r to data.seed (prompt order), "
                         "rollout.seed and train.seed; data.task.seed (which problems exist) never changes")
    seed_offsets: Optional[list[int]] = Field(
        None, description="the seed offsets to run, e.g. '3-7', '0,2' or [3, 4]: replaces 0..repeats-1 (grid) and "
        "0..baseline.seeds-1 (baseline; the best trial is re-run on the offsets other than 0), so seeds can be added "
        "in chunks (ulorl-sweep --seeds 3-7); results of the chunks pair by their seeds")
    tags: dict[str, str] = Field(default_factory=dict)
    search: SearchConfig = SearchConfig()
    metric: Union[str, list[str]] = "eval/heldout/avg_at_k"
    mode: Union[Literal["max", "min"], list[Literal["max", "min"]]] = "max"
    num_samples: int = Field(4, ge=1, description="optuna: trials; grid: repeats of the whole grid")
    max_concurrent: int = Field(1, ge=1)
    resources: TrialResources = TrialResources()
    scheduler: Optional[SchedulerConfig] = None
    stop: StopConfig = StopConfig()
    max_failures: int = Field(2, ge=0, description="retries of a failing trial, from its checkpoint")
    experiment: Optional[str] = Field(None, description="MLflow experiment (default: the base's tracking.experiment)")
    baseline: Optional[Baseline] = Field(None, description="extra trial(s) every search trial is compared with")
    references: list[Reference] = Field(default_factory=list, description="more reference trials outside the "
                                        "searcher (e.g. the S = 1 run of the speedup)")
    epilogue: list[str] = Field(default_factory=list, description="lines printed after the verdict (what it covers, "
                                "the command to run next)")

    @field_validator("seed_offsets", mode="before")
    @classmethod
    def _offsets(cls, v: Any) -> Any:
        return None if v is None else parse_seed_offsets(v)

    @model_validator(mode="after")
    def _checks(self) -> SweepSpec:
        if self.seed_offsets is not None and "repeats" in self.model_fields_set \
                and self.repeats != len(self.seed_offsets):
            raise ValueError(f"repeats ({self.repeats}) and seed_offsets ({len(self.seed_offsets)} offsets) disagree; "
                             "give seed_offsets alone")
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        modes = self.mode if isinstance(self.mode, list) else [self.mode]
        if len(metrics) != len(modes):
            raise ValueError(f"metric has {len(metrics)} entries but mode has {len(modes)}")
        if self.scheduler is not None and self.scheduler.type != "none" and len(metrics) > 1:
            raise ValueError(f"scheduler.type {self.scheduler.type} works with a single objective only; use one "
                             "metric or scheduler.type none (the entropy rule alone)")
        if len(metrics) > 1 and self.search.algorithm != "optuna":
            raise ValueError("several objectives need search.algorithm: optuna (multi-objective TPE)")
        if self.search.algorithm == "optuna":
            grid = [k for k, d in self.space.items() if d.kind == "grid"]
            if grid:
                raise ValueError(f"space.{grid[0]}: 'grid' needs search.algorithm: grid (use 'choice' with optuna)")
            if self.variants:
                raise ValueError("variants need search.algorithm: grid (each variant is run as listed)")
        names = [r.name for r in self.references] + ([self.baseline.name] if self.baseline is not None else [])
        if len(set(names)) < len(names):
            raise ValueError(f"baseline and references need distinct names, got {names}")
        if sum(r.purpose == "speedup" for r in self.references) > 1:
            raise ValueError("at most one reference with purpose: speedup")
        return self

    @property
    def speed_reference(self) -> Optional[Reference]:
        """The S = 1 reference of the speedup, if the spec names one."""
        return next((r for r in self.references if r.purpose == "speedup"), None)

    def reference_offsets(self, ref: Reference) -> list[int]:
        """Seed offsets of a reference trial: 0..ref.seeds-1, those among ``seed_offsets`` when given
        (a chunk of later seeds, ``--seeds 3-7``, runs no reference again)."""
        own = list(range(ref.seeds))
        return own if self.seed_offsets is None else [o for o in own if o in self.seed_offsets]

    @property
    def offsets(self) -> list[int]:
        """Seed offsets of the grid's repeats: ``seed_offsets``, else 0..repeats-1."""
        return list(self.seed_offsets) if self.seed_offsets is not None else list(range(self.repeats))

    @property
    def baseline_offsets(self) -> list[int]:
        """Seed offsets of the baseline trial (the best trial is re-run on those other than 0):
        ``seed_offsets``, else 0..baseline.seeds-1; [] without a baseline."""
        if self.baseline is None:
            return []
        return list(self.seed_offsets) if self.seed_offsets is not None else list(range(self.baseline.seeds))

    @property
    def metrics(self) -> list[str]:
        return self.metric if isinstance(self.metric, list) else [self.metric]

    @property
    def modes(self) -> list[str]:
        return list(self.mode) if isinstance(self.mode, list) else [self.mode]


def with_seed_offsets(spec: SweepSpec, offsets: Any) -> SweepSpec:
    """``spec`` running the seed ``offsets`` (see :func:`parse_seed_offsets`) instead of its own; the
    ``ulorl-sweep --seeds`` override."""
    try:
        parsed = parse_seed_offsets(offsets)
    except ValueError as exc:
        raise SweepError(f"--seeds: {exc}") from None
    return spec.model_copy(update={"seed_offsets": parsed})


def check_resume_offsets(saved: Optional[list[int]], spec: SweepSpec) -> None:
    """``--resume`` must run the seed offsets the interrupted launch ran (its trial grid depends on them)."""
    if saved is not None and list(saved) != list(spec.seed_offsets or []):
        raise SweepError(f"--resume: this sweep was started with --seeds {','.join(map(str, saved))}; resume it with "
                         "the same --seeds")
    if saved is None and spec.seed_offsets is not None:
        raise SweepError("--resume: this sweep was started without --seeds (or by an older ulorl); resume it without")


def check_resume_spec(state: dict[str, Any], spec: SweepSpec, base: dict[str, Any], source: Path | str,
                      sweep_dir: Path | str) -> None:
    """``--resume`` must run the spec (and base experiment) the sweep started with: new trials would run
    the changed settings beside finished ones run with the old (Tune restores its own search space, so a
    changed one would also be ignored). Raises ``SweepError`` naming every changed key; a state written
    before the spec was recorded is not checked. The seed offsets are :func:`check_resume_offsets`'."""
    from ulorl.config import flatten_config

    changes: list[str] = []
    pairs = (("", state.get("spec"), spec.model_dump(mode="json")), ("base ", state.get("base"), base))
    for prefix, then, now in pairs:
        if then is None:
            continue
        old, new = flatten_config(then), flatten_config(now)
        for key in sorted(set(old) | set(new)):
            if key == "seed_offsets" and not prefix:
                continue
            if old.get(key) != new.get(key):
                changes.append(f"  {prefix}{key}: {old.get(key)!r} when the sweep started, {new.get(key)!r} now")
    if changes:
        raise SweepError(f"--resume: {source} changed since the sweep in {sweep_dir} started:\n" + "\n".join(changes)
                         + "\nresume it with the spec as it was, or start a new sweep (run it without --resume: "
                         "a new folder and parent run)")


def _errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid sweep spec in {source}:"]
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        path = ".".join(loc) or "<root>"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        valid = f"; use one of {', '.join(DISTRIBUTIONS)}, e.g. {DISTRIBUTION_EXAMPLE}"
        if loc[:1] == ["space"] and len(loc) == 3 and e["type"] == "extra_forbidden":
            path, msg = f"space.{loc[1]}", f"unknown distribution {loc[2]!r}{valid}"
        elif loc[:1] == ["space"] and len(loc) == 2 and e["type"] == "model_type":
            msg = f"expected a distribution, got {e.get('input')!r}{valid}"
        lines.append(f"  {path}: {msg}")
    return "\n".join(dict.fromkeys(lines))   # two unknown distributions of one key: said once


def _check_key(key: str, where: str, source: str) -> None:
    keys = known_keys()
    if key in keys or any(key.startswith(k + ".") for k in ("tracking.tags", "model.rope_scaling")):
        return
    import difflib

    near = difflib.get_close_matches(key, sorted(keys), n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise SweepError(f"{source}: {where}: unknown experiment key {key!r}{hint}")


def _validate_with(base: dict[str, Any], overrides: dict[str, Any], where: str, source: str) -> ExperimentConfig:
    try:
        return config_from_dict(apply_overrides(base, overrides), source=f"{source} ({where})")
    except ConfigError as exc:
        raise SweepError(str(exc)) from None


def load_sweep(path: str | Path) -> tuple[SweepSpec, Path, dict[str, Any]]:
    """Parse and fully validate a sweep. Returns (spec, absolute base path, base experiment dict)."""
    p = Path(path)
    problem = yaml_file_problem(p, "sweep")
    if problem:
        raise SweepError(problem)
    try:
        raw = yaml.safe_load(read_utf8_text(p)) or {}
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise SweepError(f"{p}: not valid YAML: {exc}") from None
    if isinstance(raw, dict):
        raw.setdefault("name", p.stem)
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as err:
        raise SweepError(_errors(err, str(p))) from None
    base_path = (p.parent / spec.base).resolve()
    if not base_path.is_file():
        raise SweepError(f"{p}: base: experiment file not found: {base_path}")
    try:
        base = read_yaml(base_path)
    except ConfigError as exc:
        raise SweepError(f"{p}: base: {exc}") from None
    base.setdefault("name", base_path.stem)
    if not spec.space and (spec.search.algorithm == "optuna" or (not spec.variants and spec.repeats == 1)):
        # optuna ignores repeats; a grid varies through space, variants or repeats
        raise SweepError(f"{p}: space is empty, so every trial would run the same configuration; add a key to "
                         "space (e.g. algo.mpt.tau: {choice: [0.9, 0.99]}), or with search: {algorithm: grid} "
                         "list variants or set repeats > 1")
    fixed = dict(spec.overrides)
    if spec.stop.steps:
        fixed["train.max_steps"] = spec.stop.steps
    if spec.stop.wall_s:
        fixed["train.max_wall_s"] = spec.stop.wall_s
    for key in fixed:
        _check_key(key, f"overrides.{key}", str(p))
    fixed_cfg = _validate_with(base, fixed, "overrides", str(p))
    for key, dim in spec.space.items():
        _check_key(key, f"space.{key}", str(p))
        for value in dim.probe_values():
            _validate_with(base, {**fixed, key: value}, f"space.{key}={value!r}", str(p))
    for i, var in enumerate(spec.variants):
        for key in var.overrides:
            _check_key(key, f"variants[{i}].overrides.{key}", str(p))
        _validate_with(base, {**fixed, **var.overrides}, f"variants[{i}] ({var.name})", str(p))
    if spec.baseline is not None:
        for key in spec.baseline.overrides:
            _check_key(key, f"baseline.overrides.{key}", str(p))
        _validate_with(base, {**fixed, **spec.baseline.overrides}, "baseline", str(p))
    for i, ref in enumerate(spec.references):
        for key in ref.overrides:
            _check_key(key, f"references[{i}].overrides.{key}", str(p))
        ref_cfg = _validate_with(base, {**fixed, **ref.overrides}, f"references[{i}] ({ref.name})", str(p))
        if ref.purpose == "speedup":
            _check_speed_reference(ref, i, ref_cfg, fixed_cfg, spec, str(p))
    _check_judged_metrics(spec, str(p))
    split = [m for m in spec.metrics if m.startswith("eval/") and m.split("/")[1].endswith(("_select", "_confirm"))]
    if split and not fixed_cfg.eval.select_problems and "eval.select_problems" not in spec.space:
        raise SweepError(f"{p}: metric {split[0]} needs the held-out split: set eval.select_problems (e.g. half of "
                         "eval.num_problems) in overrides")
    if spec.metrics == ["eval/heldout/avg_at_k"] and fixed_cfg.eval.every == 0 and "eval.every" not in spec.space:
        raise SweepError(f"{p}: metric eval/heldout/avg_at_k needs periodic evaluation (eval.every > 0 in the base)")
    return spec, base_path, base


def judged_part(metric: str) -> Optional[str]:
    """The held-out part a sweep's verdict is judged on that ``metric`` reads, None for any other:
    ``eval/heldout_confirm/avg_at_k -> "confirmation"``, ``eval/heldout_final/avg_at_k -> "final"``."""
    parts = metric.split("/")
    if len(parts) < 3 or parts[0] != "eval":
        return None
    bench = parts[1]
    if bench.endswith("_confirm"):
        return "confirmation"
    if bench.endswith(FINAL_SUFFIX):
        return "final"
    return None


def _check_judged_metrics(spec: SweepSpec, source: str) -> None:
    """A search must not select on the problems it is judged on: the confirmation part and the final
    evaluation are the verdict's (``ulorl.sweep.ranking.verdict``); an objective read from them makes
    the verdict judge the trial on the problems that picked it."""
    for i, m in enumerate(spec.metrics):
        part = judged_part(m)
        if part is None:
            continue
        key = "metric" if isinstance(spec.metric, str) else f"metric[{i}]"
        raise SweepError(f"{source}: {key}: {m} reads the {part} problems, the ones the sweep's verdict is judged "
                         "on; a search must not select on them. Select on eval/heldout_select/avg_at_k (with "
                         "eval.select_problems) or eval/heldout/avg_at_k, and set eval.final to judge on problems "
                         "no search saw")


def _check_speed_reference(ref: Reference, i: int, ref_cfg: ExperimentConfig, trials_cfg: ExperimentConfig,
                           spec: SweepSpec, source: str) -> None:
    """A speedup reference is the trials' configuration at S = 1: same batching and seeds."""
    where = f"{source}: references[{i}] ({ref.name}, purpose: speedup)"
    if ref_cfg.rollout.segments != 1:
        raise SweepError(f"{where}: needs rollout.segments: 1 (got {ref_cfg.rollout.segments}); "
                         "add it to the reference's overrides")
    if trials_cfg.rollout.segments == 1 and "rollout.segments" not in spec.space:
        raise SweepError(f"{where}: the trials run at rollout.segments 1 too; nothing to compare")
    if ref_cfg.rollout.batching != trials_cfg.rollout.batching and "rollout.batching" not in spec.space:
        raise SweepError(f"{where}: rollout.batching {ref_cfg.rollout.batching!r} differs from the trials' "
                         f"{trials_cfg.rollout.batching!r}; a speedup compares one batching regime")
    seeds = [k for k in ref.overrides if k in SEED_KEYS]
    if seeds:
        raise SweepError(f"{where}: overrides {seeds[0]}; the reference keeps the trials' seeds and data order")


def short_key(key: str, keys: list[str]) -> str:
    """Last dotted part of ``key`` (``algo.mpt.tau -> tau``), or the whole key when another of
    ``keys`` ends the same way."""
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key


def short_value(value: Any) -> str:
    """``0.0931234 -> 0.0931``, ``0.9 -> 0.9``, ``'off' -> off``."""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def values_summary(values: dict[str, Any]) -> str:
    """``{"algo.mpt.tau": 0.9, "algo.mpt.sigma": 0.0931234} -> "tau=0.9 sigma=0.0931"``."""
    keys = list(values)
    return " ".join(f"{short_key(k, keys)}={short_value(v)}" for k, v in values.items())


def trial_run_name(sweep: str, trial_id: str, values: dict[str, Any], role: str = "", seed_offset: int = 0) -> str:
    """Unique readable MLflow run name of a trial: ``<sweep>-<trial id>`` plus a short summary of
    its varied values, e.g. ``mpt_threshold-8ffbe956 tau=0.9 sigma=0.093``; baseline and re-run
    trials say so (``... baseline seed+1``)."""
    summary = values_summary(values)
    extra = " ".join(x for x in (role, f"seed+{seed_offset}" if seed_offset else "") if x)
    return " ".join(x for x in (f"{sweep}-{trial_id}", extra, summary) if x)


# Seeds a repeat (seed offset r) shifts by r: the prompt order, the sampling draws, the start-up RNGs.
# data.task.seed is not among them: it decides which problems exist (the held-out split too), and
# arms compared on the same held-out problems must keep it.


def seed_overrides(experiment: dict[str, Any], offset: int) -> dict[str, int]:
    """Seeds of repeat ``offset``: every key of :data:`SEED_KEYS` = its value in ``experiment``
    (a nested experiment dict, overrides applied; 0 when absent) + ``offset``.
    ``seed_overrides({"train": {"seed": 5}}, 2) == {"data.seed": 2, "rollout.seed": 2, "train.seed": 7}``."""
    out = {}
    for key in SEED_KEYS:
        section, name = key.split(".")
        out[key] = int((experiment.get(section) or {}).get(name, 0) or 0) + int(offset)
    return out


def grid_trials(spec: SweepSpec) -> list[dict[str, Any]]:
    """All trial override sets of a grid sweep: variants x grid/choice product x repeats, seed-major
    (every configuration of repeat 0 first, then repeat 1, ...) so that a sweep cut short leaves
    whole seeds of every arm, each pairable."""
    keys = list(spec.space)
    values = [spec.space[k].probe_values() if spec.space[k].kind in ("grid", "choice") else None for k in keys]
    if any(v is None for v in values):
        bad = keys[values.index(None)]
        raise SweepError(f"space.{bad}: continuous ranges need search.algorithm: optuna")
    grid = [v for v in values if v is not None]   # all of them (checked above)
    variants = spec.variants or [Variant(name="")]
    out = []
    for rep in spec.offsets:
        for var in variants:
            for combo in itertools.product(*grid) if keys else [()]:
                out.append({"variant": var.name, "overrides": {**var.overrides, **dict(zip(keys, combo))},
                            "tags": dict(var.tags), "repeat": rep})
    return out
