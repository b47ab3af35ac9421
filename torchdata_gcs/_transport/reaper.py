"""The reaper: a small process that outlives this one and, once this one has ended however it ended (a
normal exit, SIGTERM, SIGKILL), runs the tasks it was handed and not released: deleting temporary
objects, stopping a helper server. It stands where a signal handler would, without a handler's costs: a
process blocked in native code never runs one, the application's own handler is replaced by one, and
SIGKILL skips one.

A process starts its reaper at first need, once, from a background thread, in a new session (so a
signal sent to the job's process group does not reach it), and talks to it over a pipe: :func:`watch`
hands it a pickled task, :func:`release` takes it back. The reaper sees this process end as the pipe's
end of file, or as its parent changing (a forked child holds a copy of the pipe until its after-fork
hook closes it). It opens a task only then, so that while it waits it holds little memory.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import pickle
import shutil
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, Protocol

from . import lifecycle

__all__ = ["DEADLINE_SECONDS", "StopProcess", "Task", "Watch", "release", "serve", "start_soon", "watch"]

logger = logging.getLogger(__name__)

DEADLINE_SECONDS = 120.0
"""How long the reaper may work once this process has ended; what is left then is for a lifecycle rule
or ``torchdata-gcs clean``."""

START_TIMEOUT = 10.0  # how long watch() waits for the reaper's process to be created
STOP_GRACE = 10.0  # how long a stopped process has between SIGTERM and SIGKILL

# The reaper runs this. The package's __init__ imports torch and every front end, seconds and hundreds of
# MB for a process that only deletes objects and stops servers; the reaper needs _transport and _ops only.
# So the package is registered from its spec without executing it, and its subpackages import as usual.
_BOOTSTRAP = """
import importlib.util, json, os, sys
name, root, path, parent, deadline = sys.argv[1:]
sys.path[:] = json.loads(path)
init = os.path.join(root, "__init__.py")
spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[root])
sys.modules[name] = importlib.util.module_from_spec(spec)  # not executed
importlib.import_module(name + "._transport.reaper").serve(int(parent), float(deadline))
"""


class Task(Protocol):
    """What the reaper runs: picklable, with a ``str`` that names what it acts on and holds no secret."""

    def run(self) -> None: ...


class _Link:
    """This process's reaper: the pipe to it, once created, and the numbers of tasks handed over."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.lock = threading.Lock()  # one message at a time on the pipe
        self.keys = itertools.count()
        self.pipe: Connection | None = None


class Watch(NamedTuple):
    """A task handed to this process's reaper, to be released once it is no longer needed."""

    link: _Link
    key: int


_lock = threading.Lock()
_link: _Link | None = None
_inherited: list[_Link] = []  # a forked child's copies of its parent's link: never used, never collected


def start_soon() -> None:
    """Start this process's reaper (once; anew in a forked child) in a background thread: nothing waits."""
    global _link
    if os.name != "posix":  # the pipe and the new session are POSIX; elsewhere a lifecycle rule or `clean`
        return
    with _lock:
        if _link is not None:
            return
        _link = link = _Link()
        lifecycle.after_fork(_forget_after_fork)
    threading.Thread(target=_start, args=(link,), name="torchdata-gcs-reaper", daemon=True).start()


def _start(link: _Link) -> None:
    package = __name__.partition(".")[0]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "-c", _BOOTSTRAP, package, root, json.dumps(sys.path), str(os.getpid())]
    read, write = os.pipe()  # neither end is inherited by other programs this process starts
    try:
        # posix_spawn, not Popen: a Popen object warns when collected while its process runs, and this one
        # is meant to outlive the process that started it. A new session keeps the job's signals off it.
        os.posix_spawn(
            sys.executable,
            [*command, str(DEADLINE_SECONDS)],
            os.environ,
            file_actions=[(os.POSIX_SPAWN_DUP2, read, 0), (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)],
            setsid=True,
        )
        link.pipe = Connection(write, readable=False)
    except (OSError, NotImplementedError) as exc:
        os.close(write)
        logger.warning("could not start the cleanup process (%s): a killed job leaves its temporary objects", exc)
    finally:
        os.close(read)
        link.started.set()


