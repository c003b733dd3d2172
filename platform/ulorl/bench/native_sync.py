"""``ulorl-bench native-sync``: ZeRO-3 gathers, copies and broadcast bytes of ONE native NCCL weight update.

    ulorl-bench native-sync --engines 1,4            # vLLM side venv (vLLM's trainer-side code is used)
    ulorl-bench native-sync --engines 1,4 --json

What runs (CPU, gloo, one process per engine count): a one-rank DeepSpeed ZeRO-3 trainer
(``DeepSpeedBackend``, no rollout copy, export buckets of ``--bucket-mb``) holding a Qwen3-shaped
policy, ``--engines`` Ray engine actors that speak vLLM's weight-sync protocol but only record what
they are asked (``RecordingEngine``: no vLLM engine, no NCCL), and the trainer's real weight push:
``push_weights(RemoteEngine(actors), backend, 1)`` with ``rollout.weight_transfer=nccl``, through vLLM
0.32's own trainer-side ``NCCLTrainerWeightTransferEngine``. The fake is at the transport boundary
only: vLLM's ``open_trainer_endpoint`` (the NCCL communicator) and ``packed_nccl_broadcast_producer``
(the packed broadcast) are replaced by recorders that consume exactly what vLLM hands them.

Counted per update:

- ``gathers``: full ZeRO-3 gather passes over the model (bytes gathered by ``GatheredParameters`` /
  model bytes) and ``gather_calls`` (buckets gathered);
- ``copied_mb``: bytes of tensors reaching the broadcast that are NOT the gathered parameters'
  own storage (each one a device -> host copy on a GPU trainer), ``device_moves_mb``: bytes moved to
  a CUDA device on the way (``Tensor.to("cuda")``; on this CPU machine counted and done as a copy),
  ``to_copies_mb``: every other copy ``Tensor.to`` made during the update (``.to("cpu", copy=True)``
  of gathered parameters, read or not by the broadcast: a device -> host copy each on a GPU);
- ``broadcast_rounds`` / ``broadcast_mb``: calls of the packed broadcast and bytes handed to it
  (one NCCL group reaching every engine is one round);
- per engine: its ``rank_offset`` / ``world_size`` in the NCCL group and the update RPCs it got.

Nothing here needs a GPU; what it cannot show is NCCL itself (platform/ulorl/docs/scale.md says what ran where).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any, Optional, cast

MB = 1 << 20


class RecordingEngine:
    """A Ray engine actor that answers ``RemoteEngine`` and vLLM's weight-sync protocol (the methods
    ``EngineActor`` exposes) and records the calls; it holds no model."""

    def __init__(self, tensor_parallel_size: int, model_dir: str) -> None:
        self.tp = tensor_parallel_size
        self.model_dir = model_dir
        self.calls: dict[str, int] = {}
        self.init_info: dict[str, Any] = {}
        self.update_names = 0
        self.version: Optional[str] = None

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def describe(self) -> dict[str, Any]:
        return {"policy_version": 0, "updates": 0, "updating": False, "max_model_len": None, "colocate": False,
                "weight_transfer": "nccl", "tensor_parallel_size": self.tp, "model": self.model_dir}

    def init_weight_transfer_engine(self, request: Any) -> None:
        self._count("init_weight_transfer_engine")
        self.init_info = dict(request.init_info)

    def start_weight_update(self) -> None:
        self._count("start_weight_update")

    def update_weights(self, request: Any, version: Optional[int] = None) -> None:
        self._count("update_weights")
        self.update_names += len(request.update_info["names"])

    def finish_weight_update(self) -> None:
        self._count("finish_weight_update")

    def update_weight_version(self, version: str) -> None:
        self._count("update_weight_version")
        self.version = version

    def record(self) -> dict[str, Any]:
        return {"calls": self.calls, "rank_offset": self.init_info.get("rank_offset"),
                "world_size": self.init_info.get("world_size"), "update_names": self.update_names,
                "version": self.version}


class _Counters:
    """What the patched transport boundary and ZeRO-3's gathers saw."""

    def __init__(self) -> None:
        self.gathered_bytes = 0
        self.gather_calls = 0
        self.gathered_storages: set[int] = set()
        self.rounds = 0
        self.broadcast_bytes = 0
        self.broadcast_tensors = 0
        self.copied_bytes = 0
        self.device_move_bytes = 0
        self.to_copy_bytes = 0


def _storage(t: Any) -> int:
    return int(t.untyped_storage().data_ptr())


def _patch(counters: _Counters) -> None:
    """Instrument ZeRO-3 gathers and replace vLLM's NCCL endpoint and packed broadcast by recorders."""
    import torch
    from deepspeed.runtime.zero.partition_parameters import GatheredParameters
    from vllm.distributed.weight_transfer import nccl_engine

    enter = GatheredParameters.__enter__

    def counted_enter(self: Any) -> Any:
        out = enter(self)
        params = [p for p in (getattr(self, "params", None) or []) if hasattr(p, "ds_id")]
        counters.gather_calls += 1
        for p in params:
            counters.gathered_bytes += int(p.ds_numel) * p.element_size()
            counters.gathered_storages.add(_storage(p.data))
        return out

    GatheredParameters.__enter__ = counted_enter

    class _Group:
        def destroy(self) -> None:
            pass

    def producer(iterator: Any, group: Any, src: int, post_iter_func: Any, buffer_size_bytes: int = 0,
                 num_buffers: int = 0) -> None:
        counters.rounds += 1
        for item in iterator:
            t = post_iter_func(item)
            n = t.numel() * t.element_size()
            counters.broadcast_bytes += n
            counters.broadcast_tensors += 1
            if _storage(t) not in counters.gathered_storages:
                counters.copied_bytes += n

    nccl_engine.open_trainer_endpoint = lambda *a, **k: _Group()
    nccl_engine.packed_nccl_broadcast_producer = producer

    # a sender that moves tensors to "the trainer's GPU": counted, and done as a CPU copy here
    original_to = torch.Tensor.to

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda":
            counters.device_move_bytes += self.numel() * self.element_size()
            return self.clone()
        out = original_to(self, *args, **kwargs)
        if out.numel() and _storage(out) != _storage(self):
            counters.to_copy_bytes += out.numel() * out.element_size()
        return out

    torch.Tensor.to = to   # type: ignore[method-assign]
    torch.cuda.current_device = lambda: 0


