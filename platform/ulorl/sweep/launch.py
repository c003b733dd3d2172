"""Run a sweep: Ray Tune trials of the full trainer, Optuna search, MLflow parent + child runs.

* The driver makes every path absolute (Tune trials run in a temporary working directory).
* The sweep is an MLflow parent run; each trial is a child run (``mlflow.parentRunId``) tagged
  with its trial id. With more than one concurrent trial on a ``sqlite:`` store, the driver serves
  the file through a local ``mlflow server`` on 127.0.0.1 for the trials (SQLite locks under
  concurrent writers) and stops it at the end.
* A failing trial is retried (``FailureConfig``) and resumes from its own checkpoint into the same
  MLflow run; ``--resume`` restores the Tune experiment after the driver was killed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional

from ulorl.config import ExperimentConfig, apply_overrides, config_from_dict
from ulorl.scale.placement import PlacementError
from ulorl.sweep import ranking
from ulorl.sweep.placed import check_trials_fit, describe_resources, needs_placement, run_placed_trial, trial_resources
from ulorl.sweep.server import MlflowServer
from ulorl.sweep.spec import (
    SweepError,
    SweepSpec,
    check_resume_offsets,
    grid_trials,
    load_sweep,
    seed_overrides,
    trial_run_name,
    with_seed_offsets,
)
from ulorl.tracking import resolve_tracking_uri, schema
from ulorl.tracking.credentials import install_credentials
from ulorl.tracking.run import RunTracker
from ulorl.train.checkpoint import LATEST, checkpoint_root, latest_checkpoint
from ulorl.train.trainer import Trainer

STATE_FILE = "sweep_state.json"
FAIL_ENV = "ULORL_INJECT_FAILURE"   # "STEP:MARKER_PATH": fail once at STEP (tests of fault tolerance)


# --------------------------------------------------------------------------- trial side
def trial_fn(config: dict[str, Any], meta: dict[str, Any], credentials: Optional[dict[str, str]] = None) -> None:
    """Ray Tune function trainable: one full ``ulorl-train`` run with the trial's overrides.

    ``config`` holds the searched keys (optuna) or ``__trial__`` (index into ``meta["grid"]``);
    ``meta`` (bound with ``tune.with_parameters``) holds the sweep-wide settings, ``credentials`` the
    tracking server's (``ulorl.tracking.credentials``: through the object store, never a logged env).
    """
    import ray.tune as tune

    install_credentials(credentials or {})
    ctx = tune.get_context()
    trial_id = ctx.get_trial_id()
    meta = dict(meta)
    if "__trial__" in config:
        meta.update(meta["grid"][int(config["__trial__"])])
        meta["tags"] = {**meta["tags"], **meta.get("trial_tags", {})}
    if "__extra__" in config:  # baseline / re-run trial outside the searcher
        meta.update(config["__extra__"])
        config = {}
    overrides = dict(meta["fixed"])
    overrides.update(meta.get("trial_overrides") or {})
    varied = {**(meta.get("trial_overrides") or {}), **{k: v for k, v in config.items() if k != "__trial__"}}
    overrides.update(varied)
    rep = int(meta.get("repeat", 0))
    role = meta.get("role", ranking.ROLE_SEARCH)
    overrides["tracking.run_name"] = trial_run_name(
        meta["sweep_name"], trial_id, varied, "" if role == ranking.ROLE_SEARCH else role, rep)
    base = meta["base_dict"]
    overrides.update(seed_overrides(apply_overrides(base, overrides), rep))
    placed = needs_placement(config_from_dict(apply_overrides(base, overrides), source=meta["base_path"]))
    if not placed:  # a placed trial's actors take one thread per CPU of their own bundle
        overrides["train.threads"] = max(1, int(meta["cpu"]))
    cfg = config_from_dict(apply_overrides(base, overrides), source=meta["base_path"])

    run_dir = Path(meta["sweep_dir"]) / "trials" / trial_id
    _restore_tune_checkpoint(tune.get_checkpoint(), run_dir)
    resume = str(run_dir) if latest_checkpoint(run_dir) is not None else None
    fail_at = None
    inj = os.environ.get(FAIL_ENV)
    if inj:
        step_s, marker = inj.split(":", 1)
        if not Path(marker).exists():
            Path(marker).write_text(trial_id)
            fail_at = int(step_s)

    tags = {schema.TRIAL_TAG: trial_id, schema.SWEEP_TAG: meta["sweep_name"], schema.ROLE_TAG: role,
            schema.SEED_TAG: str(rep), **meta["tags"]}
    if meta.get("variant"):
        tags[schema.VARIANT_TAG] = meta["variant"]
    metrics_names = meta["metrics"]

    def report(step: int, metrics: dict[str, float], ckpt: Optional[Path]) -> None:
        out = {k: float(v) for k, v in metrics.items()}
        out["step"] = step
        for name in metrics_names:  # Tune must always see the objective: last known value
            out.setdefault(name, last_obj.get(name, float("nan")))
            last_obj[name] = out[name]
        if ckpt is not None:
            tune.report(out, checkpoint=tune.Checkpoint.from_directory(str(ckpt)))
        else:
            tune.report(out)

    last_obj: dict[str, float] = {}
    if placed:
        run_placed_trial(cfg, run_dir=run_dir, resume=resume, tracking_uri=meta["trial_tracking_uri"], report=report,
                         parent_run_id=meta["parent_run_id"], extra_tags=tags, fail_at_step=fail_at,
                         eval_at_start=True)
        return
    Trainer(
        cfg, run_dir=run_dir, resume=resume, tracking_uri=meta["trial_tracking_uri"],
        parent_run_id=meta["parent_run_id"], extra_tags=tags, step_callback=report, progress=False,
        fail_at_step=fail_at, eval_at_start=True,
    ).run()


def trial_config(config: dict[str, Any], meta: dict[str, Any]) -> ExperimentConfig:
    """The experiment a trial with Tune ``config`` runs (resources decided by it), before seeds/threads."""
    over = dict(meta["fixed"])
    if "__trial__" in config:
        over.update(meta["grid"][int(config["__trial__"])].get("trial_overrides") or {})
    over.update({k: v for k, v in config.items() if k != "__trial__"})
    return config_from_dict(apply_overrides(meta["base_dict"], over), source=meta["base_path"])


def _restore_tune_checkpoint(checkpoint: Any, run_dir: Path) -> None:
    """On another machine, Tune hands back the trial's checkpoint: put it where the trainer looks."""
    if checkpoint is None or latest_checkpoint(run_dir) is not None:
        return
    with checkpoint.as_directory() as d:
        src = Path(d)
        dst = checkpoint_root(run_dir) / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst, dirs_exist_ok=True)
        (checkpoint_root(run_dir) / LATEST).write_text(dst.name + "\n")


