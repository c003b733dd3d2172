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

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional, TextIO

from ulorl.config import ExperimentConfig, apply_overrides, config_from_dict
from ulorl.quiet import quiet_libraries
from ulorl.scale.placement import PlacementError
from ulorl.sweep import prune, ranking
from ulorl.sweep.capture import OutputCapture
from ulorl.sweep.command import fixed_overrides
from ulorl.sweep.console import SweepView
from ulorl.sweep.placed import check_trials_fit, describe_resources, needs_placement, run_placed_trial, trial_resources
from ulorl.sweep.server import MlflowServer, stop_stale_server
from ulorl.sweep.spec import (
    SweepError,
    SweepSpec,
    check_resume_offsets,
    check_resume_spec,
    grid_trials,
    load_sweep,
    seed_overrides,
    trial_run_name,
    values_summary,
    with_seed_offsets,
)
from ulorl.sweep.summary import summarize
from ulorl.sweep.summary_text import ranking_csv
from ulorl.tracking import resolve_tracking_uri, schema
from ulorl.tracking.credentials import CREDENTIAL_VARS, install_credentials
from ulorl.tracking.run import RunTracker
from ulorl.train.checkpoint import LATEST, checkpoint_root, latest_checkpoint
from ulorl.train.trainer import Trainer

STATE_FILE = "sweep_state.json"
LOG_FILE = "sweep.log"   # everything the driver, Ray, Tune and the trials print (ulorl-sweep's console shows less)
FAIL_ENV = "ULORL_INJECT_FAILURE"   # "STEP:MARKER_PATH": fail once at STEP (tests of fault tolerance)


# --------------------------------------------------------------------------- trial side
def trial_fn(config: dict[str, Any], meta: dict[str, Any], credentials: Optional[dict[str, str]] = None) -> None:
    """Ray Tune function trainable: one full ``ulorl-train`` run with the trial's overrides.

    ``config`` holds the searched keys (optuna) or ``__trial__`` (index into ``meta["grid"]``);
    ``meta`` (bound with ``tune.with_parameters``) holds the sweep-wide settings, ``credentials`` the
    tracking server's (``ulorl.tracking.credentials``: through the object store, never a logged env).
    """
    import ray.tune as tune

    quiet_libraries()
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
        out[prune.FRESH_KEY] = float(bool(metrics_names) and prune.objective_fresh(metrics_names[0], metrics))
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


