"""
Tests for L{svc.audit.sink}: ordered, complete, thread-safe JSONL appends.

The writer is a real thread; tests wait for it by joining it or by waiting
on the event a completion sets, never by sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.audit import sink as sink_module
from svc.audit.events import AuditEvent, CallerProcess, client_event
from svc.audit.jsonl import render_line
from svc.audit.sink import AuditLogService, JsonlAuditSink

WAIT = 30.0


class ThreadCallsReactor:
    """
    The C{callFromThread} of a reactor: calls are queued and run by the
    test on its own thread with L{run_pending}.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.called = threading.Event()

    def callFromThread(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self._calls.append((f, args))
        self.called.set()

    def run_pending(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, []
            self.called.clear()
        for f, args in calls:
            f(*args)

    def wait(self) -> None:
        if not self.called.wait(WAIT):
            raise AssertionError("the writer thread never reported")
        self.run_pending()


def event(n: int, who: str = "t") -> AuditEvent:
    return client_event(
        "read",
        ts=1.0,
        path=f"/agent-1/{who}",
        allowed=True,
        caller=CallerProcess(command=who, pid=n),
        size=n,
        offset=0,
    )


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in path.read_bytes().splitlines()]


class SinkTests(SynchronousTestCase):
    """
    L{JsonlAuditSink}.
    """

    def make(self, **kwargs: Any) -> tuple[JsonlAuditSink, ThreadCallsReactor, Path]:
        path = Path(self.mktemp())
        reactor = ThreadCallsReactor()
        sink = JsonlAuditSink(path, reactor, **kwargs)
        self.addCleanup(self.finish, sink, reactor)
        return sink, reactor, path

    def finish(self, sink: JsonlAuditSink, reactor: ThreadCallsReactor) -> None:
        sink.stop()
        self.assertTrue(sink.join(WAIT))
        reactor.run_pending()

    def stop(self, sink: JsonlAuditSink, reactor: ThreadCallsReactor) -> None:
        stopped = sink.stop()
        self.assertTrue(sink.join(WAIT))
        self.assertNoResult(stopped)
        reactor.run_pending()
        self.successResultOf(stopped)

    def test_order_across_threads(self) -> None:
        """Lines from several threads are all written, each thread's in order."""
        sink, reactor, path = self.make(batch_lines=7)
        sink.start()
        per_thread = 400

        def emitter(name: str) -> None:
            for n in range(per_thread):
                self.assertTrue(sink.emit(event(n, name)))

        threads = [threading.Thread(target=emitter, args=(f"w{i}",)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        self.stop(sink, reactor)
        lines = read_lines(path)
        self.assertEqual(len(lines), 4 * per_thread)
        for i in range(4):
            mine = [line["size"] for line in lines if line["command"] == f"w{i}"]
            self.assertEqual(mine, list(range(per_thread)))
        self.assertEqual((sink.written, sink.dropped), (4 * per_thread, 0))

    def test_lines_arriving_while_the_writer_waits_join_one_batch(self) -> None:
        """
        Once woken by a line, the writer waits up to C{batch_delay} before
        taking the queue, so a burst is written with one C{write}; a stop
        ends that wait at once.
        """
        sink, reactor, path = self.make(batch_delay=60.0)
        sink.start()
        for n in range(100):
            sink.emit(event(n))
        self.stop(sink, reactor)  # join() waits at most WAIT, far below the delay
        self.assertEqual([line["size"] for line in read_lines(path)], list(range(100)))
        self.assertEqual(sink.batches, 1)

    def test_reopen_does_not_wait_the_batch_delay(self) -> None:
        """A reopen queued behind lines ends the writer's wait for more."""
        sink, reactor, path = self.make(batch_delay=60.0)
        sink.start()
        sink.emit(event(1))
        reopened = sink.reopen()
        reactor.wait()  # WAIT, far below the delay
        self.successResultOf(reopened)
        self.assertEqual([line["size"] for line in read_lines(path)], [1])

    def test_everything_written_by_stop(self) -> None:
        """stop fires only after every accepted line is in the file."""
        sink, reactor, path = self.make()
        for n in range(50):
            sink.emit(event(n))
        sink.start()
        self.stop(sink, reactor)
        self.assertEqual([line["size"] for line in read_lines(path)], list(range(50)))

    def test_appends(self) -> None:
        """An existing log is appended to, never truncated."""
        sink, reactor, path = self.make()
        path.write_bytes(b'{"event":"old"}\n')
        sink.start()
        sink.emit(event(1))
        self.stop(sink, reactor)
        self.assertEqual([line["event"] for line in read_lines(path)], ["old", "read"])

    def test_file_mode(self) -> None:
        """A new log is created readable by its owner only."""
        sink, _reactor, path = self.make()
        sink.start()
        self.assertEqual(stat.S_IMODE(path.stat().st_mode), 0o600)

    def test_reopen(self) -> None:
        """After rename and reopen, later lines go to a new file at the path."""
        sink, reactor, path = self.make()
        sink.start()
        sink.emit(event(1))
        rotated = path.with_name(path.name + ".1")
        os.rename(path, rotated)
        reopened = sink.reopen()
        sink.emit(event(2))
        reactor.wait()
        self.successResultOf(reopened)
        self.stop(sink, reactor)
        self.assertEqual([line["size"] for line in read_lines(rotated)], [1])
        self.assertEqual([line["size"] for line in read_lines(path)], [2])

    def test_overflow_drops_after_timeout(self) -> None:
        """A full queue refuses a line after put_timeout and counts the drop."""
        sink, reactor, path = self.make(max_queued_lines=2, put_timeout=0)
        self.assertTrue(sink.emit(event(1)))
        self.assertTrue(sink.emit(event(2)))
        self.assertFalse(sink.emit(event(3)))
        self.assertEqual(sink.dropped, 1)
        sink.start()
        self.stop(sink, reactor)
        self.assertEqual([line["size"] for line in read_lines(path)], [1, 2])

    def test_blocked_emit_resumes(self) -> None:
        """An emitter blocked on a full queue continues once the writer makes room."""
        sink, reactor, path = self.make(max_queued_lines=1, put_timeout=WAIT)
        sink.emit(event(1))
        results: list[bool] = []
        blocked = threading.Thread(target=lambda: results.append(sink.emit(event(2))))
        blocked.start()
        sink.start()
        blocked.join(WAIT)
        self.assertEqual(results, [True])
        self.stop(sink, reactor)
        self.assertEqual([line["size"] for line in read_lines(path)], [1, 2])

    def test_emit_after_stop(self) -> None:
        """A line emitted after stop is dropped and counted."""
        sink, reactor, _path = self.make()
        sink.start()
        self.stop(sink, reactor)
        self.assertFalse(sink.emit(event(1)))
        self.assertEqual(sink.dropped, 1)
        self.successResultOf(sink.stop())

    def test_stop_without_start(self) -> None:
        """Stopping a never-started sink fires at once and counts queued lines dropped."""
        sink, _reactor, path = self.make()
        sink.emit(event(1))
        self.successResultOf(sink.stop())
        self.assertEqual(sink.dropped, 1)
        self.assertFalse(path.exists())

    def test_start_fails_on_bad_path(self) -> None:
        """start raises when the log cannot be opened."""
        sink = JsonlAuditSink(Path(self.mktemp()) / "missing" / "audit.log", ThreadCallsReactor())
        self.assertRaises(OSError, sink.start)

    def test_write_failure_counted(self) -> None:
        """Lines that fail to be written are counted as dropped."""
        if not os.path.exists("/dev/full"):
            raise self.skipTest("no /dev/full")
        reactor = ThreadCallsReactor()
        sink = JsonlAuditSink("/dev/full", reactor)
        sink.start()
        sink.emit(event(1))
        self.stop(sink, reactor)
        self.assertEqual((sink.written, sink.dropped), (0, 1))

    def test_rendered_by_the_writer(self) -> None:
        """
        Events are rendered on the writer thread; one that cannot be
        rendered is counted as dropped, the lines around it are written.
        """
        rendered_on: set[str] = set()

        def render(event: AuditEvent) -> str:
            rendered_on.add(threading.current_thread().name)
            if event.size == 2:
                raise ValueError("cannot render")
            return real_render(event)

        real_render = render_line
        self.patch(sink_module, "render_line", render)
        sink, reactor, path = self.make()
        sink.start()
        for n in (1, 2, 3):
            sink.emit(event(n))
        self.stop(sink, reactor)
        self.assertEqual([line["size"] for line in read_lines(path)], [1, 3])
        self.assertEqual((sink.written, sink.dropped), (2, 1))
        self.assertEqual(rendered_on, {f"audit-writer:{path}"})
        self.flushLoggedErrors(ValueError)

    def test_one_line_only(self) -> None:
        """emit_line refuses text that is not exactly one terminated line."""
        sink, _reactor, _path = self.make()
        self.assertRaises(ValueError, sink.emit_line, "{}")
        self.assertRaises(ValueError, sink.emit_line, "{}\n{}\n")


class AuditLogServiceTests(SynchronousTestCase):
    """
    L{AuditLogService}.
    """

    def test_start_and_stop(self) -> None:
        """The service starts the sink and its stop waits for the last line."""
        path = Path(self.mktemp())
        reactor = ThreadCallsReactor()
        sink = JsonlAuditSink(path, reactor)
        service = AuditLogService(sink)
        service.startService()
        self.assertTrue(service.running)
        sink.emit(event(5))
        stopped = service.stopService()
        self.assertTrue(sink.join(WAIT))
        reactor.run_pending()
        self.successResultOf(stopped)
        self.assertEqual([line["size"] for line in read_lines(path)], [5])

    def test_sighup_reopens_while_running(self) -> None:
        """With install_signal, SIGHUP reopens the log; stopping restores the old handler."""
        path = Path(self.mktemp())
        reactor = ThreadCallsReactor()
        handlers: dict[int, Any] = {signal.SIGHUP: "previous"}

        def install(signum: int, handler: Any) -> Any:
            previous = handlers.get(signum)
            handlers[signum] = handler
            return previous

        sink = JsonlAuditSink(path, reactor)
        service = AuditLogService(sink, reactor=reactor, install_signal=install)
        service.startService()
        sink.emit(event(1))
        path.rename(path.with_name("rotated.log"))
        handlers[signal.SIGHUP](signal.SIGHUP, None)
        reactor.run_pending()  # the handler hands the reopen to the reactor
        reactor.wait()  # the writer reopened the path
        sink.emit(event(2))
        stopped = service.stopService()
        self.assertEqual(handlers[signal.SIGHUP], "previous")
        self.assertTrue(sink.join(WAIT))
        reactor.run_pending()
        self.successResultOf(stopped)
        self.assertEqual([line["size"] for line in read_lines(path)], [2])
        self.assertEqual([line["size"] for line in read_lines(path.with_name("rotated.log"))], [1])

    def test_no_signal_handling_by_default(self) -> None:
        """Without install_signal the service leaves SIGHUP alone."""
        before = signal.getsignal(signal.SIGHUP)
        reactor = ThreadCallsReactor()
        sink = JsonlAuditSink(Path(self.mktemp()), reactor)
        service = AuditLogService(sink)
        service.startService()
        self.assertIs(signal.getsignal(signal.SIGHUP), before)
        stopped = service.stopService()
        self.assertTrue(sink.join(WAIT))
        reactor.run_pending()
        self.successResultOf(stopped)
