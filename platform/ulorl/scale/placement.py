"""One training run inside a Ray placement group: N trainer workers + M rollout engines.

    ulorl-train EXP.yaml --ray [--address ADDR] [overrides]     # CLI (run_with_placement)
    result = run_placement(cfg, step_callback=report)           # Python / inside a Tune trial

The pure arithmetic (bundles, strategy, node layout, fit checks, ``PlacementError``) is
``ulorl.scale.layout``; this module holds what talks to Ray: the actors, ``RemoteEngine`` and the
placed driver. Layout (``resources`` section of the experiment)::

    bundle 0 .. N-1   trainer workers  {CPU: cpus_per_trainer_worker, GPU: gpus_per_trainer_worker}
    bundle N .. N+M-1 rollout engines  {CPU: cpus_per_engine,         GPU: gpus_per_engine}

* Trainer workers are Ray actors forming one torch.distributed job (RANK / WORLD_SIZE / MASTER_ADDR
  set per actor, gloo on CPU, nccl on GPU): worker 0 runs the ``Trainer`` (scheduler, scorer, MLflow,
  checkpoints), workers 1..N-1 follow it as DeepSpeed data-parallel ranks (``ulorl.train.distributed``).
  N > 1 needs ``train.backend: deepspeed``.
* Rollout engines are Ray actors, each with its own copy of the policy and an engine from
  ``make_engine`` (hf or vllm); the trainer reaches them through ``RemoteEngine``, an ``Engine``
  protocol proxy that splits each ``generate`` call across the engines and pushes new weights to
  all of them after every optimizer step.
* Placement: ``STRICT_PACK`` (one machine) when ``resources.nodes == 1``, else ``PACK``. Without
  ``--address`` a local Ray starts that listens on 127.0.0.1 only (``ulorl.scale.local_ray``, no
  dashboard). Inside a Tune trial whose resources are ``tune_resources(cfg)``, the trial's own
  placement group is used (bundle 0 is the trial itself).
* The run's placement (bundles, resources, node IPs, Ray address) is logged as ``placement.*``
  params of the run's MLflow run; step metrics reach ``step_callback`` in the calling process
  (through a Ray queue), so a Tune trial can ``tune.report`` them.

Paths handed to the actors are absolute (Ray workers do not share the caller's working directory).
On a multi-machine cluster the run directory and the MLflow store must be reachable from every
node (shared filesystem, MLflow server).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ulorl.rollout.types import Engine, EngineBase
from ulorl.scale.interrupt import DriverSignals, PlacementInterrupted
from ulorl.scale.layout import (
    PlacementError,
    actor_threads,
    bundle_roles,
    check_nodes_hold,
    placement_bundles,
    placement_params,
    placement_strategy,
    validate_layout,
)
from ulorl.scale.multinode import RunDirProbe, answer_probe, one_per_node, served_params, store_plan

if TYPE_CHECKING:
    from ulorl.config import ExperimentConfig
    from ulorl.rollout.engines.vllm import VLLMEngine

PG_READY_TIMEOUT_S = 120.0


@dataclass
class PlacementResult:
    run_id: Optional[str]
    run_dir: Path
    steps: int
    interrupted: bool
    tracking_uri: str
    params: dict[str, str] = field(default_factory=dict)
    last_metrics: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- Ray resources


def tune_resources(cfg: ExperimentConfig, trial_cpus: float = 0.01) -> Any:
    """``tune.PlacementGroupFactory`` for a trial that calls ``run_placement``: the trial's own small
    bundle first, then ``placement_bundles(cfg)``."""
    from ray.tune import PlacementGroupFactory

    return PlacementGroupFactory([{"CPU": trial_cpus}] + placement_bundles(cfg), strategy=placement_strategy(cfg))


def cluster_nodes() -> list[dict[str, Any]]:
    """Alive nodes of the connected Ray cluster: ``{"node_id", "ip", "resources"}``."""
    import ray

    return [{"node_id": n["NodeID"], "ip": n.get("NodeManagerAddress", ""), "resources": n.get("Resources", {})}
            for n in ray.nodes() if n.get("Alive")]


# ----------------------------------------------------------------------------- actors


class RemoteEngine(EngineBase):
    """``Engine`` protocol over rollout-engine actors: requests are split into contiguous chunks
    (one per engine, order kept), weights go to every engine."""

    streams_weights = True

    def __init__(self, handles: list[Any], eos_token_id: int, bucket_mb: float = 256.0) -> None:
        import ray

        if not handles:
            raise ValueError("RemoteEngine needs at least one engine actor")
        self.handles = handles
        self.eos_token_id = eos_token_id
        self.policy_version = 0
        self.last_stats: Any = None
        self.bucket_bytes = int(bucket_mb * (1 << 20))
        self.last_update_messages = 0
        self.last_update_bytes = 0
        described = ray.get([h.describe.remote() for h in handles])
        # the scheduler's context guard reads max_model_len: the smallest engine's (None: no limit)
        limits = [d["max_model_len"] for d in described if d["max_model_len"] is not None]
        self.max_model_len: Optional[int] = min(limits) if limits else None
        # colocated engines sleep during the policy update (trainer) and wake with the weight push
        self.colocate = any(d["colocate"] for d in described)
        self.asleep = False
        self.described = described
        self.weight_transfer = described[0]["weight_transfer"]
        self._native: Optional[Any] = None   # the NativeSender of every engine (weight_transfer nccl)

    def generate(self, requests: list[Any], sampling: Any) -> list[Any]:
        import ray

        if not requests:
            return []
        n = min(len(self.handles), len(requests))
        bounds = [len(requests) * i // n for i in range(n + 1)]
        parts = ray.get([
            self.handles[i].generate.remote(requests[bounds[i]: bounds[i + 1]], sampling) for i in range(n)
        ])
        results = [r for res, _ in parts for r in res]
        stats = [s for _, s in parts if s is not None]
        self.last_stats = _sum_stats(stats)
        return results

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.update_weights_streamed(state_dict.items(), version)

    def update_weights_streamed(self, weights: Iterable[tuple[str, Any]], version: int) -> None:
        """Ship ``(name, tensor)`` pairs to every engine actor one bucket (``bucket_bytes``) at a time:
        one bucket in Ray's object store at once, never the whole model; the actors feed their
        engine's own streamed update (``EngineActor.begin_update / push_bucket / finish_update``)."""
        import ray

        from ulorl.rollout.weight_sync import bucketize, tensor_nbytes  # torch: only where weights move

        if self.bucket_bytes <= 0:
            raise ValueError(f"rollout.weight_sync_bucket_mb must be > 0 (got {self.bucket_bytes} bytes)")
        ray.get([h.begin_update.remote(version) for h in self.handles])
        messages = nbytes = 0
        try:
            for bucket in bucketize(weights, self.bucket_bytes):
                cpu = [(name, t.detach().cpu()) for name, t in bucket]
                del bucket
                ref = ray.put(cpu)
                nbytes += sum(tensor_nbytes(t) for _, t in cpu)
                del cpu
                ray.get([h.push_bucket.remote(ref) for h in self.handles])
                del ref
                messages += 1
        finally:
            loaded = ray.get([h.finish_update.remote() for h in self.handles])
        if len({int(n) for n in loaded}) != 1:
            raise RuntimeError(f"engine actors loaded different tensor counts: {loaded}")
        self.policy_version = int(version)
        self.last_update_messages, self.last_update_bytes = messages, nbytes
        self.asleep = False   # each actor's engine woke for its load

    def update_weights_from(self, stream_factory: Callable[[], Iterable[tuple[str, Any]]], version: int) -> None:
        """One weight update from fresh full-weight streams (``backend.rollout_weight_stream``).

        ``stream``: bucketed through Ray (``update_weights_streamed``). ``nccl``: vLLM's trainer-side
        NCCL sender runs HERE, in the trainer's rank 0 with its own GPU (vLLM examples/rl/rlhf_nccl.py),
        ONE sender for every engine actor: the actors' workers share one NCCL group
        (``nccl_group_init_info``), driven together through ``EngineGroupSyncClient``, so each update
        walks one stream (one ZeRO-3 gather) and broadcasts each packed buffer once, from the
        trainer's device tensors; the metadata is read locally (``WeightStreamFactory``).
        """
        import ray

        if self.weight_transfer == "stream":
            self.update_weights_streamed(stream_factory(), version)
            return
        if self._native is None:
            self._native = self._nccl_group_sender()
        self._native.send(stream_factory)
        ray.get([h.update_weight_version.remote(str(version)) for h in self.handles])
        self.policy_version = int(version)
        self.last_update_messages = 1
        self.asleep = False

    def _nccl_group_sender(self) -> Any:
        import ray
        import torch

        from ulorl.rollout.checkpoint_names import conversion_model
        from ulorl.rollout.engines.vllm import NativeSender, native_transfer_problem, nccl_group_init_info
        from ulorl.train.distributed import free_port

        problem = native_transfer_problem(self.weight_transfer, in_trainer_process=False, world_size=1,
                                          tensor_parallel_size=1, colocate=self.colocate)
        if problem:
            raise ValueError(problem)
        # the trainer's own GPU: tensors already there are sent as they are (no copy)
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        info, offsets = nccl_group_init_info([d["tensor_parallel_size"] for d in self.described],
                                             bucket_bytes=self.bucket_bytes,
                                             master_address=ray.util.get_node_ip_address(), master_port=free_port())
        names_model = conversion_model(self.described[0]["model"])
        return NativeSender("nccl", info, EngineGroupSyncClient(self.handles, offsets), [None], names_model, device)

    def sleep(self) -> None:
        """Colocated engines: every actor's engine frees its GPU memory until the next weight push."""
        import ray

        ray.get([h.sleep.remote() for h in self.handles])
        self.asleep = True


class EngineGroupSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over engine actors whose workers share ONE NCCL group.

    vLLM's own ``RayVLLMWeightSyncClient`` fans a call out to several actors with the same arguments,
    which suits the data-parallel ranks of one engine; separate engines need their own place in the
    group, so ``init_weight_transfer_engine`` hands actor ``j`` its ``rank_offset`` (``rank_offsets[j]``,
    from ``nccl_group_init_info``). Every call goes to all actors at once and waits for all: the NCCL
    rendezvous and each broadcast need every worker inside the same call.
    """

    def __init__(self, handles: list[Any], rank_offsets: list[int]) -> None:
        if len(handles) != len(rank_offsets):
            raise ValueError(f"{len(handles)} engine actors but {len(rank_offsets)} rank offsets")
        self.handles = handles
        self.rank_offsets = rank_offsets

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        import ray
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        ray.get([h.init_weight_transfer_engine.remote(WeightTransferInitRequest(init_info={**init_info,
                                                                                          "rank_offset": off}))
                 for h, off in zip(self.handles, self.rank_offsets)])

    def shutdown_weight_transfer_engine(self) -> None:
        import ray

        ray.get([h.shutdown_weight_transfer_engine.remote() for h in self.handles])

    def start_weight_update(self) -> None:
        import ray

        ray.get([h.start_weight_update.remote() for h in self.handles])

    def update_weights(self, update_info: Any) -> None:
        import ray
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        request = WeightTransferUpdateRequest(update_info=update_info)
        ray.get([h.update_weights.remote(request) for h in self.handles])

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        import ray

        ray.get([h.finish_weight_update.remote() for h in self.handles])


def _sum_stats(stats: list[Any]) -> Any:
    if not stats:
        return None
    if len(stats) == 1:
        return stats[0]
    import dataclasses

    out = stats[0]
    for s in stats[1:]:
        for f in dataclasses.fields(out):
            a, b = getattr(out, f.name), getattr(s, f.name)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                setattr(out, f.name, a + b)
    return out


def _node_info() -> dict[str, Any]:
    import ray

    ctx = ray.get_runtime_context()
    return {"node_ip": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id(), "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


UPDATE_IN_FLIGHT = ("generate refused: a streamed weight update is in flight on this engine actor "
                    "(begin_update .. finish_update); call generate after finish_update")


class EngineActor:
    """A rollout engine in its own Ray actor (its own copy of the policy)."""

    def __init__(self, cfg_dict: dict[str, Any], threads: int) -> None:
        import torch

        from ulorl.config import config_from_dict
        from ulorl.rollout.engine_config import engine_rollout_config
        from ulorl.rollout.engines import make_engine
        from ulorl.train.worker import engine_policy

        torch.set_num_threads(threads)
        cfg = config_from_dict(cfg_dict)
        # vllm: the policy's config only (vLLM loads the checkpoint on this actor's GPU itself; HF weights
        # materialised here first would leave it too little free memory to start); hf: the whole model
        model, tok = engine_policy(cfg)
        # engine_rollout_config: tensor_parallel_size from resources.gpus_per_engine, the engine context
        self.rollout_cfg = engine_rollout_config(cfg)   # what this actor's engine was built with
        self._serve(make_engine(self.rollout_cfg, model, tok, in_trainer_process=False))

    @classmethod
    def over(cls, engine: Engine) -> EngineActor:
        """The actor's methods over an engine built elsewhere, in this process (no Ray, no config): what
        the trainer's ``RemoteEngine`` calls, answered by ``engine``."""
        actor = cls.__new__(cls)
        actor._serve(engine)
        return actor

    def _serve(self, engine: Engine) -> None:
        """The actor's state over ``engine``, however it was built."""
        self.engine: Engine = engine
        self._updates, self._updating = 0, False   # weight updates finished / one in flight (describe)

    @property
    def _vllm(self) -> VLLMEngine:
        """The engine, for vLLM's own native weight-transfer protocol (only a vLLM engine speaks it)."""
        from ulorl.rollout.engines.vllm import VLLMEngine

        if not isinstance(self.engine, VLLMEngine):
            raise TypeError(f"native weight transfer needs rollout.engine=vllm; this actor runs "
                            f"{type(self.engine).__name__}")
        return self.engine

    def info(self) -> dict[str, Any]:
        return _node_info()

    def sees_run_dir(self, path: str, token: str, roles: list[str]) -> dict[str, Any]:
        return answer_probe(path, token, _node_info(), roles)

    def describe(self) -> dict[str, Any]:
        """What the trainer's ``RemoteEngine`` mirrors: the engine's context limit and colocation."""
        from ulorl.rollout.engines.vllm import VLLMEngine

        eng = self.engine
        limit = eng.max_model_len
        return {"policy_version": int(eng.policy_version), "updates": self._updates,
                "updating": self._updating,
                "max_model_len": int(limit) if limit is not None else None,
                "colocate": bool(eng.colocate),
                "weight_transfer": str(eng.weight_transfer),
                "tensor_parallel_size": int(eng.tensor_parallel_size),
                "model": eng.llm_kwargs.get("model") if isinstance(eng, VLLMEngine) else None}

    def sleep(self) -> None:
        self.engine.sleep()

    def close(self) -> None:
        """Stop the engine's own processes (vLLM's engine core and workers are children of this actor:
        ``ray.kill`` alone leaves them running, holding their memory)."""
        self.engine.close()

    # vLLM's weight-sync protocol (``VLLMWeightSyncClient``, the methods of its offline ``LLM``): the
    # trainer's rank 0 drives native transfer through ``EngineGroupSyncClient`` over every engine actor
    def init_weight_transfer_engine(self, request: Any) -> None:
        self._vllm.llm.init_weight_transfer_engine(request)

    def shutdown_weight_transfer_engine(self) -> None:
        self._vllm.llm.shutdown_weight_transfer_engine()

    def start_weight_update(self) -> None:
        if self.engine.asleep:
            self._vllm.llm.wake_up(tags=["weights"])
        self._vllm.llm.start_weight_update()

    def update_weights(self, request: Any, version: Optional[int] = None) -> None:
        if version is not None:           # the Engine protocol's full state-dict update
            self.engine.update_weights(request, version)
        else:                             # a native-transfer round (the trainer broadcasts meanwhile)
            self._vllm.llm.update_weights(request)

    def finish_weight_update(self) -> None:
        self._vllm.llm.finish_weight_update()

    def update_weight_version(self, version: str) -> None:
        """End of a native round: wake the KV cache, drop the prefix cache, record the version."""
        self._vllm.updated_to(int(version))
        self._updates += 1

    def generate(self, requests: list[Any], sampling: Any) -> tuple[list[Any], Any]:
        if self._updating:
            # the update's thread is inside the engine (vLLM: reloading layers, driving its RPC socket, which
            # is not thread-safe): generating now would run on half-loaded weights or abort the process
            raise RuntimeError(UPDATE_IN_FLIGHT)
        results = self.engine.generate(requests, sampling)
        return results, self.engine.last_stats

    # streamed update: the trainer pushes buckets; a streaming engine (vLLM) consumes them as they come
    # in a background thread (one bucket queued at a time), any other engine gets them as one dict
    def begin_update(self, version: int) -> None:
        import queue
        import threading

        self._updating = True
        self._bucket_queue: Any = queue.Queue(maxsize=1)
        self._loaded = 0
        self._error: BaseException | None = None
        self._version = version

        def pairs() -> Iterator[tuple[str, Any]]:
            while (bucket := self._bucket_queue.get()) is not None:
                for pair in bucket:
                    self._loaded += 1
                    yield pair

        def consume() -> None:
            try:
                self.engine.update_weights_streamed(pairs(), version)   # EngineBase: one dict for hf
            except BaseException as exc:  # handed to finish_update, which raises it in the caller
                self._error = exc
                while not self._bucket_queue.empty():  # free a push blocked on the full queue
                    self._bucket_queue.get_nowait()

        self._consumer = threading.Thread(target=consume, name="ulorl-weight-update", daemon=True)
        self._consumer.start()

    def push_bucket(self, bucket: list[tuple[str, Any]]) -> None:
        if self._error is not None:
            raise RuntimeError("the engine's streamed weight update failed") from self._error
        self._bucket_queue.put(bucket)

    def finish_update(self) -> int:
        """End the update (the engine finishes its load); returns the tensors it was given."""
        if self._error is None:
            self._bucket_queue.put(None)
        self._consumer.join()
        self._updating = False
        self._updates += 1
        if self._error is not None:
            raise RuntimeError("the engine's streamed weight update failed") from self._error
        return self._loaded


