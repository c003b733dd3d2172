"""``ulorl-sweep SWEEP.yaml`` — Ray Tune trials of the full trainer with Optuna search, tracked in MLflow."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from ulorl.jsonout import emit_json, json_command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ulorl-sweep",
        description=("Launch a sweep of full UloRL training trials (Ray Tune + Optuna); "
                     "every trial is an MLflow child run."),
        epilog=("Example: ulorl-sweep sweeps/mpt_threshold.yaml\n\n"
                "A spec with a `baseline:` also runs the baseline (outside the searcher) on seed offsets\n"
                "0..baseline.seeds-1 and re-runs the best trial on those other than 0; the output ranks the\n"
                "trials with held-out intervals, the paired difference vs the baseline on the same problems,\n"
                "the ulorl-train command of the best config, a verdict and the spec's epilogue lines; a\n"
                "reference with purpose: speedup (an S = 1 trial) adds the speedup\n"
                "of the trials' S against S = 1. The parent run keeps sweep/ranking.csv (columns: see\n"
                "platform/ulorl/docs/runs.md).\n\n"
                "The console shows one line per trial (a live table on a terminal; a line per state change in a\n"
                "pipe or file); everything Ray, Tune and the trials print goes to\n"
                "<output-dir>/sweeps/<name>/sweep.log.\n"
                "Ctrl-C (or SIGTERM) stops the sweep (exit 130, or 143; parent run KILLED), stops its tracking\n"
                "server and prints the --resume command; the tracking server never outlives the driver."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sweep", help="sweep spec YAML (see sweeps/)")
    p.add_argument("--tracking-uri", help="MLflow URI (else $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db)")
    p.add_argument("--address", help="join an existing Ray cluster (default: start Ray on 127.0.0.1)")
    p.add_argument("--output-dir", default="runs", help="where sweep state, trial checkpoints and Tune results go")
    p.add_argument("--resume", action="store_true", help="continue the last run of this sweep after the driver stopped")
    p.add_argument("--dry-run", action="store_true", help="validate and print the trials and their resources")
    p.add_argument("--num-cpus", type=int, help="CPUs for the local Ray (default: all)")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON object")
    p.add_argument("--seeds", metavar="OFFSETS",
                   help="seed offsets to run, e.g. 3-7 or 0,2 (replaces the spec's repeats / baseline seeds; add seeds "
                        "in chunks, each launch its own MLflow parent, the claims pair them by their seeds)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show Ray Tune's status tables and the trials' output on the console too (they always go "
                        "to sweep.log in the sweep's directory)")
    return p


def resume_command(args: argparse.Namespace) -> str:
    """The ``ulorl-sweep ... --resume`` command that continues this invocation's sweep."""
    import shlex

    parts = ["ulorl-sweep", args.sweep]
    for flag, value in (("--tracking-uri", args.tracking_uri), ("--address", args.address),
                        ("--output-dir", None if args.output_dir == "runs" else args.output_dir),
                        ("--num-cpus", args.num_cpus), ("--seeds", args.seeds)):
        if value is not None:
            parts += [flag, str(value)]
    return " ".join(shlex.quote(x) for x in parts + ["--resume"])


