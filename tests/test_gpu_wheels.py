"""``python -m ulorl.bench.gpu_wheels``: exact pins, no dependency resolution, DeepSpeed built from its
sdist, and the check of what landed in the folder (one wheel per pin, nothing else, the size cap)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.bench.gpu_wheels import CARRY, DEEPSPEED, build_deepspeed_command, check_wheels, download_command


def test_every_carried_wheel_is_pinned_and_fetched_without_resolution(tmp_path):
    assert all(p.count("==") == 1 and p.split("==")[1] for p in (*CARRY, DEEPSPEED))
    cmd = download_command(tmp_path, "3.12")
    assert "--no-deps" in cmd and "--only-binary=:all:" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and cmd[cmd.index("--abi") + 1] == "cp312"
    assert cmd[-len(CARRY):] == list(CARRY)
    assert not any(p.split("==")[0] in ("torch", "transformers", "ray", "vllm") for p in CARRY)
    build = build_deepspeed_command(tmp_path)
    assert build[build.index("wheel") + 1:].count("--no-deps") == 1 and "--no-binary" in build
    assert build[-1] == DEEPSPEED == "deepspeed==0.19.8"


def _wheel(folder: Path, name: str, size: int = 10) -> None:
    (folder / name).write_bytes(b"x" * size)


def test_check_wheels_names_what_is_missing_extra_or_too_big(tmp_path):
    pins = ("py-cpuinfo==9.0.0", "sqlalchemy==2.1.9")
    _wheel(tmp_path, "py_cpuinfo-9.0.0-py3-none-any.whl")
    with pytest.raises(RuntimeError, match=r"sqlalchemy==2.1.9: found no wheel"):
        check_wheels(tmp_path, pins, 64)
    _wheel(tmp_path, "sqlalchemy-2.1.8-cp312-cp312-manylinux_2_17_x86_64.whl")
    with pytest.raises(RuntimeError, match=r"sqlalchemy==2.1.9: found \['sqlalchemy-2.1.8"):
        check_wheels(tmp_path, pins, 64)
    (tmp_path / "sqlalchemy-2.1.8-cp312-cp312-manylinux_2_17_x86_64.whl").unlink()
    _wheel(tmp_path, "sqlalchemy-2.1.9-cp312-cp312-manylinux_2_17_x86_64.whl", size=2**20)
    files = check_wheels(tmp_path, pins, 64)
    assert [f["file"] for f in files] == ["py_cpuinfo-9.0.0-py3-none-any.whl",
                                          "sqlalchemy-2.1.9-cp312-cp312-manylinux_2_17_x86_64.whl"]
    assert files[1]["bytes"] == 2**20 and len(str(files[1]["sha256"])) == 64
    with pytest.raises(RuntimeError, match="over the 0.5 MiB"):
        check_wheels(tmp_path, pins, 0.5)
    _wheel(tmp_path, "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl")
    with pytest.raises(RuntimeError, match=r"wheels not pinned here: \['ray'\]"):
        check_wheels(tmp_path, pins, 64)