class TrainerActor:
    """One trainer worker (a torch.distributed rank); rank 0 runs the Trainer."""

    def info(self) -> dict[str, Any]:
        return _node_info()

    def sees_run_dir(self, path: str, token: str, roles: list[str]) -> dict[str, Any]:
        return answer_probe(path, token, _node_info(), roles)

    def free_port(self) -> int:
        from ulorl.train.distributed import free_port

        return free_port()

    def run(self, cfg_dict: dict[str, Any], env: dict[str, str], trainer_kwargs: dict[str, Any],
            engines: list[Any], queue: Any, stop: Any = None) -> dict[str, Any]:
        """Run the trainer; ``queue`` gets each step's report, a signal number put on ``stop`` (the driver's
        Ctrl-C / SIGTERM) stops the run after its step as that signal stops a plain ``ulorl-train``."""
        os.environ.update(env)
        from ulorl.config import config_from_dict
        from ulorl.train.trainer import Trainer

        cfg = config_from_dict(cfg_dict)
        holder: dict[str, Any] = {}

        def report(step: int, metrics: dict[str, float], ckpt: Optional[Path]) -> None:
            if queue is not None:
                queue.put((holder["t"].run_id, step, {k: float(v) for k, v in metrics.items()},
                           str(ckpt) if ckpt else None))
            if stop is not None and holder["t"].stop.signal is None and not stop.empty():
                holder["t"].stop.signal = int(stop.get_nowait())   # checked before the next step

        def engine_factory(rollout_cfg: Any, model: Any, tokenizer: Any) -> RemoteEngine:
            return RemoteEngine(engines, tokenizer.eos_token_id, rollout_cfg.weight_sync_bucket_mb)

        trainer = Trainer(cfg, engine_factory=engine_factory if engines else None, step_callback=report,
                          progress=False, **trainer_kwargs)
        holder["t"] = trainer
        res = trainer.run()
        return {"run_id": res.run_id, "run_dir": str(res.run_dir), "steps": res.steps,
                "interrupted": res.interrupted, "tracking_uri": res.tracking_uri,
                "last_metrics": dict(res.last_metrics)}


