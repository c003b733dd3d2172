"""Fetch the wheels ``gpu_check`` needs on a GPU machine that has only torch + transformers and no network.

    python -m ulorl.bench.gpu_wheels --dest wheels/            # cp312 manylinux x86_64, every version pinned
    # on the GPU machine (torch 2.11 + transformers 5.17, Python 3.12, no network):
    pip install --no-index --no-deps wheels/*.whl
    PYTHONPATH=platform python -m ulorl.bench.gpu_check --out gpu_check.json --allow-missing vllm,vllm_moe,ray

``CARRY`` pins every distribution those stages import beyond what torch 2.11 and transformers 5.17
install (resolved once with pip's resolver for cp312 against ``torch==2.11.0 transformers==5.17.0``
and the packages below; nothing is resolved at fetch time: each wheel is downloaded with
``--no-deps``, so the set cannot drift). DeepSpeed is published as a source distribution only
(``pip download --only-binary`` silently picks an ancient version that shipped a wheel), so its
wheel is built here from the pinned sdist (``pip wheel --no-deps``, no ops compiled: a pure
``py3-none-any`` wheel). Ray (79 MB) and vLLM (needs its own torch) are left out: the prepared
command passes ``--allow-missing vllm,vllm_moe,ray``. The total must stay under ``--max-mib`` (64).

pydantic and its three helpers are carried although some transformers installs bring them: a
machine that lacks them fails every stage that reads a ulorl config.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DEEPSPEED = "deepspeed==0.19.8"
#: distribution==version of every wheel carried besides DeepSpeed (its dependencies, MLflow's skinny
#: client with the SQLAlchemy store the trainer stage writes to, math-verify for its rewards)
CARRY: tuple[str, ...] = (
    # DeepSpeed 0.19.8's requirements beyond torch / numpy / packaging / tqdm
    "einops==0.8.2", "hjson==3.1.0", "msgpack==1.2.4", "ninja==1.13.2", "psutil==7.2.2", "py-cpuinfo==9.0.0",
    # ulorl.config
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
    # MLflow tracking client and its SQLite store
    "mlflow-skinny==3.17.2", "sqlalchemy==2.1.9", "alembic==1.20.1", "mako==1.4.3",
    "cachetools==7.3.3", "cloudpickle==3.1.3", "databricks-sdk==0.162.0", "fastapi==0.165.0", "starlette==1.10.0",
    "uvicorn==0.54.0", "gitpython==3.2.1", "gitdb==4.0.12", "smmap==5.0.3", "importlib-metadata==9.1.0",
    "zipp==4.1.2", "opentelemetry-api==1.45.2", "opentelemetry-proto==1.45.2", "opentelemetry-sdk==1.45.2",
    "opentelemetry-semantic-conventions==0.66b2", "protobuf==7.36.2", "python-dotenv==1.2.4", "sqlparse==0.6.1",
    "requests==2.34.2", "urllib3==2.8.0", "charset-normalizer==3.5.3", "google-auth==2.63.0", "pyasn1==0.6.5",
    "pyasn1-modules==0.4.2", "cryptography==50.0.2", "cffi==2.1.1", "pycparser==3.12",
    # rewards (math answers)
    "math-verify==0.9.0", "latex2sympy2-extended==1.11.0", "antlr4-python3-runtime==4.13.2",
)
#: what the target machine has (torch 2.11's and transformers 5.17's own requirements) and is not carried
TARGET_BASE: tuple[str, ...] = ("torch==2.11.0", "transformers==5.17.0")
MANYLINUX_X86_64: tuple[str, ...] = (
    "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_12_x86_64",
    "manylinux2010_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64", "linux_x86_64",
)
MIB = 2**20


def download_command(dest: Path, python_version: str, pins: tuple[str, ...] = CARRY) -> list[str]:
    """``pip download`` of exactly ``pins`` (no dependency resolution) as wheels for CPython ``python_version``
    on manylinux x86_64."""
    abi = "cp" + python_version.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
           "--python-version", python_version, "--implementation", "cp", "--abi", abi, "--abi", "abi3",
           "--abi", "none"]
    for plat in MANYLINUX_X86_64:
        cmd += ["--platform", plat]
    return [*cmd, *pins]


def build_deepspeed_command(dest: Path, pin: str = DEEPSPEED) -> list[str]:
    """``pip wheel`` of DeepSpeed's pinned sdist (the only form it is published in)."""
    # --no-cache-dir: really build it (pip would otherwise reuse a wheel it built earlier)
    return [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-binary", "deepspeed", "--no-cache-dir",
            "--wheel-dir", str(dest), pin]


