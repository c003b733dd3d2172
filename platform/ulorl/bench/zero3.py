"""``ulorl-bench zero3-memory``: per-rank parameter memory of a ZeRO-3 trainer, partitioned load vs full load.

    ulorl-bench zero3-memory --size-mb 64 --ranks 2        # CPU, gloo, DeepSpeed ZeRO-3
    ulorl-bench zero3-memory --count-gathers --before ../other-checkout   # collectives per micro-step

``--count-gathers`` counts ZeRO-3's all-gathers / reduce-scatters (and bytes) per training
micro-step instead, for this checkout and optionally another one side by side
(``ulorl.bench.zero3_gathers``).

A Qwen3 model of about ``--size-mb`` MiB (float32, random weights, built from a config) is saved to
a temp dir; then, once per path, ``--ranks`` processes under ``torch.distributed.run`` load it as
the trainer does and build the ZeRO-3 ``DeepSpeedBackend``:

* ``partitioned``: ``load_train_model`` (created under ``deepspeed.zero.Init`` while loading) and
  ``rollout_copy=False`` (engines in other processes: rank 0 keeps no full copy);
* ``full``: every rank ``from_pretrained``s the whole model, ``deepspeed.initialize`` partitions it,
  rank 0 keeps a full rollout copy (the behaviour before the partitioned load).

Per rank: local parameter bytes after load and after init (sum of ``ds_tensor`` partitions, or
full tensors), the rollout copy's bytes, VmRSS after init, and the peak extra VmRSS (sampled from
``/proc/self/status``) during the load, during load + ``deepspeed.initialize`` (a whole model
read from safetensors is file-mapped and enters VmRSS only when touched), and during one export of
the weights for an engine (``named_weights_for_rollout``: gathered per bucket of ``--bucket-mb``;
rank 0 consumes each tensor and drops it, as a streaming engine does; the other ranks follow in ``worker_loop``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ulorl.bench.weight_sync import PeakSampler, rss_bytes
from ulorl.bench.zero3_gathers import add_arguments as add_gather_arguments
from ulorl.bench.zero3_gathers import format_counts, run_gather_counts
from ulorl.config import ExperimentConfig, config_from_dict
from ulorl.jsonout import emit_json
from ulorl.train.deepspeed_backend import (
    DeepSpeedBackend,
    full_nbytes,
    local_partition_bytes,
)
from ulorl.train.distributed import ensure_process_group, shutdown_process_group
from ulorl.train.worker import load_model, load_train_model, pad_token_id, worker_loop

PATHS = ("partitioned", "full")
MIB = 2**20
DEFAULT_MMAP_THRESHOLD_MB = 1.0


def model_spec_for(size_mb: float) -> dict[str, int]:
    """Qwen3 architecture fields giving about ``size_mb`` MiB of float32 parameters (hidden 512:
    ~3.9 M parameters = 15 MiB per layer, at least one layer)."""
    hidden, inter = 512, 2048
    per_layer = 4 * (2 * hidden * hidden + 2 * hidden * hidden // 2 + 3 * hidden * inter)
    layers = max(1, round(size_mb * MIB / per_layer))
    return {"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": 8, "num_key_value_heads": 4}


def build_model_dir(size_mb: float, out: Path, seed: int = 0) -> Path:
    """Save a random-weight Qwen3 of about ``size_mb`` MiB and the embedded tokenizer to ``out``."""
    from ulorl.models.tiny import TinySpec, build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    model = build_tiny_model(tok, TinySpec(**model_spec_for(size_mb)), seed=seed)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def bench_experiment(model_dir: Path) -> ExperimentConfig:
    return config_from_dict({
        "name": "zero3-memory", "model": {"name_or_path": str(model_dir)},
        "rollout": {"engine": "vllm"},
        "train": {"backend": "deepspeed", "deepspeed": {"zero_stage": 3}, "threads": 1},
    })


def _gc() -> None:
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def rank_main(model_dir: Path, path: str, out: Path, bucket_mb: float, check: bool = False) -> dict[str, Any]:
    """One rank of one path (run under ``torch.distributed.run``); writes ``out/rank{R}.json``."""
    torch.set_num_threads(1)
    cfg = bench_experiment(model_dir)
    pid = os.getpid()
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device("cpu")
    res: dict[str, Any] = {"rank": rank, "path": path}
    load: Callable[[ExperimentConfig, torch.device], tuple[Any, Any]] = (
        load_train_model if path == "partitioned" else load_model)
    # process group and model code first (both paths), so that the load peak measures the load only
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401

    ensure_process_group("cpu")
    _gc()
    res["rss_before_load_mb"] = (rss_bytes(pid) or 0) / MIB
    with PeakSampler([pid], 0.002) as both:
        with PeakSampler([pid], 0.002) as s:
            model, tok = load(cfg, device)
        res["load_peak_extra_mb"] = s.extra()[pid] / MIB
        res["full_mb"] = sum(full_nbytes(p) for p in model.parameters()) / MIB
        res["local_after_load_mb"] = local_partition_bytes(model) / MIB
        t0 = time.perf_counter()
        backend = DeepSpeedBackend(model, cfg.train, rollout_copy=path == "full")
        res["init_s"] = time.perf_counter() - t0
    # a whole model loaded from safetensors is file-mapped and only counts once touched (partitioning
    # does that): the peak over load + deepspeed.initialize is the comparable number
    res["load_init_peak_extra_mb"] = both.extra()[pid] / MIB
    backend.export_bucket_bytes = int(bucket_mb * MIB)
    del model
    _gc()
    res["local_after_init_mb"] = local_partition_bytes(backend.module) / MIB
    res["rollout_copy_mb"] = 0.0 if backend.rollout_model is backend.module else sum(
        p.numel() * p.element_size() for p in backend.rollout_model.parameters()) / MIB
    res["rss_after_init_mb"] = (rss_bytes(pid) or 0) / MIB
    if rank != 0:
        with PeakSampler([pid], 0.002) as s:
            worker_loop(backend, cfg, pad_token_id(tok), device)
        res["export_peak_extra_mb"] = s.extra()[pid] / MIB
    else:
        exported = 0
        reference = _reference_weights(model_dir) if check else None
        equal = True
        with PeakSampler([pid], 0.002) as s:
            for name, tensor in backend.named_weights_for_rollout():
                exported += tensor.numel() * tensor.element_size()
                if reference is not None:
                    equal = equal and torch.equal(tensor, reference[name])
                del tensor
        res["export_peak_extra_mb"] = s.extra()[pid] / MIB
        res["exported_mb"] = exported / MIB
        if check:
            res["export_equal"] = bool(equal and reference is not None and exported == sum(
                t.numel() * t.element_size() for t in reference.values()))
            saved = out / "saved_model"
            backend.save_model(saved)
            res["saved_equal"] = _dir_weights_equal(saved, reference or {})
        backend.close()
    (out / f"rank{rank}.json").write_text(json.dumps(res))
    return res


def _reference_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    return weights


def _dir_weights_equal(directory: Path, reference: dict[str, torch.Tensor]) -> bool:
    """``from_pretrained(directory)`` loads (outside ZeRO-3) exactly ``reference``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory)
    sd = model.state_dict()
    return bool(reference) and all(torch.equal(sd[k], v) for k, v in reference.items())