def watch(task: Task) -> Watch | None:
    """Have the reaper run ``task`` once this process has ended, unless it is released first; ``None`` if
    there is no reaper. Waits until the reaper's process exists (the task must be in its hands before the
    work it undoes is done), so call it off the consumer's thread."""
    start_soon()
    link = _link
    if link is None or not link.started.wait(START_TIMEOUT) or link.pipe is None:
        return None
    try:
        data = pickle.dumps(task)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        logger.warning(
            "%s is left to a lifecycle rule or `clean`: it cannot be handed to the cleanup process (%s)", task, exc
        )
        return None
    key = next(link.keys)
    if not _send(link, ("watch", key, data)):
        logger.warning("the cleanup process is gone: %s is left to a lifecycle rule or `clean`", task)
        return None
    return Watch(link, key)


def release(watched: Watch | None) -> None:
    """Take back a task handed to the reaper: it will not run (a no-op in a forked child)."""
    if watched is not None and watched.link is _link:
        _send(watched.link, ("release", watched.key))


def _send(link: _Link, message: tuple[Any, ...]) -> bool:
    """Put ``message`` on the pipe; ``False`` if the reaper is gone."""
    with link.lock:
        if link.pipe is None:
            return False
        try:
            link.pipe.send(message)
        except OSError:
            return False
    return True


def _forget_after_fork() -> None:
    """Close the child's copy of the pipe, so the parent's end is seen when it comes; the child starts its own."""
    global _link, _lock
    _lock = threading.Lock()
    if _link is not None and _link.pipe is not None:
        _link.pipe.close()
    if _link is not None:
        _inherited.append(_link)
    _link = None


# -- the reaper's side -------------------------------------------------------------------------------


def serve(parent: int, deadline: float) -> None:
    """The reaper's main: gather tasks until ``parent`` has ended, then run those not released, in the
    order they came, within ``deadline`` seconds."""
    logging.basicConfig(format="torchdata-gcs cleanup: %(message)s", level=logging.WARNING)
    tasks: dict[int, bytes] = {}
    pipe = Connection(sys.stdin.fileno(), writable=False)
    while True:  # what the parent sent before it ended is read to the last message
        try:
            if not pipe.poll(lifecycle.PARENT_CHECK_SECONDS):
                if os.getppid() != parent:
                    break
                continue
            kind, key, *data = pipe.recv()
        except EOFError:
            break
        if kind == "watch":
            tasks[key] = data[0]
        else:
            tasks.pop(key, None)
    if not tasks:
        return
    timer = threading.Timer(deadline, _give_up, (deadline,))
    timer.daemon = True
    timer.start()
    for data in tasks.values():
        task: Task | None = None
        try:
            task = pickle.loads(data)
            task.run()
        except Exception as exc:  # noqa: BLE001 - one task's failure must not keep the others from running
            logger.warning("%s failed: %s: %s", task or "a task", type(exc).__name__, exc)


def _give_up(deadline: float) -> None:
    logger.warning("gave up after %.0f s: a lifecycle rule or `torchdata-gcs clean` removes what is left", deadline)
    os._exit(1)


class StopProcess:
    """Stop the process ``pid`` (SIGTERM, then SIGKILL after a grace period) if it is still the one it was
    when this task was made, then remove ``folder``."""

    def __init__(self, pid: int, folder: str) -> None:
        self.pid = pid
        self.folder = folder
        self.started = _started(pid)

    def __str__(self) -> str:
        return f"stopping process {self.pid} and removing {self.folder}"

    def run(self) -> None:
        if self.started is not None and _started(self.pid) == self.started:  # not a process that reused the pid
            _signal(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            while _started(self.pid) == self.started and time.monotonic() < deadline:
                time.sleep(0.05)
            if _started(self.pid) == self.started:
                _signal(self.pid, signal.SIGKILL)
        shutil.rmtree(self.folder, ignore_errors=True)


def _started(pid: int) -> Any:
    """What tells the process ``pid`` from a later one with the same pid: its start time where ``/proc``
    has it, else its pid; ``None`` if it is gone (or a zombie, gone but for its exit status)."""
    if not os.path.isdir("/proc/self"):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return pid
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()  # the name before ")" may hold spaces
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]  # fields 3 (state) and 22 (start time) of proc(5)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