# ----------------------------------------------------------------------------- MLflow params


def log_placement_params(tracking_uri: str, run_id: str, params: dict[str, str]) -> None:
    """Log ``params`` to the run; on a resumed run a changed value becomes a ``<key>.resumed`` tag."""
    from mlflow.entities import Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    have = client.get_run(run_id).data.params
    new = [Param(k, v) for k, v in params.items() if k not in have]
    changed = [RunTag(f"{k}.resumed", v) for k, v in params.items() if k in have and have[k] != v]
    if new or changed:
        client.log_batch(run_id, params=new, tags=changed)


def _log_placement_params_or_warn(tracking_uri: str, run_id: str, params: dict[str, str]) -> bool:
    """``log_placement_params``; a failure is reported, never the end of a run whose steps are logged."""
    try:
        log_placement_params(tracking_uri, run_id, params)
        return True
    except Exception as exc:  # MLflow, HTTP or SQLite: the placement params are not worth a lost step
        print(f"ulorl-train --ray: could not log the placement params of run {run_id} to {tracking_uri}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return True


# ----------------------------------------------------------------------------- run


def _start_ray(address: Optional[str]) -> tuple[bool, str]:
    """Connect to ``address`` or start a local Ray on 127.0.0.1 (``ulorl.scale.local_ray``); returns
    (started_here, address)."""
    from ulorl.scale.local_ray import init_ray

    try:
        if not init_ray(address, log_to_driver=True):
            return False, address or "existing"
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise PlacementError(f"cannot start or reach Ray{' at ' + address if address else ''}: {exc}") from exc
    return True, address or "local"


def _current_trial_pg(n_bundles: int) -> Any:
    import ray

    pg = ray.util.get_current_placement_group()
    if pg is None:
        return None
    if len(pg.bundle_specs) != n_bundles + 1:
        raise PlacementError(
            f"this process runs in a placement group of {len(pg.bundle_specs)} bundles; run_placement needs "
            f"1 + {n_bundles} (use ulorl.scale.placement.tune_resources(cfg) as the trial's resources)"
        )
    return pg


def _own_placement_group(cfg: ExperimentConfig, bundles: list[dict[str, float]], strategy: str) -> Any:
    """A new placement group for ``bundles``, ready; refused up front when no node can hold a bundle."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    why = check_nodes_hold(bundles, bundle_roles(cfg), strategy, cluster_nodes())
    if why:
        raise PlacementError(why)
    pg = placement_group(bundles, strategy=strategy, name=f"ulorl-{cfg.name}-{os.getpid()}")
    ready, _ = ray.wait([pg.ready()], timeout=PG_READY_TIMEOUT_S)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(f"placement group {bundles} ({strategy}) not ready after {PG_READY_TIMEOUT_S:.0f}s")
    return pg


def bundle_options(pg: Any, bundle: dict[str, float], index: int) -> dict[str, Any]:
    """Ray actor options that put an actor in bundle ``index`` of ``pg`` holding all of ``bundle``
    (CPUs and GPUs: a Ray actor sees exactly the GPUs it holds)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"num_cpus": bundle["CPU"], "num_gpus": bundle.get("GPU", 0.0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)}