def run_path(model_dir: Path, path: str, ranks: int, bucket_mb: float, out: Path, check: bool = False,
             timeout_s: float = 600, mmap_threshold_mb: float = DEFAULT_MMAP_THRESHOLD_MB) -> list[dict[str, Any]]:
    """Run one path on ``ranks`` gloo processes; the per-rank results, rank order.

    ``mmap_threshold_mb`` > 0 sets glibc's ``MALLOC_MMAP_THRESHOLD_`` in the ranks: freed tensors
    then go back to the system at once instead of staying in the heap (glibc raises its threshold
    after every large free), so peaks show what is live rather than what the allocator kept."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if mmap_threshold_mb > 0:
        env["MALLOC_MMAP_THRESHOLD_"] = str(int(mmap_threshold_mb * MIB))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           "-m", "ulorl.bench.zero3", "--model", str(model_dir), "--path", path, "--out", str(out),
           "--bucket-mb", str(bucket_mb), *(["--check"] if check else [])]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"zero3-memory path {path!r} failed (rc {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def run_zero3_bench(size_mb: float, ranks: int = 2, bucket_mb: float = 16.0, paths: tuple[str, ...] = PATHS,
                    progress: Callable[[str], None] | None = None,
                    mmap_threshold_mb: float = DEFAULT_MMAP_THRESHOLD_MB) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ulorl-zero3-") as tmp:
        model_dir = build_model_dir(size_mb, Path(tmp) / "model")
        result: dict[str, Any] = {"size_mb": size_mb, "ranks": ranks, "bucket_mb": bucket_mb,
                                  "spec": model_spec_for(size_mb), "mmap_threshold_mb": mmap_threshold_mb,
                                  "paths": {}}
        for path in paths:
            if progress:
                progress(f"path {path}: {ranks} ranks")
            t0 = time.perf_counter()
            result["paths"][path] = run_path(model_dir, path, ranks, bucket_mb, Path(tmp) / path,
                                             mmap_threshold_mb=mmap_threshold_mb)
            if progress:
                progress(f"path {path}: {time.perf_counter() - t0:.1f} s")
    return result


def format_zero3(result: dict[str, Any]) -> str:
    full_mb = result["paths"][next(iter(result["paths"]))][0]["full_mb"]
    title = (f"ZeRO-3 memory, {result['ranks']} gloo ranks, model {full_mb:.1f} MiB float32, "
             f"export bucket {result['bucket_mb']:g} MiB, MALLOC_MMAP_THRESHOLD_ "
             f"{result['mmap_threshold_mb']:g} MiB (MiB per rank)")
    header = (f"{'path':<12}{'rank':>5}{'local@load':>11}{'local@init':>11}{'copy':>8}{'RSS@init':>10}"
              f"{'load peak+':>11}{'load+init peak+':>16}{'export peak+':>13}")
    rows = [title, header]
    for path, ranks in result["paths"].items():
        for r in ranks:
            rows.append(f"{path:<12}{r['rank']:>5}{r['local_after_load_mb']:>11.1f}{r['local_after_init_mb']:>11.1f}"
                        f"{r['rollout_copy_mb']:>8.1f}{r['rss_after_init_mb']:>10.1f}{r['load_peak_extra_mb']:>11.1f}"
                        f"{r['load_init_peak_extra_mb']:>16.1f}"
                        f"{r['export_peak_extra_mb']:>13.1f}")
    return "\n".join(rows)


def add_zero3_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``zero3-memory`` on ``ulorl-bench``'s subparsers."""
    z = sub.add_parser("zero3-memory",
                       help="ZeRO-3 per-rank parameter memory: partitioned load vs full load (CPU, gloo)",
                       description=__doc__.split("\n\n")[0], epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    z.add_argument("--size-mb", type=float, default=64.0, help="model size (MiB, float32, random weights)")
    z.add_argument("--ranks", type=int, default=2, help="trainer processes (gloo)")
    z.add_argument("--bucket-mb", type=float, default=16.0, help="export bucket (MiB of full parameters)")
    z.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of: " + ", ".join(PATHS))
    z.add_argument("--malloc-mmap-threshold-mb", type=float, default=DEFAULT_MMAP_THRESHOLD_MB,
                   help="MALLOC_MMAP_THRESHOLD_ of the ranks (MiB; 0 = glibc's default, which keeps freed "
                        "large tensors in the heap and inflates the peaks)")
    z.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    g = z.add_argument_group("--count-gathers (collectives per micro-step; --ranks applies)")
    g.add_argument("--count-gathers", action="store_true",
                   help="count ZeRO-3 all-gathers / reduce-scatters per training micro-step instead of memory")
    g.add_argument("--before", type=Path, help="another checkout to count beside this one (its platform/ is used)")
    add_gather_arguments(g)
    return z


def run_zero3_cli(args: argparse.Namespace) -> int:
    if args.count_gathers:
        if args.ranks < 2 or args.row_tokens < 32 or args.chunk_tokens < 1 or args.steps < 1:
            print("ulorl-bench zero3-memory --count-gathers: error: --ranks >= 2, --row-tokens >= 32, "
                  "--chunk-tokens >= 1, --steps >= 1", file=sys.stderr)
            return 2
        counts = run_gather_counts(args)
        print(json.dumps(counts) if args.json else format_counts(counts))
        return 0
    paths = tuple(p.strip() for p in args.paths.split(",") if p.strip())
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths or args.size_mb <= 0 or args.ranks < 1 or args.bucket_mb <= 0:
        print(f"ulorl-bench zero3-memory: error: --paths from {PATHS} (got {bad or args.paths!r}), "
              "--size-mb and --bucket-mb > 0, --ranks >= 1", file=sys.stderr)
        return 2
    out = run_zero3_bench(args.size_mb, args.ranks, args.bucket_mb, paths,
                          progress=lambda m: print(f"[ulorl-bench] {m}", file=sys.stderr, flush=True),
                          mmap_threshold_mb=args.malloc_mmap_threshold_mb)
    if args.json:
        emit_json(out)
    else:
        print(format_zero3(out))
    return 0


def _rank_cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="one rank of ulorl-bench zero3-memory (under torch.distributed.run)")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--path", choices=PATHS, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--bucket-mb", type=float, default=16.0)
    ap.add_argument("--check", action="store_true", help="rank 0 compares the export and save_model to the checkpoint")
    a = ap.parse_args(argv)
    rank_main(a.model, a.path, a.out, a.bucket_mb, check=a.check)
    shutdown_process_group()


if __name__ == "__main__":
    _rank_cli()
