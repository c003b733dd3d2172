"""Run a sweep: Ray Tune trials of the full trainer, Optuna search, MLflow parent + child runs.

* The driver makes every path absolute (Tune trials run in a temporary working directory).
* The sweep is an MLflow parent run (``ulorl.sweep.parent_run``); each trial (``ulorl.sweep.trial``) is a
  child run (``mlflow.parentRunId``) tagged with its trial id. With more than one concurrent trial on a
  ``sqlite:`` store, the driver serves the file through a local ``mlflow server`` on 127.0.0.1 for the
  trials (SQLite locks under concurrent writers) and stops it at the end.
* The search trials run first (``ulorl.sweep.tuners``), then the trials outside the searcher
  (``ulorl.sweep.plan``: baseline, re-runs of the best, references).
* A failing trial is retried (``FailureConfig``) and resumes from its own checkpoint into the same
  MLflow run; ``--resume`` restores the Tune experiment after the driver was killed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional, TextIO

from ulorl.config import ExperimentConfig, apply_overrides, config_from_dict
from ulorl.quiet import quiet_libraries
from ulorl.scale.local_ray import LocalRayError, init_ray
from ulorl.scale.placement import PlacementError
from ulorl.sweep import plan, prune, tuners
from ulorl.sweep.capture import OutputCapture
from ulorl.sweep.command import fixed_overrides
from ulorl.sweep.console import SweepView
from ulorl.sweep.parent_run import SweepParentRun, parent_params
from ulorl.sweep.placed import check_trials_fit, describe_resources, needs_placement, trial_resources
from ulorl.sweep.server import MlflowServer, stop_stale_server
from ulorl.sweep.spec import (
    SweepError,
    SweepSpec,
    check_resume_offsets,
    check_resume_spec,
    grid_trials,
    load_sweep,
    seed_overrides,
    with_seed_offsets,
)
from ulorl.sweep.trial import FAIL_ENV, trial_config, trial_fn, trial_meta
from ulorl.tracking import resolve_tracking_uri, schema
from ulorl.tracking.credentials import CREDENTIAL_VARS
from ulorl.tracking.run import RunTracker

STATE_FILE = "sweep_state.json"
LOG_FILE = "sweep.log"   # everything the driver, Ray, Tune and the trials print (ulorl-sweep's console shows less)


def _trial_results(grid: Any) -> list[Any]:
    """The results of a Tune ``ResultGrid`` (indexable; typed without ``__iter__``)."""
    return [grid[i] for i in range(len(grid))]


def _trial_errors(grid: Any) -> list[str]:
    """The errors of a Tune ``ResultGrid``'s failed trials."""
    return [str(r.error) for r in _trial_results(grid) if r.error is not None]


def cut_short(results: Any, expected: Optional[int]) -> bool:
    """Whether Tune returned with trials neither finished nor failed (stopped from outside), or fewer
    trials than ``expected`` (None: as many as it holds)."""
    done = results.num_terminated + results.num_errors
    return done < len(results) or (expected is not None and done < expected)


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
    """The sweep was stopped (Ctrl-C / SIGINT, or SIGTERM) before every trial finished: its parent run is KILLED,
    ``ulorl-sweep SPEC --resume`` continues it."""

    def __init__(self, unfinished: list[str], not_started: int, parent_run_id: Optional[str], sweep_dir: Path,
                 signum: int = signal.SIGINT):
        super().__init__(f"sweep interrupted with {len(unfinished)} unfinished trial(s)")
        self.unfinished = unfinished
        self.not_started = not_started
        self.parent_run_id = parent_run_id
        self.sweep_dir = sweep_dir
        self.signum = signum   # what stopped it: the command exits with 128 + signum (130 Ctrl-C, 143 SIGTERM)

    @classmethod
    def from_view(cls, view: Optional[SweepView], parent_run_id: Optional[str], sweep_dir: Path,
                  signum: int = signal.SIGINT) -> SweepInterrupted:
        """The interruption as the console's ``view`` saw it: each trial started and not finished (its step
        and status), and how many were not started yet; nothing is known without a view."""
        unfinished = [f"{t.label()} (step {t.step}/{t.total}, {t.status})" for t in view.unfinished()] if view else []
        return cls(unfinished, view.not_created() if view else 0, parent_run_id, sweep_dir, signum)