@contextlib.contextmanager
def _secrets_hidden_from_children(names: tuple[str, ...]) -> Iterator[None]:
    """Take ``names`` out of this process's environment while the body starts child processes (Ray's
    head, raylet and workers keep the environment they start with, and may outlive a killed driver),
    then put them back for this process's own MLflow client."""
    saved = {k: os.environ.pop(k) for k in names if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


class SweepInterrupted(Exception):
    """The sweep was stopped (Ctrl-C / SIGINT) before every trial finished: its parent run is KILLED,
    ``ulorl-sweep SPEC --resume`` continues it."""

    def __init__(self, unfinished: list[str], not_started: int, parent_run_id: Optional[str], sweep_dir: Path,
                 signum: int = signal.SIGINT):
        super().__init__(f"sweep interrupted with {len(unfinished)} unfinished trial(s)")
        self.unfinished = unfinished
        self.not_started = not_started
        self.parent_run_id = parent_run_id
        self.sweep_dir = sweep_dir
        self.signum = signum   # what stopped it: the command exits with 128 + signum (130 Ctrl-C, 143 SIGTERM)


class SweepAlreadyFinished(Exception):
    """``--resume`` of a sweep whose parent run finished: nothing is run or logged again."""

    def __init__(self, parent_run_id: str, sweep_dir: Path):
        super().__init__(f"sweep already finished (parent run {parent_run_id}, {sweep_dir})")
        self.parent_run_id = parent_run_id
        self.sweep_dir = sweep_dir


class _SigintFlag:
    """While a sweep runs (main thread), SIGINT and SIGTERM set ``runner._sigint`` (and which signal it was)
    and raise KeyboardInterrupt as Python's default SIGINT handler does, so a SIGTERM stops the sweep as
    Ctrl-C does (runs marked KILLED, the resume command printed, the server stopped); the flag tells an
    interruption apart however Ray re-raises it."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.runner._sigint = True
        self.runner._stop_signal = signum
        raise KeyboardInterrupt

    def __enter__(self) -> _SigintFlag:
        self.runner._sigint = False
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self.old.items():
            signal.signal(sig, old)
        self.old.clear()


class SweepRunner:
    """Runs one sweep spec. With ``console`` (``ulorl-sweep`` passes its stdout) the driver's and
    the trials' output goes to ``<sweep dir>/sweep.log`` and the console shows the sweep's own view
    (``verbose``: Tune's output too); without it, output is left as it is (library use, tests)."""

    def __init__(
        self,
        sweep_path: str | Path,
        *,
        tracking_uri: Optional[str] = None,
        address: Optional[str] = None,
        output_dir: Optional[str | Path] = None,
        resume: bool = False,
        num_cpus: Optional[int] = None,
        console: Optional[TextIO] = None,
        verbose: bool = False,
        seed_offsets: Optional[str] = None,
    ) -> None:
        self.sweep_path = Path(sweep_path).resolve()
        self.spec, self.base_path, self.base = load_sweep(self.sweep_path)
        if seed_offsets is not None:  # ulorl-sweep --seeds
            self.spec = with_seed_offsets(self.spec, seed_offsets)
        self._check_scheduler()
        self.tracking_uri = resolve_tracking_uri(tracking_uri)
        self.store_uri = self.tracking_uri  # the store itself (the driver's server, if any, fronts it)
        self.address = address
        self.output_dir = Path(output_dir or "runs").resolve()
        self.sweep_dir = self.output_dir / "sweeps" / self.spec.name
        self.resume = resume
        self.num_cpus = num_cpus
        self.console = console
        self.verbose = verbose
        self._server: Any = None
        self._view: Optional[SweepView] = None
        self._sigint = False
        self._stop_signal: int = signal.SIGINT

    def _check_scheduler(self) -> None:
        """A rule on an eval metric reads it at evals only: it cannot judge a trial before the first one."""
        sch, metric = self.spec.scheduler, self.spec.metrics[0]
        if sch is None or sch.type == "none" or not metric.startswith("eval/"):
            return
        every = config_from_dict(apply_overrides(self.base, fixed_overrides(self.spec)),
                                 str(self.base_path)).eval.every
        if not every or sch.grace_period < every:
            raise SweepError(f"scheduler.grace_period ({sch.grace_period}) must be at least eval.every ({every}): "
                             f"{metric} is only evaluated every eval.every steps")

    # ---------------------------------------------------------------- tracking
    def _choose_sweep_dir(self) -> None:
        """``--resume``: the sweep's latest directory (it must hold the sweep state); else a new one
        (timestamped when the plain name is taken), recorded as the latest."""
        latest = self.output_dir / "sweeps" / f"{self.spec.name}.latest"
        if self.resume:
            if latest.is_file():
                self.sweep_dir = Path(latest.read_text().strip())
            if not (self.sweep_dir / STATE_FILE).is_file():
                raise FileNotFoundError(f"--resume: no sweep state at {self.sweep_dir / STATE_FILE}; "
                                        "run the sweep without --resume first")
            return
        if self.sweep_dir.exists():
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.sweep_dir = self.sweep_dir.with_name(f"{self.spec.name}-{stamp}")
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        latest.write_text(str(self.sweep_dir))

    def _parent_run(self) -> str:
        state_path = self.sweep_dir / STATE_FILE
        if self.resume:
            state = json.loads(state_path.read_text())
            check_resume_offsets(state.get("seed_offsets"), self.spec)
            from mlflow.tracking import MlflowClient

            if MlflowClient(self.tracking_uri).get_run(state["parent_run_id"]).info.status == "FINISHED":
                raise SweepAlreadyFinished(state["parent_run_id"], self.sweep_dir)
            RunTracker.resume(self.tracking_uri, state["parent_run_id"])
            return state["parent_run_id"]
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
        tracker.log_text(self.sweep_path.read_text(encoding="utf-8"), "sweep/spec.yaml")
        state_path.write_text(json.dumps({"parent_run_id": tracker.run_id, "experiment": experiment,
                                          "tracking_uri": self.store_uri, "seed_offsets": self.spec.seed_offsets,
                                          "spec": self.spec.model_dump(mode="json"), "base": self.base}))
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
                                    password=os.environ.get(tc.auth_env) or None, state_dir=self.sweep_dir,
                                    hide_env=(tc.auth_env,))
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

    def _secret_vars(self) -> tuple[str, ...]:
        """Environment variables of the driver that hold a tracking secret (never handed to Ray's processes)."""
        tc = config_from_dict(apply_overrides(self.base, dict(self.spec.overrides)), str(self.base_path)).tracking
        return (*CREDENTIAL_VARS, tc.auth_env)

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
        """Run (or, with ``resume``, continue) the sweep and return its summary (:func:`ulorl.sweep.summary.summarize`
        plus ``errors``, ``parent_run_id``, ``sweep_dir``). Raises :class:`SweepInterrupted` when
        stopped by SIGINT, :class:`SweepAlreadyFinished` on a resume of a finished sweep."""
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        # Ctrl-C must reach the driver as KeyboardInterrupt: Tune's own SIGINT handler ends fit() as if the
        # sweep were done (stopped trials can look finished or failed), and the summary would follow.
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        quiet_libraries()
        self._stop_stale_server()
        self._choose_sweep_dir()
        if self.resume:
            self._check_resume_state()   # before the console: a finished sweep shows its result, no progress
        with _SigintFlag(self):
            return self._run_with_console()

    def _stop_stale_server(self) -> None:
        """The tracking server of this sweep's last driver, when that driver and the server's guard were both
        killed (``kill -9`` of both): stopped, with its auth folder, before anything else starts."""
        latest = self.output_dir / "sweeps" / f"{self.spec.name}.latest"
        last = Path(latest.read_text().strip()) if latest.is_file() else self.sweep_dir
        done = stop_stale_server(last)
        if done:
            print(f"ulorl-sweep: {done}", file=sys.stderr, flush=True)

    def _check_resume_state(self) -> None:
        """``--resume``: the seeds and the spec (and its base experiment) must be the ones the sweep started
        with, a change named key by key (:class:`SweepError`); a finished sweep raises
        :class:`SweepAlreadyFinished`."""
        state = json.loads((self.sweep_dir / STATE_FILE).read_text(encoding="utf-8"))
        check_resume_offsets(state.get("seed_offsets"), self.spec)
        check_resume_spec(state, self.spec, self.base, self.sweep_path, self.sweep_dir)
        from mlflow.tracking import MlflowClient

        if MlflowClient(self.store_uri).get_run(state["parent_run_id"]).info.status == "FINISHED":
            raise SweepAlreadyFinished(state["parent_run_id"], self.sweep_dir)

    def _run_with_console(self) -> dict[str, Any]:
        if self.console is None:
            return self._run()
        try:
            console_fd = self.console.fileno()
        except (AttributeError, OSError, ValueError):   # a stream without a descriptor (tests' capture)
            console_fd = 1
        with OutputCapture(self.sweep_dir / LOG_FILE, echo=self.verbose, console_fd=console_fd) as cap:
            live = not self.verbose and cap.console.isatty()
            self._view = SweepView(self.spec.name, self.planned_trials(), self._steps_per_trial(), self.spec.metrics[0],
                                   cap.console, live=live)
            self._view.start()
            try:
                return self._run()
            finally:
                self._view.close()

    def _run(self) -> dict[str, Any]:
        import ray
        from ray import tune

        from ulorl.sweep import tune_events

        key = str(self.sweep_dir)
        if self._view is not None:
            tune_events.register(key, self._view, self.describe_trial, self.spec.metrics[0])
        # A new list per tuner: Tune appends its own callbacks to the list it is given.
        def callbacks() -> list[Any]:
            return [tune_events.ViewCallback(key)] if self._view is not None else []

        parent: Optional[str] = None
        saved_env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
        try:
            trial_uri = self._trial_uri()
            if self._server is not None:  # the driver writes through the server too (proxied artifacts)
                os.environ.update(self._server.client_env())
                self.tracking_uri = trial_uri
            parent = self._parent_run()
            runtime_env = {"env_vars": self._trial_env()}
            with _secrets_hidden_from_children(self._secret_vars()):   # Ray's processes inherit the environment
                if self.address:
                    ray.init(address=self.address, include_dashboard=False, log_to_driver=True,
                             runtime_env=runtime_env)
                else:
                    ray.init(num_cpus=self.num_cpus or os.cpu_count(), include_dashboard=False,
                             log_to_driver=True, ignore_reinit_error=True, runtime_env=runtime_env)
            try:
                check_trials_fit(self._trial_configs())
            except PlacementError as exc:
                raise SweepError(str(exc)) from None
            meta = self._meta(parent, trial_uri)
            trainable = tune.with_resources(tune.with_parameters(trial_fn, meta=meta,
                                                                 credentials=self._trial_credentials()),
                                            self._resources(meta))
            storage = str(self.sweep_dir / "tune")
            main_path = os.path.join(storage, self.spec.name)
            if self.resume and tune.Tuner.can_restore(main_path):
                tuner = tune.Tuner.restore(main_path, trainable, resume_unfinished=True, resume_errored=True)
            else:
                tuner = self._new_tuner(trainable, meta, storage, callbacks())
            results = tuner.fit()
            self._mark_pruned(parent)
            self._raise_if_cut_short(results, self._search_count(), parent)
            errors = _trial_errors(results)
            if self._has_extra_trials():
                extra_path = os.path.join(storage, f"{self.spec.name}-baseline")
                if self.resume and tune.Tuner.can_restore(extra_path):
                    extra = tune.Tuner.restore(extra_path, trainable, resume_unfinished=True, resume_errored=True)
                    expected = None
                else:
                    kwargs = self._extra_tuner_kwargs(results, callbacks())
                    expected = len(kwargs["param_space"]["__extra__"]["grid_search"])
                    extra = tune.Tuner(trainable, **kwargs)
                extra_results = extra.fit()
                self._raise_if_cut_short(extra_results, expected, parent)
                errors += _trial_errors(extra_results)
            ray.shutdown()
            summary = self._finish(parent)
        except KeyboardInterrupt:  # Ctrl-C (SIGINT) anywhere: trials stop with Ray, then the runs are marked
            ray.shutdown()
            raise self._interrupted(parent) from None
        except (SweepInterrupted, SweepAlreadyFinished):
            raise
        except Exception:
            if self._sigint:   # a KeyboardInterrupt raised inside Ray's C code surfaces as SystemError
                ray.shutdown()
                raise self._interrupted(parent) from None
            if parent is not None:   # the sweep cannot go on: its parent run says so (a --resume may continue)
                from mlflow.tracking import MlflowClient

                MlflowClient(self.tracking_uri).set_terminated(parent, status="FAILED")
            raise
        finally:
            ray.shutdown()
            tune_events.unregister(key)
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

    def _meta(self, parent: str, trial_uri: str) -> dict[str, Any]:
        """The sweep-wide settings every trial gets (``trial_fn``'s ``meta``)."""
        meta = {
            "base_dict": self.base, "base_path": str(self.base_path), "sweep_dir": str(self.sweep_dir),
            "sweep_name": self.spec.name, "parent_run_id": parent, "trial_tracking_uri": trial_uri,
            "tags": dict(self.spec.tags), "metrics": self.spec.metrics, "cpu": self.spec.resources.cpu,
            "fixed": fixed_overrides(self.spec),
        }
        if self.spec.search.algorithm == "grid":
            meta["grid"] = [{"trial_overrides": t["overrides"], "variant": t["variant"], "repeat": t["repeat"],
                             "trial_tags": t["tags"]} for t in grid_trials(self.spec)]
        return meta

    # ---------------------------------------------------------------- console and interruption
    def _search_count(self) -> int:
        """Trials of the searcher phase (grid: every grid point x num_samples)."""
        spec = self.spec
        return len(grid_trials(spec)) * spec.num_samples if spec.search.algorithm == "grid" else spec.num_samples

    def _has_extra_trials(self) -> bool:
        return self.spec.baseline is not None or bool(self.spec.references)

    def planned_trials(self) -> int:
        """Every trial the sweep runs: search, then baseline, re-runs of the best and references."""
        return self._search_count() + (len(self._extra_entries({})) if self._has_extra_trials() else 0)

    def _steps_per_trial(self) -> int:
        steps = fixed_overrides(self.spec).get("train.max_steps")
        return int(steps or config_from_dict(self.base, str(self.base_path)).train.max_steps)

    def describe_trial(self, config: dict[str, Any]) -> tuple[str, str]:
        """(role, short values) of a trial from its Tune config, as the console shows it:
        ``("search", "tau=0.9 sigma=0.0931")``, ``("baseline", "masking_off seed+1")``."""
        space = list(self.spec.space)
        if "__extra__" in config:
            e = config["__extra__"]
            role = str(e.get("role", ranking.ROLE_BASELINE))
            overrides = dict(e.get("trial_overrides") or {})
            text = values_summary(overrides) if role == ranking.ROLE_RERUN else str(e.get("variant") or "")
            rep = int(e.get("repeat", 0))
            return role, " ".join(x for x in (text, f"seed+{rep}" if rep else "") if x)
        if "__trial__" in config:
            t = grid_trials(self.spec)[int(config["__trial__"])]
            searched = {k: v for k, v in t["overrides"].items() if k in space}
            rep = int(t["repeat"])
            parts = (t["variant"], values_summary(searched), f"seed+{rep}" if rep else "")
            return ranking.ROLE_SEARCH, " ".join(x for x in parts if x)
        return ranking.ROLE_SEARCH, values_summary({k: config[k] for k in space if k in config})

    def _raise_if_cut_short(self, results: Any, expected: Optional[int], parent: Optional[str]) -> None:
        """Tune returned with trials neither finished nor failed (stopped from outside): stop the sweep there."""
        done = results.num_terminated + results.num_errors
        unfinished = done < len(results) or (expected is not None and done < expected)
        if unfinished:
            raise self._interrupted(parent)

    def _mark_pruned(self, parent: Optional[str]) -> None:
        """The child runs of the trials the scheduler pruned: KILLED, tagged with the rule and step."""
        if parent is not None:
            from mlflow.tracking import MlflowClient

            prune.mark_pruned_runs(MlflowClient(self.tracking_uri), parent, prune.read_pruned(self.sweep_dir))

    def _interrupted(self, parent: Optional[str]) -> SweepInterrupted:
        """Mark the parent run and its unfinished child runs KILLED; the exception the CLI reports."""
        self._mark_pruned(parent)
        if parent is not None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(self.tracking_uri)   # the sweep's server while it runs
            exp = client.get_run(parent).info.experiment_id
            for child in client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'"):
                if child.info.status == "RUNNING":
                    client.set_terminated(child.info.run_id, status="KILLED")
            client.set_terminated(parent, status="KILLED")
        view = self._view
        unfinished = [f"{t.label()} (step {t.step}/{t.total}, {t.status})" for t in view.unfinished()] if view else []
        return SweepInterrupted(unfinished, view.not_created() if view else 0, parent, self.sweep_dir,
                                self._stop_signal)

    def _new_tuner(self, trainable: Any, meta: dict[str, Any], storage: str, callbacks: list[Any]) -> Any:
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
        if spec.scheduler is not None:   # the search trials only: baselines and re-runs have their own tuner
            tune_kwargs["scheduler"] = prune.build_scheduler(spec.scheduler, self.sweep_dir, self._steps_per_trial())
        return tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(**tune_kwargs),
            run_config=tune.RunConfig(
                name=spec.name, storage_path=storage, verbose=1, callbacks=callbacks,
                failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            ),
        )

    def _extra_entries(self, best_searched: Optional[dict[str, Any]]) -> list[dict[str, Any]]:
        """The trials outside the searcher, each as its ``__extra__`` config: the baseline on every
        offset of ``spec.baseline_offsets``, the best search trial (its searched values ``best_searched``;
        None: no best) re-run on those other than 0 (the search trials run on offset 0), and each
        reference on its offsets."""
        spec = self.spec
        entries: list[dict[str, Any]] = []
        if spec.baseline is not None:
            # seed-major, offset 0 last: a sweep cut short still leaves whole (baseline, re-run) pairs,
            # the ones its verdict reads (offset 0 pairs with the selected search trial, not counted)
            for rep in sorted(spec.baseline_offsets, key=lambda r: (r == 0, r)):
                entries.append({"trial_overrides": dict(spec.baseline.overrides), "variant": spec.baseline.name,
                                "repeat": rep, "role": ranking.ROLE_BASELINE})
                if best_searched is not None and rep != 0:
                    entries.append({"trial_overrides": dict(best_searched), "variant": "", "repeat": rep,
                                    "role": ranking.ROLE_RERUN})
        entries += [{"trial_overrides": dict(ref.overrides), "variant": ref.name, "repeat": rep,
                     "role": ranking.ROLE_REFERENCE} for ref in spec.references for rep in spec.reference_offsets(ref)]
        return entries

    def _extra_tuner_kwargs(self, results: Any, callbacks: list[Any]) -> dict[str, Any]:
        """Tuner arguments for the trials outside the searcher (:meth:`_extra_entries`). Each trial's
        settings travel in its config (``__extra__``), so the same trainable runs them."""
        from ray import tune

        spec = self.spec
        pruned = prune.read_pruned(self.sweep_dir)   # a pruned trial is never the best one
        done = [r for r in results if r.error is None and r.metrics and r.metrics.get("trial_id") not in pruned]
        i = ranking.best_index([r.metrics.get(spec.metrics[0]) for r in done],
                               [str(r.metrics.get("trial_id", "")) for r in done], spec.modes[0])
        best = done[i] if i is not None else None
        searched = None
        if best is not None and best.config and "__trial__" not in best.config:
            searched = {k: v for k, v in best.config.items() if k in spec.space}
        tune_config = tune.TuneConfig(max_concurrent_trials=spec.max_concurrent)
        assert tune_config.scheduler is None, "baselines, re-runs and references are never pruned"
        return {
            "param_space": {"__extra__": tune.grid_search(self._extra_entries(searched))},
            "tune_config": tune_config,
            "run_config": tune.RunConfig(name=f"{spec.name}-baseline", storage_path=str(self.sweep_dir / "tune"),
                                         verbose=1, callbacks=callbacks,
                                         failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                                         checkpoint_config=tune.CheckpointConfig(num_to_keep=2)),
        }

    # ---------------------------------------------------------------- ranking
    def finished_summary(self, parent: str) -> dict[str, Any]:
        """The summary of a finished sweep, read from the store; nothing is logged."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.store_uri)
        summary = summarize(client, parent, self.spec, self.base, self.base_path)
        exp = client.get_run(parent).info.experiment_id
        kids = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
        done = sum(k.info.status in ("FINISHED", "FAILED", "KILLED") for k in kids)   # KILLED: pruned
        return {**summary, "parent_run_id": parent, "sweep_dir": str(self.sweep_dir), "tracking_uri": self.store_uri,
                "errors": [], "trials_done": done, "trials_planned": self.planned_trials()}

    def _finish(self, parent: str) -> dict[str, Any]:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.tracking_uri)
        prune.mark_pruned_runs(client, parent, prune.read_pruned(self.sweep_dir))
        summary = summarize(client, parent, self.spec, self.base, self.base_path)
        tracker = RunTracker(client, parent)
        tracker.log_text(ranking_csv(summary["ranking"]), "sweep/ranking.csv")
        best = summary["best"]
        metrics: dict[str, float] = {"sweep/trials": len(summary["ranking"])}
        if best is not None:
            tracker.log_dict({**best, "command": summary["command"], "verdict": summary["verdict"],
                              "speedup": summary.get("speedup")}, "sweep/best.json")
            tracker.set_tags({"ulorl.best_run_id": best["run_id"]})
            if best.get("objective") is not None:
                metrics[f"best/{self.spec.metrics[0]}"] = best["objective"]
        for sp in summary.get("speedup") or []:
            metrics[f"sweep/speedup_s{sp['segments']}_time_per_step"] = sp["step_speedup"]
            metrics[f"sweep/speedup_s{sp['segments']}_trained_per_s"] = sp["throughput_x"]
        logged = client.get_run(parent).data.metrics   # a summary cut short and run again logs each once
        tracker.add_metrics({k: v for k, v in metrics.items() if k not in logged}, step=0)
        tracker.end("FINISHED")
        return {**summary, "parent_run_id": parent, "sweep_dir": str(self.sweep_dir), "tracking_uri": self.store_uri}