@json_command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from ulorl.quiet import quiet_libraries

    quiet_libraries()
    from ulorl.sweep.spec import SweepError, load_sweep, with_seed_offsets

    try:
        spec, base_path, base = load_sweep(args.sweep)
        if args.seeds is not None:
            spec = with_seed_offsets(spec, args.seeds)
        from ulorl.sweep.plan import missing_model_problem

        missing = missing_model_problem(spec, base, args.sweep, absolute_too=not args.address)
        if missing:   # dry run and start alike: a trial would fail at once, then be retried
            raise SweepError(missing)
        if args.num_cpus is not None and args.num_cpus < 1:
            raise SweepError(f"--num-cpus must be at least 1, got {args.num_cpus}; leave it out to give Ray every "
                             f"CPU of this machine ({os.cpu_count()})")
    except SweepError as exc:
        print(f"ulorl-sweep: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        from ulorl.config import config_from_dict
        from ulorl.rollout.engines import vllm_available
        from ulorl.sweep.launch import describe_trials

        _, _, base = load_sweep(args.sweep)
        trials = describe_trials(spec, base, base_path)
        print(f"sweep {spec.name}: base {base_path}, {len(trials)} trial(s), search {spec.search.algorithm}, "
              f"metric {spec.metric} ({spec.mode}), max concurrent {spec.max_concurrent}")
        if spec.baseline is not None:
            b = spec.baseline
            offs = spec.baseline_offsets
            reruns = [o for o in offs if o != 0]
            print(f"  + baseline {b.name} {json.dumps(b.overrides)} on seed offset(s) {','.join(map(str, offs))}"
                  + (f" and the best trial re-run on {','.join(map(str, reruns))}" if reruns else ""))
        for ref in spec.references:
            print(f"  + reference {ref.name} {json.dumps(ref.overrides)} (purpose {ref.purpose}) "
                  f"on {ref.seeds} seed offset(s)")
        from ulorl.cli.preflight_text import preflight_line
        from ulorl.config import apply_overrides

        for t in trials:
            print("  " + json.dumps(t, default=str))
            trial_cfg = config_from_dict(apply_overrides(base, {**spec.overrides, **t.get("overrides", {})}),
                                         str(base_path))
            print("    " + preflight_line(trial_cfg))
        if config_from_dict(base).rollout.engine == "vllm" and not vllm_available():
            print("note: rollout.engine=vllm needs the 'gpu' extra (pip install 'ulorl[gpu]'); trials would fail here")
        if args.json:  # the lines above went to stderr
            emit_json({"sweep": spec.name, "base": str(base_path), "search": spec.search.algorithm,
                       "metric": spec.metric, "mode": spec.mode, "max_concurrent": spec.max_concurrent,
                       "baseline": spec.baseline.model_dump() if spec.baseline else None, "trials": trials},
                      default=str)
        return 0
    from ulorl.cli.checks import tracking_uri_problem, uri_source
    from ulorl.sweep.launch import SweepAlreadyFinished, SweepInterrupted, SweepRunner
    from ulorl.sweep.summary_text import print_summary
    from ulorl.tracking import TrackingStoreError, resolve_tracking_uri

    problem = tracking_uri_problem(resolve_tracking_uri(args.tracking_uri), uri_source(args.tracking_uri))
    if problem:
        print(f"ulorl-sweep: {problem}", file=sys.stderr)
        return 2

    try:
        runner = SweepRunner(args.sweep, tracking_uri=args.tracking_uri, address=args.address,
                             output_dir=args.output_dir, resume=args.resume, num_cpus=args.num_cpus,
                             console=sys.stderr if args.json else sys.stdout, verbose=args.verbose,
                             seed_offsets=args.seeds)
        summary = runner.run()
    except (SweepError, FileNotFoundError, TrackingStoreError) as exc:
        print(f"ulorl-sweep: {exc}", file=sys.stderr)
        return 2
    except SweepInterrupted as exc:
        _report_interrupted(exc, args)
        return 128 + exc.signum   # 130 Ctrl-C, 143 SIGTERM
    except SweepAlreadyFinished as exc:
        summary = runner.finished_summary(exc.parent_run_id)
        print(f"ulorl-sweep: sweep {spec.name} already finished: {summary['trials_done']}/{summary['trials_planned']} "
              f"trials done (parent run {exc.parent_run_id}, {exc.sweep_dir}); nothing to resume, nothing logged "
              "again. Its result:")
        if args.json:
            emit_json(summary, default=str)
        else:
            print_summary(summary, spec)
        return 0
    if args.json:
        emit_json(summary, default=str)
    else:
        print_summary(summary, spec)
    if summary["errors"]:
        print(f"ulorl-sweep: {len(summary['errors'])} trial(s) failed for good:", file=sys.stderr)
        for e in summary["errors"]:
            print("  " + e.splitlines()[0], file=sys.stderr)
        return 1
    return 0


def _report_interrupted(exc: object, args: argparse.Namespace) -> None:
    """Which trials did not finish and how to continue; no ranking, no verdict."""
    unfinished = list(getattr(exc, "unfinished", []))
    not_started = int(getattr(exc, "not_started", 0))
    out = sys.stderr
    print(f"ulorl-sweep: interrupted; the parent run {getattr(exc, 'parent_run_id', None)} is marked KILLED "
          "and no verdict is given.", file=out)
    print(f"unfinished trials ({len(unfinished)} started"
          + (f", {not_started} not started yet" if not_started else "") + "):", file=out)
    for line in unfinished:
        print("  " + line, file=out)
    print(f"continue with:\n  {resume_command(args)}", file=out)


if __name__ == "__main__":
    raise SystemExit(main())
