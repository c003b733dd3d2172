"""vLLM's native NCCL weight transfer from a ZeRO-3 trainer to several engines: one gather per update.

Runs ``ulorl-bench native-sync``'s measurement (``ulorl.bench.native_sync.measure``) in a fresh
process: a one-rank DeepSpeed ZeRO-3 trainer on gloo pushes one update with
``rollout.weight_transfer=nccl`` to 4 recording engine actors (TP 2 each) through vLLM 0.32's own
trainer-side ``NCCLTrainerWeightTransferEngine``; only the NCCL endpoint and the packed broadcast are
replaced by recorders (the transport boundary). Before: one sender per engine, each walking two full
ZeRO-3 gathers (metadata, then the tensors) as CPU copies moved back to the device: 8 gathers for 4
engines. After: one NCCL group for every engine, metadata read locally, one gather, the gathered
tensors themselves handed to the broadcast.
"""

from __future__ import annotations

import json
import subprocess
import sys


def test_native_nccl_update_gathers_once_for_four_engines_without_host_copies():
    proc = subprocess.run([sys.executable, "-m", "ulorl.bench.native_sync", "--one", "4", "--tp", "2"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["gathers"] == 1.0 and r["gather_calls"] >= 3        # one pass over the model, bucket by bucket
    assert r["broadcast_rounds"] == 1                              # one broadcast reaches every engine
    assert r["broadcast_mb"] == r["model_mb"]
    assert r["copied_mb"] == 0 and r["device_moves_mb"] == 0 and r["to_copies_mb"] == 0
    engines = r["engine_records"]
    assert [e["rank_offset"] for e in engines] == [1, 3, 5, 7]      # TP 2 each: ranks 1-2, 3-4, 5-6, 7-8
    assert {e["world_size"] for e in engines} == {9}
    for e in engines:
        assert e["calls"] == {"init_weight_transfer_engine": 1, "start_weight_update": 1, "update_weights": 1,
                              "finish_weight_update": 1, "update_weight_version": 1}
        assert e["update_names"] == engines[0]["update_names"] > 0 and e["version"] == "1"