# --------------------------------------------------------------------------- driver side
def _trial_errors(grid: Any) -> list[str]:
    """The errors of a Tune ``ResultGrid``'s failed trials (indexable; typed without ``__iter__``)."""
    return [str(grid[i].error) for i in range(len(grid)) if grid[i].error is not None]


def _search_space(spec: SweepSpec) -> dict[str, Any]:
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


def describe_trials(spec: SweepSpec, base: dict[str, Any], base_path: str | Path) -> list[dict[str, Any]]:
    """What ``--dry-run`` prints: the trials (grid) or the space and sample count (optuna), each with
    the seeds of its repeat (grid) and the resources Tune will reserve for it (a placement group's bundles
    for multi-process trials)."""
    cpu, gpu = spec.resources.cpu, spec.resources.gpu
    fixed = dict(spec.overrides)

    def resources(overrides: dict[str, Any]) -> dict[str, Any]:
        cfg = config_from_dict(apply_overrides(base, {**fixed, **overrides}), str(base_path))
        return describe_resources(cfg, cpu, gpu)

    if spec.search.algorithm == "grid":
        return [{**t, "seeds": seed_overrides(apply_overrides(base, {**fixed, **t["overrides"]}), t["repeat"]),
                 "resources": resources(t["overrides"])}
                for t in grid_trials(spec) for _ in range(spec.num_samples)]
    res = resources({})  # optuna: the base with the fixed overrides (a searched resources.* key would change it)
    return [{"trial": i, "space": {k: d.model_dump(exclude_none=True) for k, d in spec.space.items()},
             "resources": res} for i in range(spec.num_samples)]


