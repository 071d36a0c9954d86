"""``flush_queue``: a failing child writes the steps it queued before reporting its failure, so that the trainer may
read them even before the child has exited (``UnrollProcesses.replace``), and says when it could not."""
import multiprocessing as mp
import os
import queue

from alfish.collect.child_process import flush_queue


def _put_flush_report_and_exit(items, report, done, sizes: list[int], timeout_s: float) -> None:
    for i, size in enumerate(sizes):
        items.put((i, bytes(size)))
    flushed = flush_queue(items, timeout_s)
    report.put(flushed)
    report.close()
    report.join_thread()
    if not flushed:
        done.wait(60.0)  # (here, unlike a failing child, wait for the reader: the test reads the item after the report)
    os._exit(0)  # as ``finish_child`` leaves: no interpreter teardown, no join of ``items``' feeder


def _run_child(sizes: list[int], timeout_s: float):
    ctx = mp.get_context("spawn")
    items, report, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_put_flush_report_and_exit, args=(items, report, done, sizes, timeout_s))
    child.start()
    return child, items, done, report.get(timeout=60.0)


def test_the_items_a_child_flushed_before_leaving_abruptly_all_arrive_whole():
    child, items, _, flushed = _run_child([1000] * 20, timeout_s=5.0)
    child.join(timeout=30.0)
    assert flushed and child.exitcode == 0
    received = [items.get(timeout=1.0) for _ in range(20)]
    assert [i for i, _ in received] == list(range(20)) and all(len(data) == 1000 for _, data in received)
    try:
        items.get_nowait()
    except queue.Empty:
        pass
    else:
        raise AssertionError("more items than were put")


def test_a_queue_nobody_reads_is_not_flushed_within_the_timeout_and_the_child_says_so():
    # 4 MiB: more than a pipe holds, so the child's feeder waits for a reader, which comes only after the report
    child, items, done, flushed = _run_child([4 << 20], timeout_s=0.3)
    assert flushed is False
    index, data = items.get(timeout=30.0)
    done.set()
    assert index == 0 and len(data) == 4 << 20
    child.join(timeout=30.0)
    assert child.exitcode == 0