class SweepAlreadyFinished(Exception):
    """``--resume`` of a sweep whose parent run finished: nothing is run or logged again."""

    def __init__(self, parent_run_id: str, sweep_dir: Path):
        super().__init__(f"sweep already finished (parent run {parent_run_id}, {sweep_dir})")
        self.parent_run_id = parent_run_id
        self.sweep_dir = sweep_dir


class StopSignals:
    """While a sweep runs (main thread), SIGINT and SIGTERM are recorded (:meth:`receive`) and raise
    KeyboardInterrupt as Python's default SIGINT handler does, so a SIGTERM stops the sweep as Ctrl-C does
    (runs marked KILLED, the resume command printed, the server stopped); the record tells an interruption
    apart however Ray re-raises it. Used as a context manager, which installs the handlers and puts the old
    ones back."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: Optional[int] = None   # the signal that stopped the sweep, None while none came
        self._old: dict[int, Any] = {}

    @property
    def signum(self) -> int:
        """What stopped the sweep: the signal received, else SIGINT (a bare KeyboardInterrupt is Ctrl-C)."""
        return signal.SIGINT if self.received is None else self.received

    def receive(self, signum: int, frame: Any = None) -> None:
        """The handler: record ``signum`` and stop the sweep (KeyboardInterrupt)."""
        self.received = signum
        raise KeyboardInterrupt

    def __enter__(self) -> StopSignals:
        self.received = None
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self.receive)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


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
        self.stop_signals = StopSignals()
        self._server: Any = None
        self._view: Optional[SweepView] = None

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

    def planned_trials(self) -> int:
        """Every trial the sweep runs (:func:`ulorl.sweep.plan.planned_trials`)."""
        return plan.planned_trials(self.spec)

    def _steps_per_trial(self) -> int:
        steps = fixed_overrides(self.spec).get("train.max_steps")
        return int(steps or config_from_dict(self.base, str(self.base_path)).train.max_steps)

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

    def _parent_run(self) -> SweepParentRun:
        state_path = self.sweep_dir / STATE_FILE
        if self.resume:
            state = json.loads(state_path.read_text())
            check_resume_offsets(state.get("seed_offsets"), self.spec)
            parent = SweepParentRun(self.tracking_uri, state["parent_run_id"], self.sweep_dir)
            if parent.client.get_run(parent.run_id).info.status == "FINISHED":
                raise SweepAlreadyFinished(parent.run_id, self.sweep_dir)
            RunTracker.resume(self.tracking_uri, parent.run_id)
            return parent
        experiment = self.spec.experiment or config_from_dict(self.base, str(self.base_path)).tracking.experiment
        tracker = RunTracker.start(
            self.tracking_uri, experiment, f"sweep-{self.spec.name}", parent_params(self.spec, self._server),
            {schema.KIND_TAG: "sweep", schema.SWEEP_TAG: self.spec.name, "ulorl.sweep_dir": str(self.sweep_dir),
             **self.spec.tags}, spec=self.sweep_path,
        )
        tracker.log_text(self.sweep_path.read_text(encoding="utf-8"), "sweep/spec.yaml")
        state_path.write_text(json.dumps({"parent_run_id": tracker.run_id, "experiment": experiment,
                                          "tracking_uri": self.store_uri, "seed_offsets": self.spec.seed_offsets,
                                          "spec": self.spec.model_dump(mode="json"), "base": self.base}))
        return SweepParentRun(self.tracking_uri, tracker.run_id, self.sweep_dir)

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
        stopped by SIGINT or SIGTERM, :class:`SweepAlreadyFinished` on a resume of a finished sweep."""
        # Ctrl-C must reach the driver as KeyboardInterrupt: Tune's own SIGINT handler ends fit() as if the
        # sweep were done (stopped trials can look finished or failed), and the summary would follow.
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        quiet_libraries()
        self._stop_stale_server()
        self._choose_sweep_dir()
        if self.resume:
            self._check_resume_state()   # before the console: a finished sweep shows its result, no progress
        with self.stop_signals:
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
            tune_events.register(key, self._view, functools.partial(plan.describe_trial, self.spec),
                                 self.spec.metrics[0])
        # A new list per tuner: Tune appends its own callbacks to the list it is given.
        def callbacks() -> list[Any]:
            return [tune_events.ViewCallback(key)] if self._view is not None else []

        parent: Optional[SweepParentRun] = None
        saved_env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
        try:
            trial_uri = self._trial_uri()
            if self._server is not None:  # the driver writes through the server too (proxied artifacts)
                os.environ.update(self._server.client_env())
                self.tracking_uri = trial_uri
            parent = self._parent_run()
            runtime_env = {"env_vars": self._trial_env()}
            with _secrets_hidden_from_children(self._secret_vars()):   # Ray's processes inherit the environment
                try:   # a local Ray on 127.0.0.1 only (--address: the user's cluster); SIGTERM stays ours
                    init_ray(self.address, log_to_driver=True, runtime_env=runtime_env,
                             **({} if self.address else {"num_cpus": self.num_cpus or os.cpu_count()}))
                except LocalRayError as exc:
                    raise SweepError(str(exc)) from None
            try:
                check_trials_fit(self._trial_configs())
            except PlacementError as exc:
                raise SweepError(str(exc)) from None
            meta = trial_meta(self.spec, self.base, self.base_path, self.sweep_dir, parent.run_id, trial_uri)
            trainable = tune.with_resources(tune.with_parameters(trial_fn, meta=meta,
                                                                 credentials=self._trial_credentials()),
                                            self._resources(meta))
            storage = tuners.tune_storage(self.sweep_dir)
            main_path = os.path.join(storage, self.spec.name)
            if self.resume and tune.Tuner.can_restore(main_path):
                tuner = tune.Tuner.restore(main_path, trainable, resume_unfinished=True, resume_errored=True)
            else:
                tuner = tuners.search_tuner(trainable, self.spec, self.sweep_dir, callbacks(), self._steps_per_trial())
            results = tuner.fit()
            parent.mark_pruned()
            if cut_short(results, plan.search_count(self.spec)):
                raise self._interrupted(parent)
            errors = _trial_errors(results)
            if plan.has_extra_trials(self.spec):
                extra_path = os.path.join(storage, tuners.extra_tuner_name(self.spec))
                if self.resume and tune.Tuner.can_restore(extra_path):
                    extra = tune.Tuner.restore(extra_path, trainable, resume_unfinished=True, resume_errored=True)
                    expected = None
                else:
                    pruned = set(prune.read_pruned(self.sweep_dir))   # a pruned trial is never the best one
                    best = plan.best_searched(self.spec, _trial_results(results), pruned)
                    entries = plan.extra_entries(self.spec, best)
                    expected = len(entries)
                    extra = tune.Tuner(trainable, **tuners.extra_tuner_kwargs(self.spec, entries, self.sweep_dir,
                                                                               callbacks()))
                extra_results = extra.fit()
                if cut_short(extra_results, expected):
                    raise self._interrupted(parent)
                errors += _trial_errors(extra_results)
            ray.shutdown()
            summary = {**parent.finish(self.spec, self.base, self.base_path), **self._where(parent.run_id)}
        except KeyboardInterrupt:  # Ctrl-C (SIGINT) anywhere: trials stop with Ray, then the runs are marked
            ray.shutdown()
            raise self._interrupted(parent) from None
        except (SweepInterrupted, SweepAlreadyFinished):
            raise
        except Exception:
            if self.stop_signals.received is not None:   # a KeyboardInterrupt inside Ray's C code: SystemError
                ray.shutdown()
                raise self._interrupted(parent) from None
            if parent is not None:   # the sweep cannot go on: its parent run says so (a --resume may continue)
                parent.mark_failed()
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

    def _interrupted(self, parent: Optional[SweepParentRun]) -> SweepInterrupted:
        """Mark the parent run and its unfinished child runs KILLED; the exception the CLI reports."""
        if parent is not None:
            parent.mark_killed()
        return SweepInterrupted.from_view(self._view, parent.run_id if parent else None, self.sweep_dir,
                                          self.stop_signals.signum)

    def _where(self, parent_run_id: str) -> dict[str, Any]:
        """Where a summary's sweep is: its parent run, folder and store."""
        return {"parent_run_id": parent_run_id, "sweep_dir": str(self.sweep_dir), "tracking_uri": self.store_uri}

    def finished_summary(self, parent_run_id: str) -> dict[str, Any]:
        """The summary of a finished sweep, read from the store; nothing is logged."""
        parent = SweepParentRun(self.store_uri, parent_run_id, self.sweep_dir)
        return {**parent.summary(self.spec, self.base, self.base_path), **self._where(parent_run_id),
                "errors": [], "trials_done": parent.trials_done(), "trials_planned": self.planned_trials()}
