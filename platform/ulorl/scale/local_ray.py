"""Start (or join) the Ray a command runs on: a Ray started on this machine listens on 127.0.0.1 only.

    started = init_ray(None, num_cpus=2, log_to_driver=True)        # a local Ray, on loopback
    started = init_ray("10.0.0.5:6379", log_to_driver=True)          # the user's cluster (--address), as it is

Every Ray the product starts without an address (``ulorl-sweep``, ``ulorl-train --ray``, the GPU checks)
goes through :func:`init_ray`. Why more than ``ray.init``: Ray decides once, when
``ray._private.ray_constants`` is imported, whether its node may be reached from other machines
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``; on Linux the default is yes). It then gives a local node the
machine's outward address, and GCS, raylet, the workers and the driver's own gRPC server listen on every
interface (``*``), with no authentication: anyone who reaches the host can run code in it. Passing
``_node_ip_address="127.0.0.1"`` does not help (``services.resolve_ip_for_localhost`` turns a loopback
address back into the outward one). So :func:`init_ray` sets the variable for the processes Ray starts
(they read it at their own import) and, when this process imported Ray already, the value Ray read;
both are put back once the node is up (a later ``ray.init(address=...)`` in this process registers on the
outward address again). The node's address is checked afterwards: a Ray that came up on anything but
loopback is shut down and refused (:class:`LocalRayError`).

``ray.init`` also takes SIGTERM over, twice: a Python handler (``sys.exit(15)``) at its start, then its
core worker's C++ handler, which prints ``*** SIGTERM received`` and aborts the process (exit 134: no
``finally`` of the caller runs, MLflow runs stay RUNNING). :func:`init_ray` puts back the handler the caller
had (``signal.signal`` sets it at the C level too), so a command's own SIGTERM handling (``ulorl-sweep``,
``ulorl-train --ray``: stop like Ctrl-C, exit 143) works while Ray runs; a SIGTERM that came while Ray
started is handed to that handler.

Joining a cluster is left to Ray: an ``address``, or Ray's own ``RAY_ADDRESS`` in the environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, Optional

LOOPBACK = "127.0.0.1"
CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # Ray's name: "0" keeps a node on loopback
_CONSTANTS = "ray._private.ray_constants"


class LocalRayError(RuntimeError):
    """A local Ray came up reachable from other machines (it was shut down)."""


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While the body starts a local Ray node: the node, and every process it starts, on 127.0.0.1."""
    old_env = os.environ.get(CLUSTER_SWITCH)
    constants: Any = sys.modules.get(_CONSTANTS)   # imported already: Ray read the variable then
    old_value = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[CLUSTER_SWITCH] = "0"
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if old_env is None:
            os.environ.pop(CLUSTER_SWITCH, None)
        else:
            os.environ[CLUSTER_SWITCH] = old_env
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = old_value


@contextlib.contextmanager
def sigterm_kept() -> Iterator[None]:
    """The body (``ray.init``) leaves SIGTERM's handler as it found it (module docstring); a SIGTERM that
    Ray's handler turned into ``SystemExit(15)`` meanwhile goes to that handler."""
    before = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        yield
    except SystemExit as exc:
        if exc.code != signal.SIGTERM or not callable(before):
            raise
        signal.signal(signal.SIGTERM, before)
        before(signal.SIGTERM, None)   # the caller's handler decides (ulorl-sweep: KeyboardInterrupt)
        raise
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


def _shutdown_quietly() -> None:
    """Whatever a ``ray.init`` stopped halfway started: shut down (nothing to do when it started nothing)."""
    import ray

    try:
        ray.shutdown()
    except Exception:  # a half-made node: what is left dies with this process (Ray's fate sharing)
        pass


def wants_cluster(address: Optional[str]) -> bool:
    """Whether the user named a Ray to join: ``address`` (``--address``) or Ray's ``RAY_ADDRESS``."""
    return bool(address) or bool(os.environ.get("RAY_ADDRESS"))


def init_ray(address: Optional[str] = None, **kwargs: Any) -> bool:
    """``ray.init`` without the dashboard: join ``address`` (or ``RAY_ADDRESS``) as it is, else start a
    local Ray that listens on 127.0.0.1 only. A Ray this process is connected to already is kept (returns
    False); True when this call started or joined one (the caller shuts it down). ``kwargs`` go to
    ``ray.init`` (num_cpus, log_to_driver, runtime_env, ...). SIGTERM's handler is the caller's afterwards
    (:func:`sigterm_kept`). Raises :class:`LocalRayError` when a local node came up on another address."""
    import ray

    if ray.is_initialized():
        return False
    kwargs.setdefault("include_dashboard", False)
    with sigterm_kept():
        try:
            if wants_cluster(address):
                ray.init(address=address, **kwargs)
                return True
            with loopback_only():
                ray.init(**kwargs)
        except BaseException:   # a bad address, Ctrl-C or SIGTERM while Ray starts
            _shutdown_quietly()
            raise
    ip = ray.util.get_node_ip_address()
    if ip != LOOPBACK:
        ray.shutdown()
        raise LocalRayError(f"the local Ray came up on {ip}, reachable from other machines, instead of {LOOPBACK}; "
                            f"it was shut down. Set {CLUSTER_SWITCH}=0 in the environment before the command "
                            "starts, or join a cluster on purpose with --address")
    return True
