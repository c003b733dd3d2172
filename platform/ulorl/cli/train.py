"""``ulorl-train EXPERIMENT.yaml [key.path=value ...]`` — one UloRL training run."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from ulorl.config import ConfigError, config_to_yaml, load_experiment


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ulorl-train",
        description="Train a policy with UloRL (segment rollout, POIS/SAIS/TOIS, DMMPTs) and track it in MLflow.",
        epilog="Example: ulorl-train experiments/quickstart.yaml train.max_steps=20 algo.mpt.tau=0.95",
    )
    p.add_argument("experiment", nargs="?", help="experiment YAML (see experiments/)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.segments=8 tracking.uri=sqlite:///x.db")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (else tracking.uri, $MLFLOW_TRACKING_URI, ./mlflow.db)")
    p.add_argument("--resume", nargs="?", const="auto", metavar="RUN_DIR",
                   help="continue a stopped run from its latest checkpoint (RUN_DIR, or newest run of this "
                   "experiment), or from one of its checkpoints (RUN_DIR/checkpoints/step_N: newer ones set aside)")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept algorithm / rollout / model / data settings that differ from the "
                   "checkpoint's (refused by default, naming each changed key)")
    p.add_argument("--run-dir", help="where checkpoints go (default: train.output_dir/<name>/<timestamp>)")
    p.add_argument("--explain", nargs="?", const="", metavar="KEY",
                   help="print the documented config schema (type, default, range, description) of a section "
                   "(algo, algo.mpt, ...) or a key (algo.mpt.tau); no KEY = every key; needs no experiment")
    p.add_argument("--dry-run", action="store_true", help="validate, print the resolved config and plan, start nothing")
    p.add_argument("--ray", action="store_true", help="run inside a Ray placement group (trainer workers + engine)")
    p.add_argument("--address", help="Ray cluster address for --ray (default: a local Ray on 127.0.0.1)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (default: a bar with step, reward, entropy, masked fraction and time "
                        "per step on a terminal, one line per step elsewhere)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)
    if args.explain is not None:
        from ulorl.config_doc import explain

        try:
            print(explain(args.explain or None))
        except KeyError as exc:
            print(f"ulorl-train: {exc.args[0]}", file=sys.stderr)
            return 2
        return 0
    if args.experiment is None:
        parser.error("the following arguments are required: experiment")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from ulorl.quiet import quiet_libraries

    quiet_libraries()
    try:
        cfg = load_experiment(args.experiment, args.overrides)
    except ConfigError as exc:
        print(f"ulorl-train: {exc}", file=sys.stderr)
        return 2
    from ulorl.cli.checks import tracking_uri_problem, uri_source
    from ulorl.models.loading import ModelLoadError
    from ulorl.tracking import require_store_folder, resolve_tracking_uri

    try:  # before any work, --ray and --dry-run included: a URI MLflow cannot open, a missing or read-only store
        uri = resolve_tracking_uri(args.tracking_uri, cfg.tracking.uri)
        problem = tracking_uri_problem(uri, uri_source(args.tracking_uri, cfg.tracking.uri))
        if problem:
            raise ValueError(problem)
        require_store_folder(uri)
        if args.dry_run and not args.address:   # what the run checks before a model loads (not a cluster's paths)
            from ulorl.train.run_inputs import check_run_inputs

            check_run_inputs(cfg)
    except (FileNotFoundError, ValueError, ModelLoadError) as exc:
        print(f"ulorl-train: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        from ulorl.cli.plan import describe_plan
        from ulorl.cli.preflight_text import describe_preflight

        print(config_to_yaml(cfg))
        print(describe_preflight(cfg))   # before the plan: "# plan" stays the last section, JSON to the end
        print(describe_plan(cfg))
        return 0
    if args.ray:
        from ulorl.scale.placement import run_with_placement
        from ulorl.sweep.server import MlflowServer

        # MlflowServer: serves a local store to a trainer rank 0 placed on another node
        return run_with_placement(cfg, args, store_server=MlflowServer, again=lambda where: run_again(args, where))
    from ulorl.rollout.engines import MissingExtraError
    from ulorl.tracking.provenance import spec_tags
    from ulorl.train.checkpoint import CheckpointSpaceError, CorruptCheckpointError
    from ulorl.train.trainer import Trainer

    try:
        result = Trainer(
            cfg, run_dir=args.run_dir, resume=args.resume, tracking_uri=args.tracking_uri,
            progress=not args.no_progress, allow_config_change=args.allow_config_change,
            extra_tags=spec_tags(args.experiment),
        ).run()
    except CorruptCheckpointError as exc:
        again = run_again(args, {"--resume": str(exc.previous)} if exc.previous else {})
        print(f"ulorl-train: {exc}:\n  {again}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ConfigError, ValueError, ModelLoadError) as exc:
        print(f"ulorl-train: {exc}", file=sys.stderr)
        return 2
    except CheckpointSpaceError as exc:
        run_dir = str(exc.root.parent)   # no checkpoint yet: the same folder (and MLflow run) again
        again = run_again(args, {"--resume": run_dir} if exc.kept else {"--run-dir": run_dir})
        print(f"ulorl-train: {exc}:\n  {again}", file=sys.stderr)
        return 1
    except MissingExtraError as exc:
        print(f"ulorl-train: {exc}", file=sys.stderr)
        return 2
    from ulorl.train.distributed import shutdown_process_group

    shutdown_process_group()   # a multi-rank run: every rank got here (the run ended on all of them)
    # stopped by a signal: the shell's convention, 128 + its number (130 Ctrl-C, 143 SIGTERM)
    code = 128 + (result.stop_signal or signal.SIGINT) if result.interrupted else 0
    if os.environ.get("RANK", "0") != "0":
        return code  # only rank 0 reports
    if result.interrupted:
        print(f"run {result.run_id} interrupted after {result.steps} steps (checkpoint saved); continue with:\n"
              f"  {run_again(args, {'--resume': str(result.run_dir)})}")
    else:
        print(f"run {result.run_id} finished after {result.steps} steps")
    print(f"  tracking: {result.tracking_uri}")
    print(f"  checkpoints: {result.run_dir / 'checkpoints'}")
    return code


def run_again(args: argparse.Namespace, where: dict[str, str]) -> str:
    """The ``ulorl-train`` command of this invocation with its experiment, overrides and flags, with
    ``where`` (``--resume RUN_DIR`` or ``--run-dir RUN_DIR``) in place of the run it named: pasted as
    printed it continues the same run (without the overrides a resume is refused as a changed config)."""
    from ulorl.cli.checks import resume_command

    flags: dict[str, str | None] = {
        "--tracking-uri": args.tracking_uri,
        "--allow-config-change": "" if args.allow_config_change else None,
        "--ray": "" if args.ray else None,
        "--address": args.address,
    }
    flags.update({"--resume": None, "--run-dir": None, **where})
    return resume_command("ulorl-train", [args.experiment, *args.overrides], flags)


if __name__ == "__main__":
    raise SystemExit(main())
