"""Where trials run: in this process (one device, or the CPU), or one worker process per GPU.

With several GPUs each worker is pinned to one (`CUDA_VISIBLE_DEVICES`), builds the deployment's
backend itself and runs the trials the parent hands it one at a time, so K candidates run K-wide. The parent
then never initialises a GPU (it would take memory on GPU 0 from worker 0); even the baseline runs in a worker.
"""

from __future__ import annotations

import logging
import os
import queue
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


def _worker_main(spec, env: dict, wid: int, tasks, results) -> None:
    os.environ.update(env)  # before JAX initialises any backend in this process
    from specpilot.agent.backend import backend_from_spec

    try:
        backend = backend_from_spec(spec)
        results.put(("ready", wid, backend.descriptor))
    except Exception as e:
        results.put(("failed", wid, f"{type(e).__name__}: {e}"))
        return
    while True:
        item = tasks.get()
        if item is None:
            return
        idx, job = item
        results.put(("done", wid, (idx, evaluate(backend, job))))


def _error_result(job: dict, error: str) -> dict:
    return {"id": job["id"], "role": job["role"], "config": job["engine"], "status": "error", "error": error}


class PoolRunner:
    """`n` spawned workers; worker i sees GPU i only (or `envs[i]`).

    Each worker has a queue of its own and holds one job at a time, given by the parent when it is idle, so the parent
    always knows which job a worker that dies was running: that trial becomes an error and the rest go on."""

    def __init__(self, spec, n: int, envs: list[dict] | None = None):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        if envs is None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(n)]
            envs = [{"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]} for i in range(n)]
        self.tasks = [ctx.Queue() for _ in range(n)]
        self.results = ctx.Queue()
        self.procs = {i: ctx.Process(target=_worker_main, args=(spec, envs[i], i, self.tasks[i], self.results),
                                     daemon=True) for i in range(n)}
        for p in self.procs.values():
            p.start()
        self.workers = n
        self.descriptor = None
        ready = 0
        while ready < n:
            kind, _, payload = self._get()
            if kind in ("failed", "died"):
                self.close()
                raise RuntimeError(f"search worker failed to start: {payload}")
            if kind == "ready":
                ready += 1
                self.descriptor = self.descriptor or payload
        log.info("%d search workers ready", n)

    def _get(self, timeout: float = 5.0):
        """The next message, or ("died", worker, why) for a worker that exited (it is forgotten)."""
        while True:
            try:
                return self.results.get(timeout=timeout)
            except queue.Empty:
                for w, p in list(self.procs.items()):
                    if not p.is_alive():
                        del self.procs[w]
                        return ("died", w, f"worker pid {p.pid} exited with code {p.exitcode}")

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
            if pending and w in self.procs:
                holding[w] = pending.pop(0)
                self.tasks[w].put((holding[w], jobs[holding[w]]))

        for w, p in list(self.procs.items()):
            if not p.is_alive():  # died while idle (between two runs): it gets no job
                del self.procs[w]
        for w in list(self.procs):
            give(w)
        while len(results) < len(jobs):
            if not self.procs:  # every worker is gone: what is left cannot run
                for i in [*holding.values(), *pending]:
                    finish(i, _error_result(jobs[i], "no search worker left"))
                holding.clear()
                pending.clear()
                break
            kind, w, payload = self._get()
            if kind == "done" and payload[0] == holding.get(w):  # else a late answer for a job already errored
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
        for w in self.procs:
            self.tasks[w].put(None)
        for p in self.procs.values():
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
