"""``ulorl-bench``'s tool subcommands: each hands its arguments to the tool in ``ulorl.bench``, the
distributed ones build a ``torch.distributed.run`` command line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ulorl.bench.traffic
from ulorl.cli.bench import DISTRIBUTED_TOOLS, TOOLS, build_parser, distributed_command, main


def test_every_tool_subcommand_names_an_importable_bench_module_and_shows_in_help(capsys):
    import importlib

    for name, (module, _) in TOOLS.items():
        assert module.startswith("ulorl.bench.") and callable(importlib.import_module(module).main), name
    for name, (module, _, _) in DISTRIBUTED_TOOLS.items():
        assert module.startswith("ulorl.bench.") and importlib.util.find_spec(module) is not None, name
    build_parser().print_help()
    shown = capsys.readouterr().out
    for name in [*TOOLS, *DISTRIBUTED_TOOLS, "rollout", "memory", "verifier", "weight-sync", "zero3-memory"]:
        assert name in shown


def test_gpu_check_subcommand_runs_the_gpu_check_with_its_arguments(capsys):
    # the same refusal as ``python -m ulorl.bench.gpu_check --allow-missing nope`` (exit 2, named stage)
    with pytest.raises(SystemExit) as exc:
        main(["gpu-check", "--device", "cpu", "--allow-missing", "nope"])
    assert exc.value.code == 2
    assert "unknown stage(s) ['nope']" in capsys.readouterr().err


def test_distributed_subcommands_build_the_launcher_command():
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    assert distributed_command("sp-memory", ["--seq-len", "512"]) == [
        *launcher, "--nproc_per_node=2", "-m", "ulorl.bench.sp", "--seq-len", "512"]
    # traffic runs by file path (so it can measure another checkout on PYTHONPATH)
    cmd = distributed_command("traffic", ["--out", "t.json", "--nproc", "3"])
    assert cmd == [*launcher, "--nproc_per_node=3", str(Path(ulorl.bench.traffic.__file__)), "--out", "t.json"]
    assert Path(cmd[5]).is_file()


def test_distributed_subcommand_refuses_zero_ranks(capsys):
    assert main(["sp-memory", "--nproc", "0"]) == 2
    assert "--nproc: expected >= 1, got 0" in capsys.readouterr().err
