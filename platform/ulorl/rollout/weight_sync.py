"""Bucketed, streamed weight transfer from the trainer to the rollout engines.

    for bucket in bucketize(backend.named_weights_for_rollout(), bucket_bytes=256 << 20):
        blob = pack_bucket(bucket)                  # one bytearray: JSON header + raw tensor bytes
        ...                                         # one bounded message per bucket
        named = unpack_bucket(blob)                 # views into blob, no copy

Why: one ``torch.save`` blob of the whole state dict costs several full host copies on the way
(the serialised blob, its ``getvalue`` copy, the RPC's copies) and vLLM's msgpack RPC refuses a
single bytes object over 4 GiB (an 8 GB bf16 4B model). Buckets bound both: the trainer holds the
tensors of one bucket plus one packed buffer at a time, the engine one received buffer whose
tensors are views handed to the model's weight loader.

A bucket closes before it would exceed ``bucket_bytes``; a tensor larger than ``bucket_bytes``
travels alone (its bucket is that tensor). The number of messages is therefore at most
``ceil(total / bucket_bytes) + number of oversize tensors`` (``plan_buckets``).

Wire format of a packed bucket (little-endian)::

    [8 bytes: header length H][H bytes: JSON list of {name, dtype, shape, offset, nbytes}][data]

The receiver parses JSON (no pickle: nothing executable crosses processes).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from ulorl.rollout.types import Engine, WeightStream

__all__ = [
    "DEFAULT_BUCKET_MB",
    "BucketPlan",
    "bucketize",
    "bucket_bytes_from_mb",
    "named_tensors",
    "pack_bucket",
    "packed_size",
    "SharedBucket",
    "SharedMemoryFull",
    "choose_weight_sync_transport",
    "shm_bytes_needed",
    "shm_free_bytes",
    "open_shared_bucket",
    "plan_buckets",
    "push_weights",
    "WeightSource",
    "WeightMeta",
    "WeightStreamFactory",
    "stream_metadata",
    "tensor_nbytes",
    "unpack_bucket",
]

DEFAULT_BUCKET_MB = 256
_HEADER_LEN = struct.Struct("<Q")
_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
              torch.int16, torch.int8, torch.uint8, torch.bool)
}


def bucket_bytes_from_mb(bucket_mb: float) -> int:
    """``rollout.weight_sync_bucket_mb`` in bytes (MiB = 2**20 bytes); must be > 0."""
    if bucket_mb <= 0:
        raise ValueError(f"rollout.weight_sync_bucket_mb must be > 0, got {bucket_mb}")
    return int(bucket_mb * (1 << 20))


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements (``numel * element_size``)."""
    return t.numel() * t.element_size()


def named_tensors(weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
                  ) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of a state dict or of an iterable of pairs (lazily)."""
    if isinstance(weights, Mapping):
        yield from weights.items()
    else:
        yield from weights


def bucketize(weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
              bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``(name, tensor)`` pairs, in order, into buckets of at most ``bucket_bytes``.

    Lazy: a generator source (e.g. ZeRO-3 gathering one parameter at a time) is consumed only as
    far as the current bucket. A tensor larger than ``bucket_bytes`` forms a bucket of its own.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named_tensors(weights):
        n = tensor_nbytes(t)
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


@dataclass(frozen=True)
class BucketPlan:
    """What ``bucketize`` will do to tensors of these sizes (bytes): bucket count and largest bucket."""

    num_buckets: int
    largest_bucket_bytes: int
    total_bytes: int


def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> BucketPlan:
    """Bucket count / largest bucket for tensors of ``sizes`` bytes, in order (pure)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[int] = []
    size = 0
    for n in sizes:
        if size and size + n > bucket_bytes:
            buckets.append(size)
            size = 0
        size += n
    if size:
        buckets.append(size)
    return BucketPlan(len(buckets), max(buckets, default=0), sum(sizes))


def _header(bucket: Sequence[tuple[str, torch.Tensor]]) -> tuple[bytes, list[dict[str, Any]], int]:
    entries: list[dict[str, Any]] = []
    offset = 0
    for name, t in bucket:
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise TypeError(f"weight {name!r}: dtype {t.dtype} cannot be sent to the engine")
        n = tensor_nbytes(t)
        entries.append({"name": name, "dtype": dtype, "shape": list(t.shape), "offset": offset, "nbytes": n})
        offset += n
    return json.dumps(entries).encode(), entries, offset


def packed_size(bucket: Sequence[tuple[str, torch.Tensor]]) -> int:
    """Bytes ``pack_bucket`` writes for ``bucket`` (header included)."""
    header, _, data = _header(bucket)
    return _HEADER_LEN.size + len(header) + data


