"""``--json`` modes: exactly one JSON document on stdout, everything else on stderr.

    @json_command
    def main(argv=None) -> int:
        ...
        emit_json(result)          # with --json: the one document, on the real stdout

While a command given ``--json`` runs, file descriptor 1 points at stderr and ``sys.stdout`` is
``sys.stderr``: library logs (vLLM and DeepSpeed log to stdout), stray prints, C code and child
processes (vLLM's engine core) all end on stderr, so ``CMD --json | jq`` reads one document.
``emit_json`` writes the document to the saved stdout at once (a server command can announce itself
and keep running) and refuses a second one. Without ``--json`` nothing is redirected and
``emit_json`` prints the document like ``print``.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any, Optional, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class _Redirect:
    """Where the one document goes while fd 1 and ``sys.stdout`` point at stderr."""

    def __init__(self, stream: IO[str], saved_fd: Optional[int]) -> None:
        self.stream = stream          # sys.stdout when the command started
        self.saved_fd = saved_fd      # a copy of the real fd 1 (None when it could not be copied)
        self.emitted = False

    def write(self, text: str) -> None:
        if self.emitted:
            raise RuntimeError("a --json command writes exactly one JSON document; this is a second one")
        self.emitted = True
        if self.saved_fd is not None and _is_fd1(self.stream):
            data = text.encode()
            while data:
                data = data[os.write(self.saved_fd, data):]
        else:  # stdout was replaced (a test's capture, a StringIO): the document goes there
            self.stream.write(text)
            self.stream.flush()


_active: list[_Redirect] = []


def _is_fd1(stream: IO[str]) -> bool:
    try:
        return stream.fileno() == 1
    except (AttributeError, OSError, ValueError):
        return False


def _flush_all() -> None:
    """Flush Python's streams and C stdio (``fflush(NULL)``), so nothing buffered crosses a switch of fd 1."""
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if s is not None:
                s.flush()
        except (OSError, ValueError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


@contextmanager
def stdout_to_stderr() -> Iterator[_Redirect]:
    """Point fd 1 and ``sys.stdout`` at stderr inside; the yielded object writes the one document."""
    _flush_all()
    try:
        saved_fd: Optional[int] = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no fd 1 / fd 2 (a daemon): Python-level redirection only
        saved_fd = None
    redirect = _Redirect(sys.stdout, saved_fd)
    sys.stdout = sys.stderr
    _active.append(redirect)
    try:
        yield redirect
    finally:
        _active.remove(redirect)
        _flush_all()
        sys.stdout = redirect.stream
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def wants_json(argv: Optional[Sequence[str]]) -> bool:
    """True when the command line asks for ``--json`` (or an abbreviation argparse accepts, ``--js``...)."""
    args = sys.argv[1:] if argv is None else argv
    return any(a.startswith("--js") and "--json".startswith(a) for a in args if isinstance(a, str))


def json_command(main: F) -> F:
    """Decorate a ``main(argv=None)``: with ``--json`` in argv it runs inside :func:`stdout_to_stderr`."""

    @functools.wraps(main)
    def wrapper(argv: Optional[Sequence[str]] = None, *args: Any, **kwargs: Any) -> Any:
        if not wants_json(argv):
            return main(argv, *args, **kwargs)
        with stdout_to_stderr():
            return main(argv, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def emit_json(obj: Any, *, default: Optional[Callable[[Any], Any]] = None) -> None:
    """Write ``obj`` as one JSON document: to the real stdout inside a ``--json`` command, else print it."""
    text = json.dumps(obj, default=default) + "\n"
    if _active:
        _active[-1].write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
