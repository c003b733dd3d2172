"""``ulorl-bench weight-sync``: time and peak extra memory of one trainer -> engine weight sync.

    ulorl-bench weight-sync --engine vllm --size-mb 1024 --bucket-mb 128    # vLLM side venv
    ulorl-bench weight-sync --engine hf --size-mb 256 --json

A Qwen3-shaped model of about ``--size-mb`` (float32, random weights, built locally and saved
to a temporary folder) is loaded by the engine; the benchmark process plays the trainer and
holds a second copy of the weights (perturbed) to send. Paths, run one after the other on the
same engine:

- ``bucketed``: ``VLLMEngine.update_weights_streamed`` (buckets of ``--bucket-mb``);
- ``monolithic``: the old path, one ``torch.save`` blob of the whole state dict through one RPC;
- (``--engine hf``) ``in-process``: ``HFEngine.update_weights`` (``load_state_dict`` in this process).

"Peak extra" of a process = highest ``VmRSS`` (``/proc/<pid>/status``, sampled every
``--sample-ms``) during the sync minus its ``VmRSS`` just before it (a lifetime peak would
include loading the model). Processes: this one (trainer) and every descendant (vLLM's engine
core and workers). Before each path every process returns freed heap pages to the OS
(``malloc_trim``), so one path's leftovers do not hide the next one's peak; bucketed runs first.
``shm`` is the peak size of the weight-sync files in /dev/shm (a bucket in flight, counted in a
process's RSS only while it maps the file). The bound checked for the bucketed path is
``2 x bucket + 10 % of the model`` per process.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch

from ulorl.config import RolloutConfig
from ulorl.jsonout import emit_json

MB = 1 << 20


# ----------------------------------------------------------------------------- /proc sampling
def rss_bytes(pid: int, key: str = "VmRSS") -> Optional[int]:
    """``VmRSS`` (or another ``kB`` line such as ``RssShmem``) of ``pid`` in bytes (None when gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from ``/proc/*/stat`` parent links)."""
    parent: dict[int, int] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as fh:
                text = fh.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        parent[int(stat.split("/")[2])] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def shm_bytes(pattern: str = "/dev/shm/ulorl-wsync-*") -> int:
    total = 0
    for f in glob.glob(pattern):
        try:
            total += os.stat(f).st_size
        except OSError:
            pass
    return total


class PeakSampler:
    """Background thread: per-pid max RSS (and /dev/shm weight-sync bytes) while running."""

    def __init__(self, pids: list[int], interval_s: float) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.baseline = {p: rss_bytes(p) or 0 for p in pids}
        self.peak = dict(self.baseline)
        self.shmem_base = {p: rss_bytes(p, "RssShmem") or 0 for p in pids}
        self.shmem_peak = dict(self.shmem_base)
        self.shm_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for p in self.pids:
            r = rss_bytes(p)
            if r is not None and r > self.peak[p]:
                self.peak[p] = r
            m = rss_bytes(p, "RssShmem")
            if m is not None and m > self.shmem_peak[p]:
                self.shmem_peak[p] = m
        self.shm_peak = max(self.shm_peak, shm_bytes())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def extra(self) -> dict[int, int]:
        return {p: self.peak[p] - self.baseline[p] for p in self.pids}

    def shmem_extra(self) -> dict[int, int]:
        return {p: self.shmem_peak[p] - self.shmem_base[p] for p in self.pids}


# ----------------------------------------------------------------------------- the model
def model_config(size_mb: float) -> Any:
    """A Qwen3 config of about ``size_mb`` MiB in float32 (untied embeddings; pure arithmetic)."""
    from transformers import Qwen3Config

    big = size_mb >= 400
    hidden, vocab, inter = (1024, 32000, 3072) if big else (256, 8192, 768)
    heads, kv, head_dim = (8, 4, 128) if big else (4, 2, 64)
    per_layer = 4 * (hidden * heads * head_dim + 2 * hidden * kv * head_dim + heads * head_dim * hidden
                     + 3 * hidden * inter)
    emb = 4 * 2 * vocab * hidden
    layers = max(1, round((size_mb * MB - emb) / per_layer))
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=head_dim, intermediate_size=inter,
                       max_position_embeddings=1024, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
                       pad_token_id=2)


@dataclass
class SyncResult:
    path: str
    seconds: float
    s_per_gb: float
    messages: int
    trainer_extra_mb: float
    engine_extra_mb: dict[str, float] = field(default_factory=dict)
    shm_peak_mb: float = 0.0
    rss_shmem_extra_mb: dict[str, float] = field(default_factory=dict)
    bound_mb: Optional[float] = None
    within_bound: Optional[bool] = None


def _measure(path: str, run: Callable[[], None], trim: Callable[[], None], nbytes: int, interval_s: float,
             messages: Callable[[], int], bound_mb: Optional[float]) -> SyncResult:
    from ulorl.rollout.engines.vllm_ext import malloc_trim

    malloc_trim()
    trim()
    time.sleep(0.3)
    me = os.getpid()
    pids = [me] + descendants(me)
    with PeakSampler(pids, interval_s) as sampler:
        t0 = time.perf_counter()
        run()
        secs = time.perf_counter() - t0
    extra = sampler.extra()
    engine = {f"{process_name(p)}[{p}]": extra[p] / MB for p in pids[1:]}
    shmem = {f"{process_name(p)}[{p}]": v / MB for p, v in sampler.shmem_extra().items()}
    res = SyncResult(path=path, seconds=secs, s_per_gb=secs / (nbytes / (1 << 30)), messages=messages(),
                     trainer_extra_mb=extra[me] / MB, engine_extra_mb=engine, shm_peak_mb=sampler.shm_peak / MB,
                     rss_shmem_extra_mb=shmem)
    if bound_mb is not None:
        res.bound_mb = bound_mb
        res.within_bound = res.trainer_extra_mb <= bound_mb and all(v <= bound_mb for v in engine.values())
    return res


def run_weight_sync_bench(engine: str, size_mb: float, bucket_mb: float, *, sample_ms: float = 2.0,
                          transport: str = "shm", kv_gib: int = 1,
                          progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Build the model, start the engine, run each path once; returns a JSON-able dict."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = model_config(size_mb)
    t0 = time.perf_counter()
    model = Qwen3ForCausalLM(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    progress(f"model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {nbytes / MB:.0f} MiB float32 "
             f"({time.perf_counter() - t0:.1f} s)")
    g = torch.Generator().manual_seed(1)
    bound_mb = 2 * bucket_mb + 0.1 * nbytes / MB
    out: dict[str, Any] = {"engine": engine, "size_mb": nbytes / MB, "bucket_mb": bucket_mb, "transport": transport,
                           "layers": cfg.num_hidden_layers, "results": []}
    with tempfile.TemporaryDirectory(prefix="ulorl-wsync-bench-") as d:
        if engine == "vllm":
            from ulorl.rollout.engines.vllm import VLLMEngine
            from ulorl.rollout.engines.vllm_ext import TRIM_METHOD

            model.save_pretrained(d)
            # the trainer's copy to send: the model's tensors, perturbed in place (no second copy)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g), alpha=1e-3)
            state = model.state_dict()
            progress("starting the vLLM engine")
            eng = VLLMEngine(d, eos_token_id=1, dtype="float32", max_model_len=256, cpu_kvcache_space_gib=kv_gib,
                             weight_sync_bucket_mb=bucket_mb, weight_sync_transport=transport)
            try:
                progress(f"engine up in {eng.startup_s:.1f} s; "
                         f"processes {[process_name(p) for p in descendants(os.getpid())]}")
                trim = lambda: eng.llm.collective_rpc(TRIM_METHOD)  # noqa: E731
                res = _measure("bucketed", lambda: eng.update_weights_streamed(state.items(), 1), trim, nbytes,
                               sample_ms / 1000, lambda: eng.last_update_messages, bound_mb)
                progress(f"bucketed: {res.seconds:.2f} s")
                out["results"].append(asdict(res))
                res = _measure("monolithic", lambda: eng.update_weights_monolithic(state, 2), trim, nbytes,
                               sample_ms / 1000, lambda: eng.last_update_messages, None)
                progress(f"monolithic: {res.seconds:.2f} s")
                out["results"].append(asdict(res))
            finally:
                eng.close()
        elif engine == "hf":
            from ulorl.rollout.engines.hf import HFEngine

            new = {k: v + 1e-3 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
            hf_eng = HFEngine(model, eos_token_id=1, pad_token_id=2)
            res = _measure("in-process", lambda: hf_eng.update_weights(new, 1), lambda: None, nbytes,
                           sample_ms / 1000, lambda: 0, None)
            out["results"].append(asdict(res))
        else:
            raise ValueError(f"--engine must be hf or vllm, got {engine!r}")
    return out


def format_weight_sync(out: dict[str, Any]) -> str:
    lines = [f"weight sync, engine {out['engine']}: model {out['size_mb']:.0f} MiB float32 ({out['layers']} layers), "
             f"bucket {out['bucket_mb']:g} MiB ({out['transport']}); peak extra RSS per process (MiB)"]
    lines.append(f"{'path':<11} {'s':>7} {'s/GB':>7} {'msgs':>5} {'trainer':>8}  "
                 f"engine processes{'':<28} {'shm':>6}  bound")
    for r in out["results"]:
        eng = ", ".join(f"{k} {v:.0f}" for k, v in r["engine_extra_mb"].items()) or "-"
        bound = "-" if r["bound_mb"] is None else f"<= {r['bound_mb']:.0f}: {'ok' if r['within_bound'] else 'EXCEEDED'}"
        lines.append(f"{r['path']:<11} {r['seconds']:>7.2f} {r['s_per_gb']:>7.2f} {r['messages']:>5} "
                     f"{r['trainer_extra_mb']:>8.0f}  {eng:<44} {r['shm_peak_mb']:>6.0f}  {bound}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI
def _config_bucket_mb() -> float:
    """The experiment config's default bucket size, so the bench measures what training runs with."""
    return float(RolloutConfig.model_fields["weight_sync_bucket_mb"].default)


def add_weight_sync_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``weight-sync`` on ``ulorl-bench``'s subparsers."""
    w = sub.add_parser("weight-sync",
                       help="seconds per GB and peak extra memory of one weight sync: bucketed vs monolithic",
                       description=__doc__.split("\n\n")[0], epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("--engine", default="vllm", choices=["hf", "vllm"], help="engine to sync into (vllm: side venv)")
    w.add_argument("--size-mb", type=float, default=256.0, help="model size (MiB, float32, random weights)")
    w.add_argument("--bucket-mb", type=float, default=_config_bucket_mb(),
                   help="bucket size of the bucketed path (MiB; default: rollout.weight_sync_bucket_mb's)")
    w.add_argument("--transport", default="shm", choices=["shm", "inline"],
                   help="bucketed path: buckets through /dev/shm files or inline in the RPC message")
    w.add_argument("--sample-ms", type=float, default=2.0, help="RSS sampling interval (ms)")
    w.add_argument("--kv-gib", type=int, default=1, help="vLLM CPU KV cache (GiB)")
    w.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    return w


def run_weight_sync_cli(args: argparse.Namespace) -> int:
    def log(msg: str) -> None:
        print(f"[ulorl-bench] {msg}", file=sys.stderr, flush=True)

    if args.size_mb <= 0 or args.bucket_mb <= 0:
        print("ulorl-bench weight-sync: error: --size-mb and --bucket-mb must be > 0", file=sys.stderr)
        return 2
    try:
        out = run_weight_sync_bench(args.engine, args.size_mb, args.bucket_mb, sample_ms=args.sample_ms,
                                    transport=args.transport, kv_gib=args.kv_gib, progress=log)
    except ImportError as exc:
        print(f"ulorl-bench weight-sync: error: {exc} (run --engine vllm from the vLLM side venv)", file=sys.stderr)
        return 1
    if args.json:
        emit_json(out)
    else:
        print(format_weight_sync(out))
    return 0
