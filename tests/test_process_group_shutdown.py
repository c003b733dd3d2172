"""``shutdown_process_group`` tears a DeepSpeed-made process group down through DeepSpeed.

``deepspeed.comm`` re-exports ``deepspeed.comm.comm`` with ``from .comm import *``, so its ``cdb`` is
the ``None`` copied at import; only ``deepspeed.comm.comm.cdb`` holds the live backend. Reading the
copy sent every rank down the plain ``torch.distributed`` branch, which leaves DeepSpeed's cached
group references (here: the clone of the world group ZeRO uses) pointing at destroyed groups.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json
from ulorl.train.distributed import ensure_process_group, shutdown_process_group
import deepspeed.comm as ds_comm_reexport
import deepspeed.comm.comm as ds_comm_impl
from deepspeed.utils import groups

ensure_process_group("cpu")
groups._clone_world_group()          # what ZeRO does: DeepSpeed keeps a clone of the world group
out = {"reexport_cdb_is_none": ds_comm_reexport.cdb is None,
       "impl_cdb_live": ds_comm_impl.cdb is not None and ds_comm_impl.cdb.is_initialized(),
       "world_clone_before": groups._WORLD_GROUP is not None}
shutdown_process_group()
import torch.distributed as td
out["torch_group_down"] = not td.is_initialized()
out["world_clone_after"] = groups._WORLD_GROUP is not None
print(json.dumps(out))
"""


def test_shutdown_takes_deepspeeds_branch_and_drops_its_cached_groups():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["reexport_cdb_is_none"]        # the finding: the re-exported name never sees the backend
    assert out["impl_cdb_live"] and out["world_clone_before"]
    assert out["torch_group_down"]
    assert not out["world_clone_after"]       # DeepSpeed's own teardown released its clone of the world


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
