"""Where trials run: in this process (one device, or the CPU), or one worker process per GPU.

With several GPUs each worker is pinned to one (`CUDA_VISIBLE_DEVICES`), builds the deployment's
backend itself and takes trials from a shared queue, so K candidates run K-wide. The parent then never
initialises a GPU (it would take memory on GPU 0 from worker 0); even the baseline runs in a worker.
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


def _worker_main(spec, env: dict, tasks, results) -> None:
    os.environ.update(env)  # before JAX initialises any backend in this process
    from specpilot.agent.backend import backend_from_spec

    try:
        backend = backend_from_spec(spec)
        results.put(("ready", None, backend.descriptor))
    except Exception as e:
        results.put(("failed", None, f"{type(e).__name__}: {e}"))
        return
    while True:
        item = tasks.get()
        if item is None:
            return
        idx, job = item
        results.put(("start", idx, os.getpid()))
        results.put(("done", idx, evaluate(backend, job)))


class PoolRunner:
    """`n` spawned workers; worker i sees GPU i only (or `envs[i]`)."""

    def __init__(self, spec, n: int, envs: list[dict] | None = None):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        if envs is None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(n)]
            envs = [{"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]} for i in range(n)]
        self.tasks, self.results = ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=_worker_main, args=(spec, envs[i], self.tasks, self.results), daemon=True)
                      for i in range(n)]
        for p in self.procs:
            p.start()
        self.workers = n
        self.descriptor = None
        ready = 0
        while ready < n:
            kind, _, payload = self._get()
            if kind == "failed":
                self.close()
                raise RuntimeError(f"search worker failed to start: {payload}")
            if kind == "ready":
                ready += 1
                self.descriptor = self.descriptor or payload
        log.info("%d search workers ready", n)

    def _get(self, timeout: float = 5.0):
        while True:
            try:
                return self.results.get(timeout=timeout)
            except queue.Empty:
                dead = [p for p in self.procs if not p.is_alive()]
                if dead:
                    return ("died", None, f"worker pid {dead[0].pid} exited with code {dead[0].exitcode}")

    def describe(self) -> dict:
        return self.descriptor

    def run(self, jobs: list[dict], on_result: Callable[[dict], None] | None = None) -> list[dict]:
        for i, job in enumerate(jobs):
            self.tasks.put((i, job))
        results: dict[int, dict] = {}
        running: dict[int, int] = {}  # job index -> worker pid
        while len(results) < len(jobs):
            kind, idx, payload = self._get()
            if kind == "start":
                running[idx] = payload
            elif kind == "done":
                running.pop(idx, None)
                results[idx] = payload
                if on_result:
                    on_result(payload)
            elif kind == "died":
                # a worker crashed (e.g. out of memory in XLA): its trial is an error; the rest go on
                alive = {p.pid for p in self.procs if p.is_alive()}
                for i, pid in list(running.items()):
                    if pid not in alive:
                        running.pop(i)
                        results[i] = {"id": jobs[i]["id"], "role": jobs[i]["role"], "config": jobs[i]["engine"],
                                      "status": "error", "error": payload}
                        if on_result:
                            on_result(results[i])
                if not alive:
                    for i, job in enumerate(jobs):
                        if i not in results:
                            results[i] = {"id": job["id"], "role": job["role"], "config": job["engine"],
                                          "status": "error", "error": "no search worker left"}
                self.procs = [p for p in self.procs if p.is_alive()]
        return [results[i] for i in range(len(jobs))]

    def close(self) -> None:
        for _ in self.procs:
            self.tasks.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
