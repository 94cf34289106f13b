"""The daemon thread pool that runs users' sync nodes and tools (`colab_graphs.models.loops.DaemonThreads`)."""

from __future__ import annotations

import gc
import time
import weakref

from colab_graphs.models.loops import DaemonThreads


class Payload:
    """Stands for what a sync node returns (a state holding tensors, say)."""


def test_an_idle_thread_keeps_nothing_of_its_last_job() -> None:
    """Once the caller has its result, the pool holds no reference to it, its arguments or the job's function:
    an idle thread that ends later (after `idle_s`, or as the interpreter exits) frees nothing then. (It did
    hold the last result: torch's deallocator, run from a daemon thread during finalization, aborted the
    process with "terminate called without an active exception" after a training that had succeeded.)"""
    pool = DaemonThreads(max_workers=1, idle_s=60)
    argument = Payload()
    watched = {"argument": weakref.ref(argument)}

    def job(arg: Payload) -> Payload:
        made = Payload()
        watched["result"] = weakref.ref(made)
        return made

    future = pool.submit(job, argument)
    result = future.result(timeout=10)
    assert isinstance(result, Payload) and pool.threads == 1  # the thread is alive, idle
    del future, result, argument, job
    for _ in range(50):  # the thread drops its references right after handing over the result
        gc.collect()
        if all(ref() is None for ref in watched.values()):
            break
        time.sleep(0.02)
    assert {name: ref() is None for name, ref in watched.items()} == {"argument": True, "result": True}
    assert pool.threads == 1
    pool.shutdown()