def _worker_env(i: int, trainer_info: list[dict[str, Any]], master: tuple[str, int],
                gpu_workers: bool) -> dict[str, str]:
    """torch.distributed environment of trainer worker ``i`` (LOCAL_RANK: its index among the
    workers on its node; a GPU actor sees only its own device, cuda:0)."""
    local = sum(1 for k in range(i) if trainer_info[k]["node_id"] == trainer_info[i]["node_id"])
    return {"RANK": str(i), "WORLD_SIZE": str(len(trainer_info)), "MASTER_ADDR": master[0],
            "MASTER_PORT": str(master[1]), "LOCAL_RANK": "0" if gpu_workers else str(local)}


def _check_run_dir(rdir: Path, actors: list[Any], infos: list[dict[str, Any]], roles: list[str]) -> None:
    """Every node of the run reads a token the driver wrote into ``rdir`` and writes one back
    (``RunDirProbe``); raises ``PlacementError`` naming the first node that cannot."""
    import ray

    probe = RunDirProbe.create(rdir)
    try:
        per_node = one_per_node(infos, roles)
        answers = ray.get([actors[i].sees_run_dir.remote(str(probe.path), probe.token, held)
                           for i, held in per_node.values()])
        probe.check(answers)
    finally:
        probe.remove()


def _wait_draining(futures: list[Any], queue: Any, on_item: Callable[[tuple[Any, ...]], None],
                   on_tick: Optional[Callable[[], None]] = None) -> None:
    """Wait for every future, handing each queued step report to ``on_item`` as it arrives (and calling
    ``on_tick`` every half second); an actor's failure is raised as soon as its future resolves."""
    import ray
    from ray.util.queue import Empty

    def drain() -> None:
        while True:
            try:
                item = queue.get_nowait()
            except Empty:
                return
            on_item(item)

    pending = list(futures)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
        drain()
        if on_tick is not None:
            on_tick()
        if done:
            ray.get(done)
    drain()


