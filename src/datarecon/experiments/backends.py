"""Execution backends of sweeps: where the runs of a sweep execute.

One small interface (:class:`Backend`), entries in :data:`BACKENDS`:

* ``local`` (default): a :class:`concurrent.futures.ProcessPoolExecutor` with the *spawn* start
  method (no fork of a process holding torch threads); ``workers=1`` runs in the driver process.
* ``ray``: Ray core remote tasks with per-task ``num_cpus`` / ``num_gpus``; embedded
  ``ray.init()`` when no address is given, ``ray.init(address=...)`` to join a cluster
  (``docs/SWEEPS.md``). Needs the optional extra ``pip install 'datarecon[ray]'``.

The driver keeps at most :attr:`Backend.capacity` tasks in flight, calls :meth:`Backend.submit`
and collects :class:`Outcome` s with :meth:`Backend.wait`. A backend never writes the store; it
only reports what happened to each task. A worker process that dies (killed, ``os._exit``, out of
memory) yields an outcome with ``crashed=True``; ``charged=False`` marks tasks that were only
collateral damage (their pool broke because *another* task's process died), which the driver
resubmits without counting an attempt.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor
from concurrent.futures import wait as futures_wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from datarecon.errors import DataReconError
from datarecon.registry import Registry


@dataclass(frozen=True)
class Task:
    """One unit of work for a backend.

    Attributes:
        key: the run key (config hash).
        payload: JSON-able mapping handed to the worker function.
        attempt: 0 for the first try, 1 for the first retry, ...
        num_cpus, num_gpus: resources of the task (Ray schedules by them).
    """

    key: str
    payload: dict[str, Any]
    attempt: int = 0
    num_cpus: float = 1.0
    num_gpus: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """What became of a task.

    Attributes:
        task: the task.
        result: the worker's return value (a small dict) or None.
        error: one line when the task failed (exception in the worker or a dead worker process).
        crashed: the worker process died (rather than raising).
        charged: count this as a failed attempt (False for collateral interruptions).
        retryable: a retry may help (False for user errors that will fail again).
    """

    task: Task
    result: dict[str, Any] | None = None
    error: str | None = None
    crashed: bool = False
    charged: bool = True
    retryable: bool = True

    @property
    def ok(self) -> bool:
        return self.error is None


WorkerFn = Callable[[dict[str, Any]], dict[str, Any]]


class Backend:
    """Interface of an execution backend (a context manager).

    Args:
        fn: the worker function ``fn(payload) -> dict``; must be importable by module path
            (a top-level function) so spawned processes and Ray workers can find it.
        workers: maximum number of tasks in flight (``None``: the backend's default).
    """

    name = "base"

    def __init__(self, fn: WorkerFn, *, workers: int | None = None, **options: Any) -> None:
        self.fn = fn
        self.workers = workers
        self.options = options

    @property
    def capacity(self) -> int:
        """How many tasks the driver keeps in flight."""
        return max(1, int(self.workers or 1))

    def __enter__(self) -> Backend:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def start(self) -> None:
        """Acquire resources (processes, cluster connection)."""

    def shutdown(self) -> None:
        """Release resources; pending tasks are cancelled."""

    def submit(self, task: Task) -> None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> list[Outcome]:
        """Block until at least one submitted task has an outcome (or ``timeout``); return those."""
        raise NotImplementedError

    @property
    def in_flight(self) -> int:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "workers": self.capacity}


BACKENDS: Registry[type[Backend]] = Registry("sweep backend")


def make_backend(name: str, fn: WorkerFn, *, workers: int | None = None, **options: Any) -> Backend:
    """Instantiate backend ``name`` (a :data:`BACKENDS` key)."""
    return BACKENDS.get(name)(fn, workers=workers, **options)


# ---------------------------------------------------------------------------
# local


def _call(fn: WorkerFn, payload: dict[str, Any]) -> dict[str, Any]:
    return fn(payload)


#: exit code of a pool worker that stopped because its driver died
ORPHANED_EXIT = 75
#: seconds between a pool worker's checks that its driver is alive
PARENT_POLL_S = 0.5


def _exit_when_orphaned(driver_pid: int, poll_s: float) -> None:
    while True:
        time.sleep(poll_s)
        if os.getppid() != driver_pid:  # re-parented: the driver is gone (SIGKILL, OOM killer, ...)
            os._exit(ORPHANED_EXIT)


def watch_driver(driver_pid: int, poll_s: float = PARENT_POLL_S) -> None:
    """Pool-worker initialiser: exit at once when the driver process dies.

    Without it, workers of a killed driver finish their task, keep writing run files nobody books
    and then block forever. A daemon thread polls the parent pid; on the driver's death the worker
    exits within ``poll_s`` seconds. Its run keeps its last checkpoint (writes are atomic), so
    rerunning the sweep resumes it bit-identically.
    """
    threading.Thread(target=_exit_when_orphaned, args=(driver_pid, poll_s), daemon=True,
                     name="datarecon-watch-driver").start()


def _exception_outcome(task: Task, exc: BaseException) -> Outcome:
    retryable = not isinstance(exc, DataReconError)
    first = (str(exc).splitlines() or [""])[0]
    return Outcome(task=task, error=f"{type(exc).__name__}: {first}", retryable=retryable)


@BACKENDS.register("local")
class LocalBackend(Backend):
    """Processes on this machine (spawn context); ``workers=1`` runs tasks in the driver process.

    Options:
        in_process: run tasks in the driver even with ``workers > 1`` (serially); default
            ``workers == 1``. A crash of an in-process task kills the driver, so crash recovery
            needs ``in_process=False``.
        max_tasks_per_child: recycle worker processes after this many tasks (default: never).
    """

    name = "local"

    def __init__(self, fn: WorkerFn, *, workers: int | None = None, in_process: bool | None = None,
                 max_tasks_per_child: int | None = None) -> None:
        super().__init__(fn, workers=workers or 1)
        self.in_process = (self.capacity == 1) if in_process is None else in_process
        self.max_tasks_per_child = max_tasks_per_child
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[Future, Task] = {}
        self._ready: list[Outcome] = []
        self.pool_restarts = 0

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "in_process": self.in_process, "start_method": "spawn"}

    def start(self) -> None:
        if not self.in_process:
            self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        kwargs: dict[str, Any] = {"max_workers": self.capacity, "mp_context": multiprocessing.get_context("spawn"),
                                  "initializer": watch_driver, "initargs": (os.getpid(),)}
        if self.max_tasks_per_child is not None:
            kwargs["max_tasks_per_child"] = self.max_tasks_per_child
        return ProcessPoolExecutor(**kwargs)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    @property
    def in_flight(self) -> int:
        return len(self._futures) + len(self._ready)

    def submit(self, task: Task) -> None:
        if self.in_process:
            try:
                self._ready.append(Outcome(task=task, result=self.fn(task.payload)))
            except Exception as exc:  # the worker's failure is reported, not raised
                self._ready.append(_exception_outcome(task, exc))
            return
        assert self._pool is not None, "backend not started"
        try:
            fut = self._pool.submit(_call, self.fn, task.payload)
        except BrokenProcessPool:  # a worker died since the last wait(): recover first
            self._ready.extend(self._recover())
            fut = self._pool.submit(_call, self.fn, task.payload)
        self._futures[fut] = task

    def wait(self, timeout: float | None = None) -> list[Outcome]:
        if self._ready:
            out, self._ready = self._ready, []
            return out
        if not self._futures:
            return []
        done, _ = futures_wait(list(self._futures), timeout=timeout, return_when=FIRST_COMPLETED)
        outcomes: list[Outcome] = []
        broken = False
        for fut in done:
            task = self._futures.pop(fut)
            exc = fut.exception()
            if exc is None:
                outcomes.append(Outcome(task=task, result=fut.result()))
            elif isinstance(exc, BrokenProcessPool):
                broken = True
                self._futures[fut] = task  # handled with the other casualties below
            else:
                outcomes.append(_exception_outcome(task, exc))
        if broken:
            outcomes.extend(self._recover())
        return outcomes

    def _recover(self) -> list[Outcome]:
        """A worker process died: the pool is broken and every unfinished future fails with it.

        Who died? Each worker records its pid in the task's claim (``claim_pid(payload)``); the
        culprit is the task whose process exited by itself (exit code other than our SIGTERM).
        Collateral tasks are reported with ``charged=False``; if the culprit cannot be told
        apart, every task that had started is charged.
        """
        assert self._pool is not None
        pool, self._pool = self._pool, None
        procs = dict(getattr(pool, "_processes", None) or {})
        # wait for the executor's management thread to terminate the survivors
        futures_wait(list(self._futures), timeout=30)
        pool.shutdown(wait=True, cancel_futures=True)
        exitcodes = {pid: p.exitcode for pid, p in procs.items()}
        self.pool_restarts += 1
        tasks = list(self._futures.values())
        self._futures.clear()
        started = {t.key: claim_pid(t.payload) for t in tasks}
        dead_by_itself = {pid for pid, code in exitcodes.items() if code is not None and code != -signal.SIGTERM}
        culprits = {k for k, pid in started.items() if pid is not None and pid in dead_by_itself}
        if not culprits:  # cannot tell: charge everything that had started
            culprits = {k for k, pid in started.items() if pid is not None}
        if not culprits:
            culprits = {t.key for t in tasks}
        out = []
        for t in tasks:
            if t.key in culprits:
                code = exitcodes.get(started.get(t.key))  # type: ignore[arg-type]
                out.append(Outcome(task=t, crashed=True, charged=True,
                                   error=f"worker process died (exit code {code})"))
            else:
                out.append(Outcome(task=t, crashed=True, charged=False, error="interrupted by another worker's crash"))
        self._pool = self._new_pool()
        return out


def claim_pid(payload: dict[str, Any]) -> int | None:
    """The pid recorded by the worker that started ``payload`` (see the sweep worker), or None."""
    path = payload.get("claim_file")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().split()
        if len(text) >= 2 and int(text[1]) == int(payload.get("attempt", 0)):
            return int(text[0])
    except (OSError, ValueError):
        return None
    return None


# ---------------------------------------------------------------------------
# ray


def import_ray() -> Any:
    """Import ray lazily, with the fix in the error message."""
    try:
        import ray  # optional dependency (the ray extra)
    except ImportError:
        raise DataReconError("the ray backend needs Ray; pip install 'datarecon[ray]'") from None
    return ray


def process_start(pid: int) -> str | None:
    """When process ``pid`` started (``/proc/<pid>/stat`` field 22; None where there is no /proc): with
    the pid it identifies one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def driver_identity() -> dict[str, Any]:
    """This process as a task's driver: host, pid and start time (see :func:`driver_alive`)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid())}


def driver_alive(driver: dict[str, Any]) -> bool:
    """Whether the driver process ``driver`` (:func:`driver_identity`) still runs (a zombie is dead)."""
    pid = int(driver["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process has taken the pid
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return True  # no /proc: trust kill(0)
    return fields[0] != "Z" and (driver.get("start") is None or fields[19] == driver["start"])


_WATCHED: set[tuple[str, int]] = set()
_WATCH_LOCK = threading.Lock()


def _exit_when_driver_dies(driver: dict[str, Any], poll_s: float) -> None:
    while True:
        time.sleep(poll_s)
        if not driver_alive(driver):
            os._exit(ORPHANED_EXIT)


#: seconds between a Ray task's checks that its driver is alive (a check reads one /proc file)
RAY_DRIVER_POLL_S = 0.1


def watch_remote_driver(driver: dict[str, Any] | None, poll_s: float = RAY_DRIVER_POLL_S) -> None:
    """In a Ray worker: exit at once when the driver that submitted the task dies (SIGKILL, OOM).

    Ray workers are children of Ray's raylet, not of the driver, so :func:`watch_driver`'s parent
    check does not apply; this one polls the driver's pid and start time. Ray itself ends a dead
    driver's tasks only after a delay, during which a task would go on writing its run folder
    (docs/RELIABILITY.md). Only a driver on this worker's own host can be watched; on another host Ray's own clean-up applies.
    One watcher per driver and worker process (Ray reuses worker processes for many tasks).
    """
    if not driver or driver.get("host") != socket.gethostname():
        return
    key = (str(driver["host"]), int(driver["pid"]))
    with _WATCH_LOCK:
        if key in _WATCHED:
            return
        _WATCHED.add(key)
    threading.Thread(target=_exit_when_driver_dies, args=(driver, poll_s), daemon=True,
                     name="datarecon-watch-ray-driver").start()


def _ray_call(fn: WorkerFn, payload: dict[str, Any], num_threads: int,
              driver: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch  # lazy: only a Ray worker needs torch here; the backends themselves do not

    watch_remote_driver(driver)
    torch.set_num_threads(max(1, num_threads))
    return fn(payload)


#: seconds a Ray address may take to accept a connection before it is called unreachable
RAY_CONNECT_TIMEOUT_S = 5.0


def check_ray_address(address: str | None, *, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Refuse, within ``timeout_s``, a Ray address (``HOST:PORT`` or ``ray://HOST:PORT``) where nothing answers:
    ``ray.init`` would otherwise retry its connection for minutes. ``auto`` and None (an embedded instance) are
    left to Ray.

    Raises:
        DataReconError: a malformed address, or one that refuses or does not answer.
    """
    if not address or address == "auto":
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise DataReconError(f"--ray-address {address!r} is not auto or HOST:PORT (e.g. 127.0.0.1:6379)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except OSError as exc:
        why = f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise DataReconError(f"cannot reach the Ray cluster at {address!r} ({why.lower()}); start it with `ray start "
                             "--head` or drop --ray-address for an embedded instance") from None


@BACKENDS.register("ray")
class RayBackend(Backend):
    """Ray core tasks (one per run) with per-task ``num_cpus`` / ``num_gpus``.

    Options:
        address: ``None`` starts an embedded Ray instance; ``"auto"`` or ``HOST:PORT`` joins a cluster.
        num_cpus: CPUs of an embedded instance (default: all).
        init_kwargs: extra keyword arguments of ``ray.init``.

    Ray's own task retries are off (``max_retries=0``); the sweep driver retries, so the attempt
    count and the error land in the store the same way on every backend.
    """

    name = "ray"

    def __init__(self, fn: WorkerFn, *, workers: int | None = None, address: str | None = None,
                 num_cpus: int | None = None, init_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(fn, workers=workers)
        self.address = address
        self.num_cpus = num_cpus
        self.init_kwargs = dict(init_kwargs or {})
        self._refs: dict[Any, Task] = {}
        self._remote: Any = None
        self._ray: Any = None
        self._started_ray = False
        self._cluster_cpus = 1
        self._driver: dict[str, Any] | None = None

    @property
    def capacity(self) -> int:
        if self.workers:
            return int(self.workers)
        return max(1, self._cluster_cpus)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "address": self.address or "embedded", "cluster_cpus": self._cluster_cpus}

    def start(self) -> None:
        ray = self._ray = import_ray()
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "ignore_reinit_error": True, **self.init_kwargs}
            if self.address:
                check_ray_address(self.address)
                kwargs["address"] = self.address
            elif self.num_cpus is not None:
                kwargs["num_cpus"] = self.num_cpus
            try:
                ray.init(**kwargs)
            except ConnectionError as exc:
                raise DataReconError(
                    f"cannot reach the Ray cluster at {self.address!r} ({exc}); start it with `ray start --head` "
                    "or drop --ray-address for an embedded instance"
                ) from None
            self._started_ray = True
        self._cluster_cpus = int(ray.cluster_resources().get("CPU", 1))
        self._remote = ray.remote(max_retries=0)(_ray_call)
        self._driver = driver_identity()  # its tasks end within RAY_DRIVER_POLL_S when this process dies

    def shutdown(self) -> None:
        ray = self._ray
        if ray is None:
            return
        for ref in list(self._refs):
            try:
                ray.cancel(ref, force=True)
            except Exception:  # already finished / worker gone
                pass
        self._refs.clear()
        if self._started_ray and not self.address:
            ray.shutdown()
        self._ray = None

    @property
    def in_flight(self) -> int:
        return len(self._refs)

    def submit(self, task: Task) -> None:
        opts = {"num_cpus": task.num_cpus, "num_gpus": task.num_gpus}
        ref = self._remote.options(**opts).remote(self.fn, task.payload, max(1, int(task.num_cpus)), self._driver)
        self._refs[ref] = task

    def wait(self, timeout: float | None = None) -> list[Outcome]:
        ray = self._ray
        if not self._refs:
            return []
        done, _ = ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        # collect everything else that is already done too
        if done and len(self._refs) > 1:
            more, _ = ray.wait([r for r in self._refs if r not in done], num_returns=len(self._refs) - 1,
                               timeout=0)
            done = list(done) + list(more)
        outcomes = []
        for ref in done:
            task = self._refs.pop(ref)
            try:
                outcomes.append(Outcome(task=task, result=ray.get(ref)))
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, BaseException):
                    outcomes.append(_exception_outcome(task, cause))
                else:
                    outcomes.append(Outcome(task=task, error=f"task error: {str(exc).splitlines()[0]}"))
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                    ray.exceptions.TaskCancelledError, ray.exceptions.RayError) as exc:
                outcomes.append(Outcome(task=task, crashed=True,
                                        error=f"worker process died ({type(exc).__name__})"))
        return outcomes


__all__ = ["BACKENDS", "Backend", "LocalBackend", "Outcome", "RayBackend", "Task", "check_ray_address", "claim_pid",
           "driver_alive",
           "driver_identity", "import_ray", "make_backend", "watch_driver", "watch_remote_driver"]