def pack_bucket(bucket: Sequence[tuple[str, torch.Tensor]], out: Any = None) -> Any:
    """Serialise ``bucket`` into ONE buffer (wire format in the module docstring).

    ``out``: a writable buffer of exactly ``packed_size(bucket)`` bytes (e.g. a shared-memory
    mapping) or None for a new ``bytearray``. Each tensor is copied once, straight into the
    buffer (a GPU tensor is copied to host through the buffer's view).
    """
    header, entries, data_len = _header(bucket)
    start = _HEADER_LEN.size + len(header)
    buf = bytearray(start + data_len) if out is None else out
    view = memoryview(buf).cast("B")
    if len(view) != start + data_len:
        raise ValueError(f"pack_bucket: buffer of {len(view)} bytes, need {start + data_len}")
    view[: _HEADER_LEN.size] = _HEADER_LEN.pack(len(header))
    view[_HEADER_LEN.size:start] = header
    if data_len:
        data = torch.frombuffer(view, dtype=torch.uint8, offset=start, count=data_len)
        for (_, t), e in zip(bucket, entries):
            if e["nbytes"]:
                src = t.detach().contiguous().reshape(-1).view(torch.uint8)
                data[e["offset"]: e["offset"] + e["nbytes"]].copy_(src)
        del data
    view.release()
    return buf