def _release(engines: list[Any], actors: list[Any], own_pg: Any, stop_ray: bool) -> None:
    """Engines closed first (their vLLM processes are children a ``ray.kill`` would orphan), then
    every actor killed, the run's own placement group removed and a Ray started here shut down."""
    import ray
    from ray.util.placement_group import remove_placement_group

    if engines:
        try:
            ray.get([e.close.remote() for e in engines], timeout=120)
        except Exception:  # an engine that failed to start or is gone: killed below
            pass
    for a in actors:
        try:
            ray.kill(a)
        except Exception:  # already gone
            pass
    if own_pg is not None:
        remove_placement_group(own_pg)
    if stop_ray:
        ray.shutdown()


def _mark_killed(tracking_uri: str, run_id: Optional[str]) -> None:
    """A run whose trainer was stopped from outside (its actor killed) is KILLED, not left RUNNING."""
    if run_id is None:
        return
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri)
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, "KILLED")
    except Exception as exc:  # MLflow, HTTP or SQLite: said, never in the way of the message that follows
        print(f"ulorl-train --ray: could not mark run {run_id} KILLED in {tracking_uri}: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def run_placement(
    cfg: ExperimentConfig,
    *,
    address: Optional[str] = None,
    run_dir: Optional[str | Path] = None,
    resume: Optional[str] = None,
    tracking_uri: Optional[str] = None,
    step_callback: Optional[Callable[[int, dict[str, float], Optional[Path]], None]] = None,
    progress: bool = False,
    store_server: Optional[Callable[..., Any]] = None,
    signals: Optional[DriverSignals] = None,
    **trainer_kwargs: Any,
) -> PlacementResult:
    """Run one training in a placement group (module docstring). ``trainer_kwargs`` go to ``Trainer``
    on worker 0 (parent_run_id, extra_tags, fail_at_step, eval_at_start).

    Before step 1 (``ulorl.scale.multinode``): every node the run uses must see the run directory (else
    ``PlacementError`` naming the node and the path), and when trainer rank 0 is on another node than
    this driver and the store is a local file, the store is served to it by ``store_server(uri,
    host=tracking.server_host, auth=tracking.server_auth, password=...)`` (``MlflowServer``, as a sweep
    serves its trials; ``ulorl-train --ray`` passes it) or the run is refused with the settings that work.

    ``signals`` (``ulorl-train --ray``): this driver's SIGINT / SIGTERM handlers (``ulorl.scale.interrupt``),
    installed for the run: a first signal while the trainer runs stops it after its step (the result is
    ``interrupted``); one before, or a second one, raises :class:`PlacementInterrupted`.
    """
    validate_layout(cfg)
    import ray
    from ray.util.queue import Queue

    from ulorl.tracking import resolve_tracking_uri
    from ulorl.tracking.credentials import current_credentials
    from ulorl.train.trainer import default_run_dir, find_resume_dir

    uri = resolve_tracking_uri(tracking_uri, cfg.tracking.uri)
    rdir = find_resume_dir(cfg, resume) if resume else (Path(run_dir).resolve() if run_dir else default_run_dir(cfg))
    r = cfg.resources
    # one torch thread per whole CPU of the bundle unless the experiment says otherwise
    trainer_cfg = cfg if cfg.train.threads else cfg.model_copy(
        update={"train": cfg.train.model_copy(update={"threads": actor_threads(r.cpus_per_trainer_worker)})})
    cfg_dict = trainer_cfg.model_dump(mode="json")
    bundles = placement_bundles(cfg)
    strategy = placement_strategy(cfg)
    n, m = r.trainer_workers, r.rollout_engines

    trainer_uri = uri
    if signals is not None:
        signals.install()   # kept through ray.init (ulorl.scale.local_ray)
    try:
        started, addr = _start_ray(address)
    except BaseException:
        if signals is not None:
            signals.restore()
            if signals.hard:   # Ctrl-C / SIGTERM while Ray started
                raise PlacementInterrupted(signals.signum, rdir, None, 0) from None
        raise
    run_id: Optional[str] = None
    steps = 0
    own_pg = None
    server: Any = None                   # the store's server when rank 0 is on another node
    saved_env: dict[str, Optional[str]] = {}
    actors: list[Any] = []
    engines: list[Any] = []
    try:
        pg = _current_trial_pg(len(bundles))
        offset = 1 if pg is not None else 0   # inside a Tune trial, bundle 0 is the trial itself
        if pg is None:
            own_pg = pg = _own_placement_group(cfg, bundles, strategy)

        def opts(i: int) -> dict[str, Any]:
            return bundle_options(pg, bundles[i], offset + i)

        # Any: Ray types an actor handle's methods as plain callables, without their .remote
        # named (ulorl-engine-<j>-<pid>): a diagnostic can reach an engine during the run
        engines = [ray.remote(EngineActor).options(name=f"ulorl-engine-{j}-{os.getpid()}", **opts(n + j)).remote(
            cfg_dict, actor_threads(r.cpus_per_engine)) for j in range(m)]
        workers: list[Any] = [ray.remote(TrainerActor).options(**opts(i)).remote() for i in range(n)]
        actors = engines + workers
        trainer_info = ray.get([w.info.remote() for w in workers])
        engine_info = ray.get([e.info.remote() for e in engines])
        master = (trainer_info[0]["node_ip"], ray.get(workers[0].free_port.remote()))
        params = placement_params(cfg, addr, strategy, bundles, trainer_info, engine_info, ray.cluster_resources())
        _check_run_dir(rdir, workers + engines, trainer_info + engine_info, bundle_roles(cfg))
        driver = {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address()}
        plan = store_plan(uri, driver, trainer_info[0], cfg.tracking.server_host)
        trainer_uri, credentials = uri, current_credentials()
        if plan == "serve":
            if store_server is None:
                raise PlacementError(f"trainer rank 0 runs on another node ({trainer_info[0]['node_ip']}) than this "
                                     f"process and the tracking store {uri} is a local file: pass an http(s) "
                                     f"--tracking-uri of an MLflow server every node reaches")
            server = store_server(uri, host=cfg.tracking.server_host, auth=cfg.tracking.server_auth,
                                  password=os.environ.get(cfg.tracking.auth_env) or None)
            server.start()
            trainer_uri, credentials = server.uri, dict(server.client_env())
            saved_env = {k: os.environ.get(k) for k in credentials}
            os.environ.update(credentials)   # this driver logs the placement params through the server too
        params.update(served_params(plan, server.uri if server is not None else None,
                                    bool(server is not None and server.auth)))
        if progress:
            print(f"ulorl-train --ray: {n} trainer worker(s) + {m} engine(s) on "
                  f"{params['placement.nodes_used']} node(s), run dir {rdir}", file=sys.stderr)

        queue = Queue(actor_options={"num_cpus": 0})
        stop = Queue(actor_options={"num_cpus": 0})   # the driver's signal, for trainer rank 0
        actors += [queue.actor, stop.actor]
        futures = []
        for i, w in enumerate(workers):
            env = _worker_env(i, trainer_info, master, r.gpus_per_trainer_worker > 0)
            kwargs = {"run_dir": str(rdir), "tracking_uri": trainer_uri,
                      **({"resume": str(rdir)} if resume and i == 0 else {})}
            if i == 0:
                kwargs.update(trainer_kwargs)
                env.update(credentials)  # rank 0 writes to MLflow; in the call, never in a logged runtime_env
            futures.append(w.run.remote(cfg_dict, env, kwargs, engines if i == 0 else [], queue if i == 0 else None,
                                        stop if i == 0 else None))
        if signals is not None:
            signals.training = True
        logged = False
        handed_on = False

        def on_step(item: tuple[Any, ...]) -> None:
            nonlocal logged, run_id, steps
            run_id, step, metrics, ckpt = item
            steps = step
            if not logged and run_id:
                logged = _log_placement_params_or_warn(trainer_uri, run_id, params)
            if progress:
                print(f"step {step}: reward {metrics.get('rollout/reward_mean', float('nan')):.3f} "
                      f"{metrics.get('time/step_s', 0.0):.1f}s/step", file=sys.stderr)
            if step_callback is not None:
                step_callback(step, metrics, Path(ckpt) if ckpt else None)

        def on_tick() -> None:
            nonlocal handed_on
            if signals is not None and signals.received is not None and not handed_on:
                handed_on = True
                stop.put(signals.received)
                print(f"ulorl-train --ray: signal {signals.received} received: the trainer finishes its step, "
                      "checkpoints and stops (a second signal stops at once)", file=sys.stderr, flush=True)

        _wait_draining(futures, queue, on_step, on_tick)
        out = ray.get(futures[0])
        if out["run_id"] and not logged:
            _log_placement_params_or_warn(trainer_uri, out["run_id"], params)
        return PlacementResult(run_id=out["run_id"], run_dir=Path(out["run_dir"]), steps=out["steps"],
                               interrupted=out["interrupted"], tracking_uri=uri, params=params,
                               last_metrics=out["last_metrics"])
    except BaseException:
        if signals is None or not signals.hard:
            raise
        _release(engines, actors, own_pg, started)   # before the run is marked: its trainer may still write
        actors, engines, own_pg = [], [], None
        _mark_killed(trainer_uri, run_id)   # through the server when there is one (still up here)
        raise PlacementInterrupted(signals.signum, rdir, run_id, steps) from None
    finally:
        _release(engines, actors, own_pg, started)
        if server is not None:
            server.stop()
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if signals is not None:
            signals.restore()


