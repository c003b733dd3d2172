"""GPU check: tiny model, HF engine on CUDA, DeepSpeed ZeRO-2 on one GPU, a few steps, timings.

    python -m ulorl.scale.gpu_check [--steps 3] [--json] [--keep DIR]
    python -m ulorl.scale.gpu_check --device cpu      # the same checks on CPU (tests this script)

Stages (each timed; a failed stage fails the ones that need it, the rest still run):

1. ``cuda``       torch sees a CUDA device (name, memory, torch / CUDA versions)
2. ``model``      a random tiny Qwen3 (the embedded architecture, built in code: no downloads)
3. ``hf_engine``  HF engine on the device: 16 prompts x 64 new tokens, sampling with log-probs
4. ``deepspeed``  DeepSpeed ZeRO-2 bf16 on one process (nccl on CUDA), ``--steps`` UloRL updates on
                  fixed groups with mixed rewards (finite grad norms, parameters move), checkpoint
                  save + load, the new weights pushed to the engine and decoded again
5. ``trainer``    a ``--steps``-step ``Trainer`` run (train.backend=deepspeed, rollout on the device,
                  MLflow into a temporary sqlite store)

Prints one line per stage with its time (``--json``: one JSON object on stdout) and exits 0 when
every stage passed, 1 when one failed, 2 when no CUDA device is visible.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional


class Check:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.stages: list[dict[str, Any]] = []

    def stage(self, name: str, fn: Callable[[], dict[str, Any]], needs: tuple[str, ...] = ()) -> Optional[dict[str, Any]]:
        failed = [n for n in needs if not self.ok(n)]
        if failed:
            rec = {"stage": name, "ok": False, "skipped": True, "error": f"needs {', '.join(failed)}"}
            self._emit(rec)
            return None
        t0 = time.perf_counter()
        try:
            info = fn() or {}
            rec = {"stage": name, "ok": True, "seconds": round(time.perf_counter() - t0, 3), **info}
        except Exception as exc:  # every failure is reported, the exit status says it failed
            rec = {"stage": name, "ok": False, "seconds": round(time.perf_counter() - t0, 3),
                   "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=6)}
        self._emit(rec)
        return rec if rec["ok"] else None

    def ok(self, name: str) -> bool:
        return any(s["stage"] == name and s["ok"] for s in self.stages)

    def _emit(self, rec: dict[str, Any]) -> None:
        self.stages.append(rec)
        out = sys.stderr if self.as_json else sys.stdout
        status = "ok  " if rec["ok"] else ("SKIP" if rec.get("skipped") else "FAIL")
        detail = ", ".join(f"{k}={v}" for k, v in rec.items() if k not in ("stage", "ok", "seconds", "traceback", "skipped"))
        secs = f"{rec['seconds']:8.2f}s" if "seconds" in rec else " " * 9
        print(f"[{status}] {rec['stage']:<10} {secs}  {detail}", file=out, flush=True)
        if not rec["ok"] and rec.get("traceback"):
            print(rec["traceback"], file=sys.stderr, flush=True)


def synthetic_groups(vocab: int, groups: int = 4, group_size: int = 4, seed: int = 0) -> list[Any]:
    """Released groups with rewards {1, 0, ...} per group and uneven lengths (real gradients)."""
    import torch

    from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan

    g = torch.Generator().manual_seed(seed)
    out = []
    for gid in range(groups):
        prompt = torch.randint(3, vocab, (8 + gid,), generator=g).tolist()
        for k in range(group_size):
            t = int(torch.randint(8, 64, (1,), generator=g))
            out.append(Sample(
                sample_id=gid * group_size + k, group_id=gid, prompt_ids=prompt,
                response_ids=torch.randint(3, vocab, (t,), generator=g).tolist(), sampling_logprobs=[-1.0] * t,
                segments=[SegmentSpan(0, t, 0)], status=SampleStatus.FINISHED, reward=float(k % 2 == 0),
            ))
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ulorl.scale.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps in the deepspeed and trainer stages")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (to test this script on a CPU machine)")
    ap.add_argument("--keep", type=Path, help="keep the model, checkpoints and MLflow store here")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args(argv)

    import torch

    check = Check(args.json)
    on_cuda = args.device.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        msg = (f"gpu_check: no CUDA device visible (torch {torch.__version__}, built with CUDA "
               f"{torch.version.cuda or 'none'}); run it on a GPU machine, or --device cpu to test the script")
        print(msg, file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "error": msg, "stages": []}))
        return 2
    device = torch.device(args.device)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ulorl-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    st: dict[str, Any] = {}

    def cuda_info() -> dict[str, Any]:
        info: dict[str, Any] = {"torch": torch.__version__, "device": str(device)}
        if on_cuda:
            p = torch.cuda.get_device_properties(device)
            info.update(name=p.name, memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda,
                        bf16=torch.cuda.is_bf16_supported())
            x = torch.randn(1024, 1024, device=device)
            torch.cuda.synchronize()
            float((x @ x).sum())
        return info

    def build_model() -> dict[str, Any]:
        from ulorl.models.tiny import build_tiny_model, count_parameters
        from ulorl.models.tokenizer import build_tokenizer

        tok = build_tokenizer()
        model = build_tiny_model(tok, seed=0)
        st["model_dir"] = work / "model"
        model.save_pretrained(st["model_dir"])
        tok.save_pretrained(st["model_dir"])
        return {"params": count_parameters(model), "vocab": model.config.vocab_size}

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize()

    def decode(engine: Any, tok: Any, rows: int = 16, new: int = 64) -> dict[str, Any]:
        from ulorl.rollout.types import GenerationRequest, SamplingParams

        prompts = [tok.encode(f"Compute {i} + {2 * i} =") for i in range(rows)]
        reqs = [GenerationRequest(request_id=i, prompt_ids=p, prefix_ids=[], max_new_tokens=new, seed=i)
                for i, p in enumerate(prompts)]
        sync()
        t0 = time.perf_counter()
        res = engine.generate(reqs, SamplingParams(temperature=0.85, seed=0))
        sync()
        dt = time.perf_counter() - t0
        tokens = sum(len(r.token_ids) for r in res)
        if len(res) != rows or tokens == 0:
            raise RuntimeError(f"engine returned {len(res)} results with {tokens} tokens")
        bad = [r.request_id for r in res if len(r.logprobs) != len(r.token_ids)
               or not all(math.isfinite(x) and x <= 1e-6 for x in r.logprobs)]
        if bad:
            raise RuntimeError(f"log-probs missing or not finite/<=0 for requests {bad[:5]}")
        return {"rows": rows, "tokens": tokens, "decode_s": round(dt, 3), "tok_per_s": round(tokens / dt, 1)}

    def hf_engine() -> dict[str, Any]:
        from ulorl.config import RolloutConfig
        from ulorl.models.loading import load_policy
        from ulorl.rollout.engines import make_engine

        model, tok = load_policy(str(st["model_dir"]), device=str(device))
        engine = make_engine(RolloutConfig(device=str(device)), model, tok)
        decode(engine, tok, rows=4, new=8)  # warm-up (kernels, fast-path packing)
        st["tok"] = tok
        return decode(engine, tok)

    def deepspeed_stage() -> dict[str, Any]:
        import copy

        from ulorl.config import config_from_dict
        from ulorl.models.loading import load_policy
        from ulorl.rollout.engines import make_engine
        from ulorl.train.deepspeed_backend import DeepSpeedBackend
        from ulorl.train.update import policy_update

        cfg = config_from_dict({
            "model": {"name_or_path": str(st["model_dir"])},
            "rollout": {"device": str(device)},
            "train": {"backend": "deepspeed", "bf16": True, "lr": 1e-4, "micro_batch_tokens": 256,
                      "deepspeed": {"zero_stage": 2}},
        })
        model, tok = load_policy(str(st["model_dir"]), device=str(device))
        t0 = time.perf_counter()
        backend = DeepSpeedBackend(model, cfg.train)
        init_s = time.perf_counter() - t0
        before = {k: v.detach().float().clone() for k, v in backend.state_dict_for_rollout().items()}
        samples = synthetic_groups(model.config.vocab_size)
        step_s, norms = [], []
        for _ in range(args.steps):
            sync()
            t0 = time.perf_counter()
            res = policy_update(copy.deepcopy(samples), backend, cfg.algo, cfg.train, 0.85, tok.pad_token_id, device)
            sync()
            step_s.append(round(time.perf_counter() - t0, 3))
            if not res.updated:
                raise RuntimeError(f"update refused: {res.reason}")
            norms.append(res.metrics["train/grad_norm"])
        if not all(math.isfinite(n) and n > 0 for n in norms):
            raise RuntimeError(f"grad norms {norms}")
        after = backend.state_dict_for_rollout()
        moved = max(float((after[k].float() - before[k]).abs().max()) for k in before)
        if not moved > 0:
            raise RuntimeError("parameters did not move")
        t0 = time.perf_counter()
        backend.save(work / "ds_ckpt")
        backend.load(work / "ds_ckpt")
        ckpt_s = time.perf_counter() - t0
        engine = make_engine(cfg.rollout, backend.rollout_model, tok)
        t0 = time.perf_counter()
        engine.update_weights(backend.state_dict_for_rollout(), version=args.steps)
        push_s = time.perf_counter() - t0
        dec = decode(engine, tok)
        info = {"init_s": round(init_s, 2), "step_s": step_s, "grad_norms": [round(n, 4) for n in norms],
                "max_param_change": f"{moved:.2e}", "save_load_s": round(ckpt_s, 2),
                "weight_push_s": round(push_s, 4), "decode_after_update_tok_per_s": dec["tok_per_s"]}
        if on_cuda:
            info["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
        return info

    def trainer_stage() -> dict[str, Any]:
        from mlflow.tracking import MlflowClient

        from ulorl.config import config_from_dict
        from ulorl.train.trainer import Trainer

        uri = f"sqlite:///{work / 'mlflow.db'}"
        cfg = config_from_dict({
            "name": "gpu_check",
            "model": {"name_or_path": str(st["model_dir"])},
            "rollout": {"device": str(device), "segments": 2, "max_response_len": 64, "prompts_per_step": 4,
                        "group_size": 4},
            "algo": {"dynamic_sampling": False},
            "train": {"backend": "deepspeed", "bf16": True, "lr": 1e-4, "max_steps": args.steps,
                      "checkpoint_every": args.steps, "deepspeed": {"zero_stage": 2}},
            "eval": {"every": 0},
            "tracking": {"uri": uri, "experiment": "gpu_check"},
        })
        t0 = time.perf_counter()
        res = Trainer(cfg, run_dir=work / "run", progress=False).run()
        wall = time.perf_counter() - t0
        if res.steps != args.steps:
            raise RuntimeError(f"trainer stopped after {res.steps} of {args.steps} steps")
        run = MlflowClient(uri).get_run(res.run_id)
        if run.info.status != "FINISHED":
            raise RuntimeError(f"MLflow run {res.run_id} is {run.info.status}")
        hist = MlflowClient(uri).get_metric_history(res.run_id, "time/step_s")
        return {"steps": res.steps, "wall_s": round(wall, 2),
                "step_s": [round(m.value, 3) for m in sorted(hist, key=lambda m: m.step)], "run_id": res.run_id}

    check.stage("cuda", cuda_info)
    check.stage("model", build_model, needs=("cuda",))
    check.stage("hf_engine", hf_engine, needs=("model",))
    check.stage("deepspeed", deepspeed_stage, needs=("model",))
    check.stage("trainer", trainer_stage, needs=("model",))
    ok = all(s["ok"] for s in check.stages)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    where = str(work) if args.keep else None
    if args.json:
        print(json.dumps({"ok": ok, "work_dir": where, "stages": [
            {k: v for k, v in s.items() if k != "traceback"} for s in check.stages]}))
    else:
        print(f"gpu_check: {'all stages passed' if ok else 'FAILED'}" + (f" (work dir {where})" if where else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