def _dist_name(filename: str) -> str:
    return filename.split("-")[0].lower().replace("_", "-").replace(".", "-")


def _pin_name(pin: str) -> str:
    return pin.split("==")[0].lower().replace("_", "-").replace(".", "-")


def check_wheels(dest: Path, pins: tuple[str, ...], max_mib: float) -> list[dict[str, object]]:
    """One wheel per pin at its version, the total under ``max_mib``; the files with sizes and sha256."""
    wheels = sorted(dest.glob("*.whl"))
    by_name: dict[str, list[Path]] = {}
    for w in wheels:
        by_name.setdefault(_dist_name(w.name), []).append(w)
    problems = []
    for pin in pins:
        name, version = _pin_name(pin), pin.split("==")[1]
        got = by_name.get(name, [])
        if len(got) != 1 or f"-{version}-" not in got[0].name:
            problems.append(f"{pin}: found {[g.name for g in got] or 'no wheel'}")
    extra = sorted(set(by_name) - {_pin_name(p) for p in pins})
    if extra:
        problems.append(f"wheels not pinned here: {extra}")
    files = [{"file": w.name, "bytes": w.stat().st_size, "sha256": hashlib.sha256(w.read_bytes()).hexdigest()}
             for w in wheels]
    total = sum(int(str(f["bytes"])) for f in files)
    if total > max_mib * MIB:
        problems.append(f"total {total / MIB:.1f} MiB over the {max_mib:g} MiB that can be carried")
    if problems:
        raise RuntimeError(f"wheels in {dest} do not match the pins:\n  " + "\n  ".join(problems))
    return files


def fetch(dest: Path, python_version: str = "3.12", max_mib: float = 64.0) -> list[dict[str, object]]:
    """Download the pinned wheels and build DeepSpeed's into ``dest``; checked (``check_wheels``)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(download_command(dest, python_version), check=True)
    with tempfile.TemporaryDirectory(prefix="ulorl-ds-wheel-") as tmp:
        # DS_BUILD_OPS=0: no CUDA / C++ op is compiled at build time (ops build on first use, and the
        # trainer uses torch's AdamW), so the wheel is pure Python and fits any CPython 3
        env = {**os.environ, "DS_BUILD_OPS": "0"}
        subprocess.run(build_deepspeed_command(Path(tmp)), check=True, env=env)
        built = sorted(Path(tmp).glob("deepspeed-*.whl"))
        if len(built) != 1 or not built[0].name.endswith("-py3-none-any.whl"):
            raise RuntimeError(f"DeepSpeed build gave {[b.name for b in built]}, expected one py3-none-any wheel")
        target = dest / built[0].name
        target.write_bytes(built[0].read_bytes())
    files = check_wheels(dest, (*CARRY, DEEPSPEED), max_mib)
    (dest / "wheels.json").write_text(json.dumps({"python": python_version, "target_base": list(TARGET_BASE),
                                                  "pins": [*CARRY, DEEPSPEED], "files": files}, indent=1))
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ulorl.bench.gpu_wheels", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[1:]))
    ap.add_argument("--dest", type=Path, required=True, help="folder for the wheels (+ wheels.json)")
    ap.add_argument("--python-version", default="3.12", help="CPython of the GPU machine (3.12)")
    ap.add_argument("--max-mib", type=float, default=64.0, help="refuse a set larger than this (MiB)")
    a = ap.parse_args(argv)
    files = fetch(a.dest, a.python_version, a.max_mib)
    for f in files:
        print(f"{int(str(f['bytes'])) / MIB:8.2f} MiB  {f['file']}")
    total = sum(int(str(f["bytes"])) for f in files)
    print(f"{total / MIB:8.2f} MiB  total, {len(files)} wheels in {a.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