class SweepRunner:
    def __init__(
        self,
        sweep_path: str | Path,
        *,
        tracking_uri: Optional[str] = None,
        address: Optional[str] = None,
        output_dir: Optional[str | Path] = None,
        resume: bool = False,
        num_cpus: Optional[int] = None,
        seed_offsets: Optional[str] = None,
    ) -> None:
        self.sweep_path = Path(sweep_path).resolve()
        self.spec, self.base_path, self.base = load_sweep(self.sweep_path)
        if seed_offsets is not None:  # ulorl-sweep --seeds
            self.spec = with_seed_offsets(self.spec, seed_offsets)
        self.tracking_uri = resolve_tracking_uri(tracking_uri)
        self.store_uri = self.tracking_uri  # the store itself (the driver's server, if any, fronts it)
        self.address = address
        self.output_dir = Path(output_dir or "runs").resolve()
        self.sweep_dir = self.output_dir / "sweeps" / self.spec.name
        self.resume = resume
        self.num_cpus = num_cpus
        self._server: Any = None

    # ---------------------------------------------------------------- tracking
    def _parent_run(self) -> str:
        state_path = self.sweep_dir / STATE_FILE
        if self.resume:
            if not state_path.is_file():
                raise FileNotFoundError(f"--resume: no sweep state at {state_path}; "
                                        "run the sweep without --resume first")
            state = json.loads(state_path.read_text())
            check_resume_offsets(state.get("seed_offsets"), self.spec)
            RunTracker.resume(self.tracking_uri, state["parent_run_id"])
            return state["parent_run_id"]
        if self.sweep_dir.exists():
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.sweep_dir = self.sweep_dir.with_name(f"{self.spec.name}-{stamp}")
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        base_cfg = config_from_dict(self.base, str(self.base_path))
        experiment = self.spec.experiment or base_cfg.tracking.experiment
        space_params: dict[str, Any] = {f"space.{k}": json.dumps(d.model_dump(exclude_none=True))
                                        for k, d in self.spec.space.items()}
        space_params.update({f"fixed.{k}": v for k, v in self.spec.overrides.items()})
        space_params.update({"sweep.metric": self.spec.metric, "sweep.mode": self.spec.mode,
                             "sweep.num_samples": self.spec.num_samples, "sweep.search": self.spec.search.algorithm,
                             "sweep.max_concurrent": self.spec.max_concurrent,
                             "sweep.resources.cpu": self.spec.resources.cpu,
                             "sweep.resources.gpu": self.spec.resources.gpu,
                             "sweep.seed_offsets": ",".join(map(str, self.spec.offsets
                                                                if self.spec.baseline is None
                                                                else self.spec.baseline_offsets))})
        if self._server is not None:
            space_params["sweep.tracking_server"] = self._server.uri
            space_params["sweep.tracking_auth"] = "basic" if self._server.auth else "none"
        tracker = RunTracker.start(
            self.tracking_uri, experiment, f"sweep-{self.spec.name}", space_params,
            {schema.KIND_TAG: "sweep", schema.SWEEP_TAG: self.spec.name, "ulorl.sweep_dir": str(self.sweep_dir),
             **self.spec.tags},
        )
        tracker.log_text(self.sweep_path.read_text(), "sweep/spec.yaml")
        state_path.write_text(json.dumps({"parent_run_id": tracker.run_id, "experiment": experiment,
                                          "tracking_uri": self.store_uri, "seed_offsets": self.spec.seed_offsets}))
        (self.output_dir / "sweeps" / f"{self.spec.name}.latest").write_text(str(self.sweep_dir))
        return tracker.run_id

    def _trial_uri(self) -> str:
        """Start the driver's tracking server when trials need one (``ulorl.sweep.server``); its URI."""
        if not self.tracking_uri.startswith("sqlite:"):
            return self.tracking_uri  # a server the user named: trials use it as it is
        placed = any(needs_placement(c) for _, c in self._trial_configs())
        if self.spec.max_concurrent <= 1 and not placed and not self.address:
            return self.tracking_uri
        tc = config_from_dict(apply_overrides(self.base, dict(self.spec.overrides)), str(self.base_path)).tracking
        self._server = MlflowServer(self.tracking_uri, host=tc.server_host, auth=tc.server_auth,
                                    password=os.environ.get(tc.auth_env) or None)
        self._server.start()
        return self._server.uri

    def _trial_configs(self) -> list[tuple[str, ExperimentConfig]]:
        """(label, experiment) of every grid trial (optuna: the base with the fixed overrides)."""
        fixed = dict(self.spec.overrides)
        if self.spec.search.algorithm == "grid":
            return [(t["variant"] or str(i), config_from_dict(apply_overrides(self.base, {**fixed, **t["overrides"]}),
                                                              str(self.base_path)))
                    for i, t in enumerate(grid_trials(self.spec))]
        return [("optuna", config_from_dict(apply_overrides(self.base, fixed), str(self.base_path)))]

    def _trial_env(self) -> dict[str, str]:
        """Environment every trial (and its actors) gets through Ray's runtime_env: the failure-injection
        switch of the tests. Never a secret: Ray logs a runtime_env in plain text (the tracking credentials
        travel by :meth:`_trial_credentials`)."""
        env: dict[str, str] = {}
        if os.environ.get(FAIL_ENV):
            env[FAIL_ENV] = os.environ[FAIL_ENV]
        return env

    def _trial_credentials(self) -> dict[str, str]:
        """The tracking server's credentials for the trials (empty without auth): bound to the trainable with
        ``tune.with_parameters``, so they travel in Ray's object store and reach no log."""
        return dict(self._server.client_env()) if self._server is not None else {}

    def _resources(self, meta: dict[str, Any]) -> Any:
        cpu, gpu = self.spec.resources.cpu, self.spec.resources.gpu
        if not any(needs_placement(c) for _, c in self._trial_configs()):
            return {"cpu": cpu, "gpu": gpu}
        from ray.tune import PlacementGroupFactory

        def per_trial(config: dict[str, Any]) -> Any:
            res = trial_resources(trial_config(config, meta), cpu, gpu)
            return res if isinstance(res, PlacementGroupFactory) else PlacementGroupFactory(
                [{"CPU": cpu, **({"GPU": gpu} if gpu else {})}])
        return per_trial

    # ---------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        import ray
        from ray import tune

        if self.resume:
            latest = self.output_dir / "sweeps" / f"{self.spec.name}.latest"
            if latest.is_file():
                self.sweep_dir = Path(latest.read_text().strip())
        trial_uri = self._trial_uri()
        saved_env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
        try:
            if self._server is not None:  # the driver writes through the server too (proxied artifacts)
                os.environ.update(self._server.client_env())
                self.tracking_uri = trial_uri
            parent = self._parent_run()
            runtime_env = {"env_vars": self._trial_env()}
            if self.address:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=True, runtime_env=runtime_env)
            else:
                ray.init(num_cpus=self.num_cpus or os.cpu_count(), include_dashboard=False,
                         log_to_driver=True, ignore_reinit_error=True, runtime_env=runtime_env)
            try:
                check_trials_fit(self._trial_configs())
            except PlacementError as exc:
                raise SweepError(str(exc)) from None
            meta = {
                "base_dict": self.base, "base_path": str(self.base_path), "sweep_dir": str(self.sweep_dir),
                "sweep_name": self.spec.name, "parent_run_id": parent, "trial_tracking_uri": trial_uri,
                "tags": dict(self.spec.tags), "metrics": self.spec.metrics, "cpu": self.spec.resources.cpu,
                "fixed": {**self.spec.overrides,
                          **({"train.max_steps": self.spec.stop.steps} if self.spec.stop.steps else {}),
                          **({"train.max_wall_s": self.spec.stop.wall_s} if self.spec.stop.wall_s else {})},
            }
            if self.spec.search.algorithm == "grid":
                meta["grid"] = [{"trial_overrides": t["overrides"], "variant": t["variant"], "repeat": t["repeat"],
                                 "trial_tags": t["tags"]} for t in grid_trials(self.spec)]
            trainable = tune.with_resources(tune.with_parameters(trial_fn, meta=meta,
                                                                 credentials=self._trial_credentials()),
                                            self._resources(meta))
            storage = str(self.sweep_dir / "tune")
            if self.resume and tune.Tuner.can_restore(os.path.join(storage, self.spec.name)):
                tuner = tune.Tuner.restore(os.path.join(storage, self.spec.name), trainable,
                                           resume_unfinished=True, resume_errored=True)
            else:
                tuner = self._new_tuner(trainable, meta, storage)
            results = tuner.fit()
            errors = _trial_errors(results)
            if self.spec.baseline is not None:
                extra = tune.Tuner(trainable, **self._extra_tuner_kwargs(results))
                errors += _trial_errors(extra.fit())
            ray.shutdown()
            summary = self._finish(parent)
        finally:
            ray.shutdown()
            if self._server is not None:
                self._server.stop()
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            self.tracking_uri = self.store_uri
        summary["errors"] = errors
        return summary

    def _new_tuner(self, trainable: Any, meta: dict[str, Any], storage: str) -> Any:
        from ray import tune

        spec = self.spec
        single = len(spec.metrics) == 1
        tune_kwargs: dict[str, Any] = {"max_concurrent_trials": spec.max_concurrent}
        if spec.search.algorithm == "grid":
            param_space = {"__trial__": tune.grid_search(list(range(len(meta["grid"]))))}
            tune_kwargs["num_samples"] = spec.num_samples
        else:
            import optuna
            from ray.tune.search import ConcurrencyLimiter
            from ray.tune.search.optuna import OptunaSearch

            storage_url = f"sqlite:///{self.sweep_dir / 'optuna.db'}"
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
            param_space = _search_space(spec)
        if single:
            tune_kwargs["metric"] = spec.metrics[0]
            tune_kwargs["mode"] = spec.modes[0]
        if spec.scheduler is not None:
            from ray.tune.schedulers import ASHAScheduler

            steps = meta["fixed"].get("train.max_steps") or config_from_dict(self.base).train.max_steps
            tune_kwargs["scheduler"] = ASHAScheduler(
                time_attr="training_iteration", max_t=int(steps), grace_period=spec.scheduler.grace_period,
                reduction_factor=spec.scheduler.reduction_factor,
            )
        return tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(**tune_kwargs),
            run_config=tune.RunConfig(
                name=spec.name, storage_path=storage, verbose=1,
                failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            ),
        )

    def _extra_tuner_kwargs(self, results: Any) -> dict[str, Any]:
        """Tuner arguments for the trials outside the searcher: the baseline on every seed offset of
        ``spec.baseline_offsets`` and the best search trial re-run on those other than 0 (the search
        trials run on offset 0). Each trial's settings travel in its config
        (``__extra__``), so the same trainable runs them."""
        from ray import tune

        spec = self.spec
        assert spec.baseline is not None
        done = [r for r in results if r.error is None and r.metrics]
        i = ranking.best_index([r.metrics.get(spec.metrics[0]) for r in done],
                               [str(r.metrics.get("trial_id", "")) for r in done], spec.modes[0])
        best = done[i] if i is not None else None
        searched = ({k: v for k, v in best.config.items() if k in spec.space}
                    if best is not None and best.config and "__trial__" not in best.config else None)
        entries = []
        # seed-major, offset 0 last: a sweep cut short still leaves whole (baseline, re-run) pairs,
        # the ones its verdict reads (offset 0 pairs with the selected search trial, not counted)
        for rep in sorted(spec.baseline_offsets, key=lambda r: (r == 0, r)):
            entries.append({"trial_overrides": dict(spec.baseline.overrides), "variant": spec.baseline.name,
                            "repeat": rep, "role": ranking.ROLE_BASELINE})
            if searched is not None and rep != 0:
                entries.append({"trial_overrides": searched, "variant": "", "repeat": rep, "role": ranking.ROLE_RERUN})
        return {
            "param_space": {"__extra__": tune.grid_search(entries)},
            "tune_config": tune.TuneConfig(max_concurrent_trials=spec.max_concurrent),
            "run_config": tune.RunConfig(name=f"{spec.name}-baseline", storage_path=str(self.sweep_dir / "tune"),
                                         verbose=1, failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                                         checkpoint_config=tune.CheckpointConfig(num_to_keep=2)),
        }

    # ---------------------------------------------------------------- ranking
    def _finish(self, parent: str) -> dict[str, Any]:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.tracking_uri)
        summary = ranking.summarize(client, parent, self.spec, self.base, self.base_path)
        tracker = RunTracker(client, parent)
        tracker.log_text(ranking.ranking_csv(summary["ranking"]), "sweep/ranking.csv")
        best = summary["best"]
        if best is not None:
            tracker.log_dict({**best, "command": summary["command"], "verdict": summary["verdict"]}, "sweep/best.json")
            tracker.set_tags({"ulorl.best_run_id": best["run_id"]})
            if best.get("objective") is not None:
                tracker.add_metrics({f"best/{self.spec.metrics[0]}": best["objective"]}, step=0)
        tracker.add_metrics({"sweep/trials": len(summary["ranking"])}, step=0)
        tracker.end("FINISHED")
        return {**summary, "parent_run_id": parent, "sweep_dir": str(self.sweep_dir), "tracking_uri": self.store_uri}
