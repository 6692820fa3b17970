"""Run one model measurement in a fresh child process, so every model is timed in the same state.

A process that has already run other models runs the next one slower, and not by a constant:
on the dev VM at 2 threads, after eleven torchvision models mobilenet_v2 at batch 1 took 8.8 ms
instead of 7.7 ms (+14%), resnet18 +3-9%, shufflenet_v2 unchanged; `malloc_trim`, `gc.collect()`
and glibc's default allocator policy did not bring it back. In one `hwlat evaluate` process the
held-out models measured first were over-predicted by ~20% and the last ones by ~3%, and
training-zoo references re-timed before the evaluated models ran 6-15% faster than the same
references re-timed after them. A deployed server runs one model; so end-to-end timings (the
profile's zoo, `hwlat evaluate`) each run in a child process that has run nothing else.

Children fork from a template process that has imported torch and torchvision but run nothing
(no OpenMP pool, no CUDA context), so a measurement costs a fork, not an interpreter start; the
template starts once per hwlat process (~3 s) and exits with it. `HWLAT_ISOLATE=0` measures
in-process. (multiprocessing's forkserver would re-run the caller's main script in every child.)
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

from profilers.errors import BenchError, HwlatError

ENV = "HWLAT_ISOLATE"
PRELOAD = ("torch", "torchvision", "profilers.modelbench")
T = TypeVar("T")
_HEADER = struct.Struct("<Q")

_template: subprocess.Popen | None = None


def enabled() -> bool:
    """On unless `HWLAT_ISOLATE=0`, or where processes cannot fork (Windows)."""
    return (hasattr(os, "fork")
            and os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off"))


# ------------------------------------------------------------------------------- framing


def _write_bytes(stream: BinaryIO, data: bytes) -> None:
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _write(stream: BinaryIO, value: Any) -> None:
    _write_bytes(stream, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _read_bytes(stream: BinaryIO) -> bytes:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return data


def _read(stream: BinaryIO) -> Any:
    return pickle.loads(_read_bytes(stream))


# ------------------------------------------------------------------------------- parent


def _start_template() -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    process = subprocess.Popen([sys.executable, "-m", "profilers.isolate"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=env)
    atexit.register(_stop_template, process)
    return process


def _stop_template(process: subprocess.Popen) -> None:
    if process.poll() is None:
        try:
            process.stdin.close()  # type: ignore[union-attr]
            process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()


def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a fresh child process (in this one with `HWLAT_ISOLATE=0`).

    `fn` must be a module-level function and its arguments and result picklable. A domain error
    in the child is raised here as the same `HwlatError`; a child that dies is a `BenchError`.
    """
    if not enabled():
        return fn(*args, **kwargs)
    global _template
    process = _template
    if process is None or process.poll() is not None:
        process = _template = _start_template()
    sys.stderr.flush()
    try:
        _write(process.stdin, (fn, args, kwargs))  # type: ignore[arg-type]
        result = _read(process.stdout)  # type: ignore[arg-type]
    except (EOFError, OSError):
        _template = None
        raise BenchError(f"the process that measures models stopped unexpectedly; set {ENV}=0 "
                         "to measure in this process instead") from None
    except BaseException:  # interrupted mid-reply: the channel is out of step, start afresh
        _template = None
        process.kill()
        raise
    if result[0] == "ok":
        return result[1]
    if result[0] == "died":
        raise BenchError(f"the measuring process died ({result[1]}); if it ran out of memory, "
                         "try a smaller batch")
    _reraise(*result[1:])
    raise AssertionError("unreachable")


def _reraise(module: str, name: str, message: str, trace: str) -> None:
    cls: Any = None
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        pass
    if isinstance(cls, type) and issubclass(cls, HwlatError):
        raise cls(message)
    if isinstance(cls, type) and issubclass(cls, KeyboardInterrupt):
        raise KeyboardInterrupt
    raise BenchError(f"measuring in a child process failed: {name}: {message}\n{trace}")


# ----------------------------------------------------------------------------- template


def _serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """Fork one child per request; the child runs it and pipes the pickled outcome back.

    The template only passes bytes along: request and outcome are unpickled in the child and the
    parent, so whatever they import (a user's model file) never enters the template."""
    while True:
        try:
            request = _read_bytes(requests)
        except EOFError:
            return
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.close(read_fd)
            code = 0
            try:
                fn, args, kwargs = pickle.loads(request)
                outcome: tuple = ("ok", fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - every outcome goes back to the parent
                outcome = _error(e)
            try:
                try:
                    data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as e:  # noqa: BLE001 - a result that cannot travel
                    data = pickle.dumps(_error(e), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write_fd, "wb") as out:
                    _write_bytes(out, data)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as child_out:
            try:
                reply = _read_bytes(child_out)
            except EOFError:
                reply = None
        _, status = os.waitpid(pid, 0)
        if reply is None:
            signal_no = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            reply = pickle.dumps(("died", f"signal {signal_no}" if signal_no else
                                  f"exit code {os.WEXITSTATUS(status)}"))
        try:
            _write_bytes(replies, reply)
        except OSError:  # the parent is gone (interrupted): nothing left to serve
            return


def _error(e: BaseException) -> tuple:
    cls = type(e)
    return ("error", cls.__module__, cls.__qualname__, str(e),
            "".join(traceback.format_exception(e)))


def _main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent and the child
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a model prints goes to stderr, never into the reply channel
    for name in PRELOAD:
        importlib.import_module(name)
    _serve(requests, replies)


if __name__ == "__main__":
    _main()
