"""The two Ray Tune tuners of a sweep: the searcher's (grid or Optuna, optionally pruned) and the one of
the trials outside the searcher (baseline, re-runs of the best, references; never pruned).

Both write under ``<sweep dir>/tune``: the search experiment is named after the sweep, the other after the
sweep with :data:`EXTRA_SUFFIX`, so ``--resume`` restores each on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ulorl.sweep import prune
from ulorl.sweep.spec import SweepError, SweepSpec, grid_trials

EXTRA_SUFFIX = "-baseline"   # the extra trials' Tune experiment: "<sweep name>-baseline"


def tune_storage(sweep_dir: Path) -> str:
    """Where Tune keeps both experiments of the sweep in ``sweep_dir``."""
    return str(sweep_dir / "tune")


def extra_tuner_name(spec: SweepSpec) -> str:
    return f"{spec.name}{EXTRA_SUFFIX}"


def search_space(spec: SweepSpec) -> dict[str, Any]:
    """The Tune search space of ``spec.space`` (Optuna search)."""
    from ray import tune

    out: dict[str, Any] = {}
    for key, dim in spec.space.items():   # exactly one range is set (Dimension's validator)
        if dim.choice is not None:
            out[key] = tune.choice(dim.choice)
        elif dim.grid is not None:
            out[key] = tune.grid_search(dim.grid)
        elif dim.uniform is not None:
            out[key] = tune.uniform(*dim.uniform)
        elif dim.loguniform is not None:
            out[key] = tune.loguniform(*dim.loguniform)
        elif dim.randint is not None:
            out[key] = tune.randint(dim.randint[0], dim.randint[1] + 1)
        else:
            raise SweepError(f"space.{key}: no range given")
    return out


def _run_config(spec: SweepSpec, name: str, storage: str, callbacks: list[Any]) -> Any:
    from ray import tune

    return tune.RunConfig(
        name=name, storage_path=storage, verbose=1, callbacks=callbacks,
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
    )


def search_tuner(trainable: Any, spec: SweepSpec, sweep_dir: Path, callbacks: list[Any], steps_per_trial: int) -> Any:
    """The searcher's tuner: a grid over the grid trials (each ``__trial__`` indexes
    :func:`ulorl.sweep.spec.grid_trials`), or Optuna (TPE for one metric, NSGA-II for several) with its
    study in ``<sweep dir>/optuna.db``; the spec's scheduler prunes these trials only."""
    from ray import tune

    single = len(spec.metrics) == 1
    tune_kwargs: dict[str, Any] = {"max_concurrent_trials": spec.max_concurrent}
    if spec.search.algorithm == "grid":
        param_space = {"__trial__": tune.grid_search(list(range(len(grid_trials(spec)))))}
        tune_kwargs["num_samples"] = spec.num_samples
    else:
        import optuna
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        storage_url = f"sqlite:///{sweep_dir / 'optuna.db'}"
        sampler = (optuna.samplers.TPESampler(seed=spec.search.seed) if single
                   else optuna.samplers.NSGAIISampler(seed=spec.search.seed))
        searcher = OptunaSearch(
            metric=spec.metrics if not single else spec.metrics[0],
            mode=spec.modes if not single else spec.modes[0],
            sampler=sampler, study_name=spec.name,
            storage=optuna.storages.RDBStorage(storage_url),
        )
        tune_kwargs["search_alg"] = ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent)
        tune_kwargs["num_samples"] = spec.num_samples
        tune_kwargs.pop("max_concurrent_trials")  # the limiter does it
        param_space = search_space(spec)
    if single:
        tune_kwargs["metric"] = spec.metrics[0]
        tune_kwargs["mode"] = spec.modes[0]
    if spec.scheduler is not None:   # the search trials only: baselines and re-runs have their own tuner
        tune_kwargs["scheduler"] = prune.build_scheduler(spec.scheduler, sweep_dir, steps_per_trial)
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(**tune_kwargs),
        run_config=_run_config(spec, spec.name, tune_storage(sweep_dir), callbacks),
    )


def extra_tuner_kwargs(spec: SweepSpec, entries: list[dict[str, Any]], sweep_dir: Path,
                       callbacks: list[Any]) -> dict[str, Any]:
    """``tune.Tuner`` arguments (all but the trainable) for the trials outside the searcher, ``entries``
    (:func:`ulorl.sweep.plan.extra_entries`). Each trial's settings travel in its config (``__extra__``),
    so the searcher's trainable runs them; no scheduler: these trials are never pruned."""
    from ray import tune

    tune_config = tune.TuneConfig(max_concurrent_trials=spec.max_concurrent)
    assert tune_config.scheduler is None, "baselines, re-runs and references are never pruned"
    return {
        "param_space": {"__extra__": tune.grid_search(entries)},
        "tune_config": tune_config,
        "run_config": _run_config(spec, extra_tuner_name(spec), tune_storage(sweep_dir), callbacks),
    }
