"""Where trials run: in this process (one device, or the CPU), or one worker process per GPU.

With several GPUs each worker is pinned to one (`CUDA_VISIBLE_DEVICES`), builds the deployment's
backend itself and runs the trials the parent hands it one at a time, so K candidates run K-wide. The parent
then never initialises a GPU (it would take memory on GPU 0 from worker 0); even the baseline runs in a worker.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Callable

from specpilot.agent.trials import evaluate

log = logging.getLogger("specpilot.search")


def detect_gpus() -> int:
    """GPUs JAX sees, asked in a short subprocess (so this process does not initialise any GPU);
    0 without an NVIDIA driver."""
    if not os.path.isdir("/proc/driver/nvidia/gpus") and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return 0
    code = "import jax; print(sum(d.platform == 'gpu' for d in jax.devices()))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        return int(out.stdout.strip().splitlines()[-1])
    except Exception:
        return 0


def worker_count(setting, gpus: int | None = None) -> int:
    """search.workers: "auto" = one per GPU when there are several, else 0 (in-process)."""
    if setting != "auto":
        return int(setting)
    gpus = detect_gpus() if gpus is None else gpus
    return gpus if gpus > 1 else 0


class InProcessRunner:
    def __init__(self, backend):
        self.backend = backend
        self.workers = 0

    def describe(self) -> dict:
        return self.backend.descriptor

    def run(self, jobs: list[dict], on_result: Callable[[dict], None] | None = None) -> list[dict]:
        results = []
        for job in jobs:
            res = evaluate(self.backend, job)
            if on_result:
                on_result(res)
            results.append(res)
        return results

    def close(self) -> None:
        pass


def _worker_main(spec, env: dict, tasks, results) -> None:
    """A worker: builds the backend, then runs each job the parent sends on `tasks` and sends back its result."""
    os.environ.update(env)  # before JAX initialises any backend in this process
    from specpilot.agent.backend import backend_from_spec

    try:
        backend = backend_from_spec(spec)
        results.send(("ready", backend.descriptor))
    except Exception as e:
        results.send(("failed", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            item = tasks.recv()
        except EOFError:  # the parent is gone
            return
        if item is None:
            return
        idx, job = item
        results.send(("done", (idx, evaluate(backend, job))))


def _error_result(job: dict, error: str) -> dict:
    return {"id": job["id"], "role": job["role"], "config": job["engine"], "status": "error", "error": error}


class PoolRunner:
    """`n` spawned workers; worker i sees GPU i only (or `envs[i]`).

    Each worker has two pipes of its own (jobs in, results out) and holds one job at a time, given by the parent when
    it is idle. So the parent always knows which job a worker that dies was running (that trial becomes an error, the
    rest go on), and no lock is shared between processes: a worker killed at any instant (the kernel's OOM killer)
    cannot leave a queue locked for the others, as a shared multiprocessing.Queue can."""

    def __init__(self, spec, n: int, envs: list[dict] | None = None):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        if envs is None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(n)]
            envs = [{"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]} for i in range(n)]
        self.procs, self.tasks, self.results = {}, {}, {}
        for i in range(n):
            task_out, task_in = ctx.Pipe(duplex=False)
            result_out, result_in = ctx.Pipe(duplex=False)
            self.procs[i] = ctx.Process(target=_worker_main, args=(spec, envs[i], task_out, result_in), daemon=True)
            self.procs[i].start()
            task_out.close()  # the worker's ends: closed here, so a dead worker reads as EOF
            result_in.close()
            self.tasks[i], self.results[i] = task_in, result_out
        self.workers = n
        self.descriptor = None
        ready = 0
        while ready < n:
            kind, _, payload = self._next()
            if kind in ("failed", "died"):
                self.close()
                raise RuntimeError(f"search worker failed to start: {payload}")
            if kind == "ready":
                ready += 1
                self.descriptor = self.descriptor or payload
        log.info("%d search workers ready", n)

    def _next(self):
        """(kind, worker, payload): the next message of any live worker, or ("died", worker, why) once one has exited
        with nothing left to read (it is then forgotten). Blocks on the pipes and the processes' sentinels."""
        from multiprocessing.connection import wait

        while True:
            if not self.procs:
                raise RuntimeError("no search worker left")
            for w, p in list(self.procs.items()):
                conn = self.results[w]
                try:
                    if conn.poll():
                        kind, payload = conn.recv()
                        return kind, w, payload
                except (EOFError, OSError):  # its end is closed: the worker is exiting
                    pass
                if not p.is_alive():
                    p.join()
                    del self.procs[w]
                    return "died", w, f"worker pid {p.pid} exited with code {p.exitcode}"
            wait([*(self.results[w] for w in self.procs), *(p.sentinel for p in self.procs.values())], timeout=5.0)

    def describe(self) -> dict:
        return self.descriptor

    def run(self, jobs: list[dict], on_result: Callable[[dict], None] | None = None) -> list[dict]:
        results: dict[int, dict] = {}
        pending = list(range(len(jobs)))  # job indices not yet given to a worker
        holding: dict[int, int] = {}  # worker -> the job index it runs

        def finish(i: int, result: dict) -> None:
            results[i] = result
            if on_result:
                on_result(result)

        def give(w: int) -> None:
            if not pending or w not in self.procs or not self.procs[w].is_alive():
                return  # a worker that died idle gets nothing (its death is reported by `_next`)
            try:
                self.tasks[w].send((pending[0], jobs[pending[0]]))
            except OSError:  # it died just now: the job stays pending for another
                return
            holding[w] = pending.pop(0)

        for w in list(self.procs):
            give(w)
        while len(results) < len(jobs):
            if not self.procs:  # every worker is gone: what is left cannot run
                for i in [*holding.values(), *pending]:
                    finish(i, _error_result(jobs[i], "no search worker left"))
                holding.clear()
                pending.clear()
                break
            kind, w, payload = self._next()
            if kind == "done" and payload[0] == holding.get(w):
                i, result = payload
                holding.pop(w)
                finish(i, result)
                give(w)
            elif kind == "died" and w in holding:
                # a worker crashed (e.g. out of memory in XLA): its trial is an error; the rest go on
                i = holding.pop(w)
                finish(i, _error_result(jobs[i], payload))
        return [results[i] for i in range(len(jobs))]

    def close(self) -> None:
        for w, p in self.procs.items():
            try:
                self.tasks[w].send(None)
            except OSError:
                pass
        for p in self.procs.values():
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