def run_with_placement(cfg: ExperimentConfig, args: Any, store_server: Optional[Callable[..., Any]] = None, *,
                       again: Callable[[dict[str, str]], str]) -> int:
    """``ulorl-train EXP.yaml --ray [--address ADDR]``: exit status 0, 2 (bad input/placement), 128 + the
    signal that stopped it (130 Ctrl-C, 143 SIGTERM). ``store_server``: how to serve a local tracking store to
    a rank 0 on another node (``run_placement``); ``again``: this invocation's command with ``--resume`` /
    ``--run-dir`` set as given (``ulorl.cli.train.run_again``), printed when the run is interrupted."""
    from ulorl.config import ConfigError
    from ulorl.train.checkpoint import latest_checkpoint

    signals = DriverSignals()
    try:
        res = run_placement(cfg, address=args.address, run_dir=args.run_dir, resume=args.resume,
                            tracking_uri=args.tracking_uri, progress=not args.no_progress,
                            allow_config_change=args.allow_config_change, store_server=store_server,
                            signals=signals)
    except (PlacementError, FileNotFoundError, ConfigError, ValueError) as exc:
        print(f"ulorl-train: {exc}", file=sys.stderr)
        return 2
    except PlacementInterrupted as exc:
        killed = f"; run {exc.run_id} is marked KILLED" if exc.run_id else ""
        if latest_checkpoint(exc.run_dir) is not None:
            print(f"ulorl-train: interrupted (signal {exc.signum}) after {exc.steps} step(s), the trainer stopped at "
                  f"once{killed}; continue from its last checkpoint with:\n  {again({'--resume': str(exc.run_dir)})}",
                  file=sys.stderr)
        else:
            print(f"ulorl-train: interrupted (signal {exc.signum}) before the first checkpoint{killed}; nothing to "
                  f"resume, start again with:\n  {again({'--run-dir': str(exc.run_dir)})}", file=sys.stderr)
        return 128 + exc.signum
    if res.interrupted:
        print(f"run {res.run_id} interrupted after {res.steps} steps (checkpoint saved); continue with:\n"
              f"  {again({'--resume': str(res.run_dir)})}")
    else:
        print(f"run {res.run_id} finished after {res.steps} steps")
    print(f"  placement: {res.params.get('placement.trainer_workers')} trainer worker(s) + "
          f"{res.params.get('placement.rollout_engines')} engine(s), strategy {res.params.get('placement.strategy')}, "
          f"Ray {res.params.get('placement.address')}")
    print(f"  tracking: {res.tracking_uri}")
    print(f"  checkpoints: {res.run_dir / 'checkpoints'}")
    return 128 + signals.signum if res.interrupted else 0