def _policy(vocab: int, hidden: int, layers: int) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    heads = max(1, hidden // 64)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=hidden // heads,
                      max_position_embeddings=256, tie_word_embeddings=False)
    return Qwen3ForCausalLM(cfg)


def measure(engines: int, *, tensor_parallel_size: int = 1, vocab: int = 4096, hidden: int = 256, layers: int = 2,
            bucket_mb: float = 4.0) -> dict[str, Any]:
    """One native weight update to ``engines`` recording actors (module docstring); in this process."""
    import ray

    from ulorl.config import config_from_dict
    from ulorl.rollout.weight_sync import push_weights
    from ulorl.scale.local_ray import init_ray
    from ulorl.scale.placement import RemoteEngine
    from ulorl.train.deepspeed_backend import DeepSpeedBackend, full_nbytes
    from ulorl.train.distributed import ensure_process_group, shutdown_process_group

    counters = _Counters()
    model = _policy(vocab, hidden, layers)
    model_dir = tempfile.mkdtemp(prefix="ulorl-native-sync-")
    model.config.save_pretrained(model_dir)
    train = config_from_dict({"train": {"backend": "deepspeed", "deepspeed": {"zero_stage": 3}}}).train
    ensure_process_group("cpu")
    backend = DeepSpeedBackend(model, train, rollout_copy=False)
    backend.export_bucket_bytes = int(bucket_mb * MB)
    model_bytes = sum(full_nbytes(p) for p in backend.module.parameters())
    _patch(counters)
    init_ray(None, num_cpus=1, log_to_driver=False)   # on 127.0.0.1 only
    try:
        actor = ray.remote(RecordingEngine).options(num_cpus=0)
        handles = [actor.remote(tensor_parallel_size, model_dir) for _ in range(engines)]
        remote = RemoteEngine(handles, eos_token_id=1, bucket_mb=bucket_mb)
        push_weights(remote, backend, 1)
        records = ray.get([cast(Any, h).record.remote() for h in handles])
    finally:
        ray.shutdown()
        shutdown_process_group()
    return {
        "engines": engines,
        "tensor_parallel_size": tensor_parallel_size,
        "model_mb": round(model_bytes / MB, 2),
        "gathers": round(counters.gathered_bytes / model_bytes, 3),
        "gather_calls": counters.gather_calls,
        "gathered_mb": round(counters.gathered_bytes / MB, 2),
        "copied_mb": round(counters.copied_bytes / MB, 2),
        "device_moves_mb": round(counters.device_move_bytes / MB, 2),
        "to_copies_mb": round(counters.to_copy_bytes / MB, 2),
        "broadcast_rounds": counters.rounds,
        "broadcast_mb": round(counters.broadcast_bytes / MB, 2),
        "broadcast_tensors": counters.broadcast_tensors,
        "engine_records": records,
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'engines':>7} {'model_MB':>8} {'gathers':>7} {'gathered_MB':>11} {'copied_MB':>9} "
            f"{'to_device_MB':>12} {'to_copies_MB':>12} {'bcast_rounds':>12} {'bcast_MB':>8}  "
            "per engine (rank_offset/world, update RPCs)")
    lines = [head]
    for r in rows:
        per = ", ".join(f"{e['rank_offset']}/{e['world_size']} x{e['calls'].get('update_weights', 0)}"
                        for e in r["engine_records"])
        lines.append(f"{r['engines']:>7} {r['model_mb']:>8} {r['gathers']:>7} {r['gathered_mb']:>11} "
                     f"{r['copied_mb']:>9} {r['device_moves_mb']:>12} {r['to_copies_mb']:>12} "
                     f"{r['broadcast_rounds']:>12} "
                     f"{r['broadcast_mb']:>8}  {per}")
    return "\n".join(lines)


def _one(args: argparse.Namespace, engines: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "ulorl.bench.native_sync", "--one", str(engines), "--tp", str(args.tp),
           "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--layers", str(args.layers),
           "--bucket-mb", str(args.bucket_mb)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        raise RuntimeError(f"native-sync with {engines} engine(s) failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="ulorl-bench native-sync", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--engines", default="1,4", help="engine counts, comma-separated (one process each)")
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size each recording engine reports")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=4.0, help="ZeRO-3 export / packed buffer size (MiB)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one, tensor_parallel_size=args.tp, vocab=args.vocab, hidden=args.hidden,
                                 layers=args.layers, bucket_mb=args.bucket_mb)))
        return 0
    rows = [_one(args, int(n)) for n in args.engines.split(",") if n.strip()]
    if args.json:
        from ulorl.jsonout import emit_json

        emit_json({"results": rows})
    else:
        print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