def unpack_bucket(blob: Any) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of a ``pack_bucket`` buffer; the tensors are views into ``blob``.

    ``blob``: anything with the buffer protocol (bytes, bytearray, memoryview). A read-only buffer
    (bytes) gives read-only views: the consumer must copy them (a model's weight loader does).
    """
    view = memoryview(blob).cast("B")
    if len(view) < _HEADER_LEN.size:
        raise ValueError(f"weight bucket of {len(view)} bytes has no header")
    (hlen,) = _HEADER_LEN.unpack(view[: _HEADER_LEN.size])
    start = _HEADER_LEN.size + hlen
    entries = json.loads(bytes(view[_HEADER_LEN.size:start]))
    out: list[tuple[str, torch.Tensor]] = []
    writable = not view.readonly
    for e in entries:
        dtype = _DTYPES[e["dtype"]]
        if e["nbytes"] == 0:
            out.append((e["name"], torch.empty(e["shape"], dtype=dtype)))
            continue
        chunk = view[start + e["offset"]: start + e["offset"] + e["nbytes"]]
        if writable:
            raw = torch.frombuffer(chunk, dtype=torch.uint8)
        else:
            with warnings.catch_warnings():  # torch warns on read-only buffers; views are only read
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.frombuffer(chunk, dtype=torch.uint8)
        out.append((e["name"], raw.view(dtype).reshape(e["shape"])))
    return out


SHM_DIR = "/dev/shm"
WEIGHT_SYNC_TRANSPORTS = ("auto", "shm", "inline")


class SharedMemoryFull(OSError):
    """/dev/shm has no room for a weight-sync bucket (raised before anything is written to it)."""


def shm_free_bytes(directory: str = SHM_DIR) -> Optional[int]:
    """Bytes free for an unprivileged writer in ``directory`` (``statvfs``); None when it does not exist."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return int(st.f_bavail) * int(st.f_frsize)


def shm_bytes_needed(bucket_bytes: int, largest_tensor_bytes: int = 0) -> int:
    """/dev/shm the bucketed update may hold at once: two of the largest bucket (a worker's layerwise
    loader can keep views of the previous bucket mapped while the next one is written; a tensor larger
    than a bucket travels alone), plus 1 MiB of headers (pure)."""
    return 2 * max(int(bucket_bytes), int(largest_tensor_bytes)) + (1 << 20)


def choose_weight_sync_transport(requested: str, *, bucket_bytes: int, largest_tensor_bytes: int,
                                 free_bytes: Optional[int], directory: str = SHM_DIR) -> str:
    """``shm`` or ``inline`` for ``rollout.weight_sync_transport`` (pure; checked before the first update).

    A bucket in /dev/shm is a file the sender truncates to size and writes through a mapping: on a
    tmpfs with too little room (a container's default /dev/shm is 64 MiB) that write is a SIGBUS that
    kills the process, not an exception. ``auto`` takes ``shm`` only where ``shm_bytes_needed`` fits
    in ``free_bytes``; an explicit ``shm`` that does not fit is refused with the settings that fix it.
    """
    if requested not in WEIGHT_SYNC_TRANSPORTS:
        raise ValueError(f"rollout.weight_sync_transport must be one of {WEIGHT_SYNC_TRANSPORTS}, got {requested!r}")
    if requested == "inline":
        return "inline"
    need = shm_bytes_needed(bucket_bytes, largest_tensor_bytes)
    if free_bytes is not None and free_bytes >= need:
        return "shm"
    if requested == "auto":
        return "inline"
    have = "does not exist" if free_bytes is None else f"has {free_bytes / (1 << 20):.0f} MiB free"
    fit = max(1, int(((free_bytes or 0) - (1 << 20)) // 2 // (1 << 20)))
    raise ValueError(
        f"rollout.weight_sync_transport=shm needs {need / (1 << 20):.0f} MiB in {directory} (two buckets of "
        f"{max(bucket_bytes, largest_tensor_bytes) / (1 << 20):.0f} MiB) but it {have}: set "
        f"rollout.weight_sync_transport=inline (or auto), or rollout.weight_sync_bucket_mb={fit} if no tensor "
        f"is larger, or give the container a larger /dev/shm (docker run --shm-size=...)")


class SharedBucket:
    """One packed bucket in a file under ``/dev/shm`` (tmpfs): written once by the sender, mapped
    read-only by each engine worker, so the RPC message only carries the file's path.

    Same-host only (the vLLM workers of an engine run on the host of the process that drives
    it). The sender ``unlink``s the file after every worker has loaded it; memory returns to the
    OS when the last mapping goes (a worker's layerwise loader may keep views of one bucket until
    the layer it started is complete in the next one).
    """

    def __init__(self, bucket: Sequence[tuple[str, torch.Tensor]], directory: str = SHM_DIR) -> None:
        size = packed_size(bucket)
        fd, self.path = tempfile.mkstemp(prefix="ulorl-wsync-", dir=directory)
        try:
            try:
                # reserve every page first: a tmpfs out of room then fails here with ENOSPC, where a
                # sparse ftruncate would let the mapped write below die of SIGBUS
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise SharedMemoryFull(exc.errno, f"no room for a {size / (1 << 20):.1f} MiB weight-sync bucket "
                                       f"in {directory} ({exc.strerror})") from exc
            with mmap.mmap(fd, size) as mm:
                pack_bucket(bucket, out=mm)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        os.close(fd)
        self.nbytes = size

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> SharedBucket:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unlink()


def open_shared_bucket(path: str) -> list[tuple[str, torch.Tensor]]:
    """The receiving side of ``SharedBucket``: read-only views into a mapping of ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return unpack_bucket(mm)  # the views keep the mapping alive; it unmaps when they are freed


WeightMeta = tuple[str, torch.dtype, tuple[int, ...]]


class WeightStreamFactory:
    """Fresh full-weight streams (``factory()``, a collective under ZeRO-3) plus what every stream
    holds, known without one (``factory.metadata()``: ``(name, dtype, full shape)`` per tensor, in
    stream order; ZeRO-3 reads ``ds_shape``). A native weight transfer sizes the engines' receive
    buffers from the metadata and walks ONE stream per update."""

    def __init__(self, stream: Callable[[], WeightStream], metadata: Callable[[], list[WeightMeta]]) -> None:
        self._stream = stream
        self._metadata = metadata

    def __call__(self) -> WeightStream:
        return self._stream()

    def metadata(self) -> list[WeightMeta]:
        return self._metadata()


def stream_metadata(factory: Callable[[], WeightStream]) -> list[WeightMeta]:
    """``(name, dtype, shape)`` of each tensor of ``factory``'s streams: a ``WeightStreamFactory``'s own
    (no stream walked), else one stream walked for it (a gather under ZeRO-3; no tensor kept)."""
    if isinstance(factory, WeightStreamFactory):
        return factory.metadata()
    return [(name, t.dtype, tuple(t.shape)) for name, t in named_tensors(factory())]


class WeightSource(Protocol):
    """What ``push_weights`` reads of a training backend (``ulorl.train.backend.TrainBackend`` has both)."""

    @property
    def rollout_weight_stream(self) -> Optional[Callable[[], WeightStream]]:
        """A factory of lazy full-weight streams, or None: the weights leave as one state dict."""
        ...

    def state_dict_for_rollout(self) -> dict[str, torch.Tensor]:
        """Full (gathered) model weights."""
        ...


def push_weights(engine: Engine, backend: WeightSource, version: int) -> None:
    """Send the trainer's current weights to ``engine`` (the trainer's weight-sync call site).

    Engines that stream weights (``engine.streams_weights``: vLLM, Ray engine actors) get the
    backend's factory of lazy weight streams (``rollout_weight_stream``: gathered per bucket under
    ZeRO-3, the trainer's own device tensors, a ``WeightStreamFactory`` that knows their shapes)
    through ``update_weights_from``, which walks one stream per update for every engine;
    other engines (the in-process HF engine, which shares or copies tensors), and every engine of a
    backend without a stream, get ``state_dict_for_rollout()``. Every rank of a data-parallel
    backend must call this (ZeRO-3 gathers are collective); the worker ranks' streams are consumed
    but not sent.
    """
    stream = backend.rollout_weight_stream
    if stream is not None and engine.streams_weights:
        engine.update_weights_from(stream, version)
    else:
        engine.update_weights(backend.state_dict_for_rollout(), version)
