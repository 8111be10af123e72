"""Sync and async from one flow: the library's only pair of drivers.

Everything in the library that has a sync and an async form (a summary call,
a store write, a model call in the middleware, a lock around a rewrite) is
written once, as a generator that yields ``Call`` values and receives their
results. ``drive`` runs such a flow with blocking calls, ``adrive`` with
awaited ones. What still differs between the paths is only the smallest
primitive: a lock taken by blocking or by polling (``history``), a sync method
or its ``a``-prefixed twin.

A ``Call`` carries both forms of one step: ``twin(f, af, ...)`` pairs a sync
function with its async counterpart, and ``blocking(f, ...)`` runs ``f`` in
place on the sync path and in a worker thread on the async one, so the event
loop never waits on a token counter, a blocking summarizer or a large plan.
``computing(f, ...)`` is ``blocking`` for the library's own CPU work: it runs
on one worker thread, so an event loop serving many conversations waits for
the interpreter lock behind that thread, not behind one per conversation.
An exception raised by a call is thrown into the flow at its ``yield``, so a
flow handles failures where it makes the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import os
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, ParamSpec, TypeVar

from langchain_compaction.errors import ConfigurationError

_P = ParamSpec("_P")
_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


@dataclass(frozen=True, slots=True)
class Call(Generic[_T_co]):
    """One step of a flow, in its sync and its async form.

    Attributes:
        run: Makes the step, blocking.
        arun: Makes the step, awaited.
    """

    run: Callable[[], _T_co]
    arun: Callable[[], Awaitable[_T_co]]


Flow = Generator[Call[Any], Any, _T]
"""A flow: yields calls, receives each result, returns its value."""


class Running:
    """A blocking call on a daemon thread of its own, which the caller may stop waiting for.

    A blocking call cannot be interrupted in Python. A caller that stops
    waiting (a timeout, a cancelled task) abandons it: the thread runs on and,
    once past its ``deadline``, counts in ``abandoned()`` until the call ends.
    A call cancelled well within its time (a client that disconnected) is
    still doing what it was allowed to; a call with no deadline (made without
    a timeout) was allowed all the time it takes, so it is never past it and
    never counts: its thread lives as long as the caller's wait would have,
    and only a timeout bounds how long a hung call keeps one. The thread is a
    daemon, not one of asyncio's default executor's: abandoned calls never
    take the threads other work needs, and ``asyncio.run`` does not wait for
    them when it ends.
    """

    _lock = threading.Lock()
    _left_running: ClassVar[set[Running]] = set()

    def __init__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.done = threading.Event()
        self.outcome: tuple[bool, Any] = (False, None)
        self.deadline: float | None = None
        """When the caller's time for it runs out (``time.monotonic()``), if it has a limit."""
        self._left = False
        self._callbacks: list[Callable[[], None]] = []
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=self._target, args=(context, function, args, kwargs), name="langchain-compaction-call", daemon=True
        )

    @classmethod
    def abandoned(cls) -> int:
        """How many abandoned calls are still running past their deadline (a call without one is never past it)."""
        now = time.monotonic()
        with cls._lock:
            return sum(1 for call in cls._left_running if call.deadline is not None and call.deadline <= now)

    def start(self, on_done: Callable[[], None] | None = None) -> Running:
        """Start the call; ``on_done`` runs on its thread when it ends."""
        if on_done is not None:
            self._callbacks.append(on_done)
        self._thread.start()
        return self

    def _target(self, context: contextvars.Context, function: Callable[..., Any], args: Any, kwargs: Any) -> None:
        try:
            self.outcome = (True, context.run(function, *args, **kwargs))
        except BaseException as exc:  # handed to whoever waits
            self.outcome = (False, exc)
        finally:
            with Running._lock:
                self.done.set()
                Running._left_running.discard(self)
            for callback in self._callbacks:
                callback()

    def abandon(self) -> bool:
        """Stop waiting for the call; whether it was still running (it then counts as abandoned)."""
        with Running._lock:
            if self.done.is_set() or self._left:
                return False
            self._left = True
            Running._left_running.add(self)
            return True

    def result(self) -> Any:
        """What the call returned, or raise what it raised (once it is done)."""
        succeeded, value = self.outcome
        if not succeeded:
            raise value
        return value


async def off_loop(function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run blocking ``function`` on a daemon thread of its own (``Running``), with the caller's context.

    A caller cancelled while it waits abandons the call (it runs on, counted in
    ``Running.abandoned()``); its event loop is never held by it.

    Args:
        function: What to run.
        *args: Its arguments.
        **kwargs: Its keyword arguments.

    Returns:
        What it returns.
    """
    return await settled(Running(function, *args, **kwargs))  # type: ignore[no-any-return]


async def settled(call: Running) -> Any:
    """Start ``call`` and await its end (``off_loop``); a caller cancelled meanwhile abandons it."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()

    def settle() -> None:
        if not ended.done():
            ended.set_result(None)

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle)

    call.start(wake)
    try:
        await ended
    except asyncio.CancelledError:
        call.abandon()
        raise
    return call.result()


def _new_worker() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="langchain-compaction", initializer=_mark_worker)


_BREATH_SECONDS = 0.001
"""How long the worker holds the interpreter lock between offers to hand it over (``breathe``)."""
_breath = [-1, 0.0]
"""The worker thread's ident and when it next offers the lock (written by that thread, and reset after a fork)."""


def _mark_worker() -> None:
    _breath[0] = threading.get_ident()


def breathe() -> None:
    """On the library's worker thread, hand the interpreter lock over about once a millisecond.

    A thread waiting for the lock asks the holder to drop it only after a
    whole switch interval (5 ms) in which no thread took it; a worker that
    keeps releasing and retaking it on its own (each finished job wakes the
    loop through a socket write) resets that clock, so an event loop that
    woke from ``select`` waited until the worker's queue ran dry: 80-100 ms
    with 20 conversations compacting (``bench/loop_stall.py``). Releasing
    it here, in the per-message loops of the library's CPU work, lets the
    waiting loop take it; the process-wide interval is left alone. On any
    other thread (a sync caller's own) it does nothing.
    """
    if threading.get_ident() != _breath[0]:
        return
    now = time.perf_counter()
    if now >= _breath[1]:
        time.sleep(0)  # releases the lock: a waiting thread takes it
        _breath[1] = now + _BREATH_SECONDS


_WORKER = [_new_worker()]
"""The one thread that runs the library's own CPU work for async callers (a
forked child gets a new one: the parent's thread does not exist there).
Python runs one thread's bytecode at a time anyway, so one worker costs no
throughput; with a worker per call (``asyncio.to_thread``) the event loop
competes for the interpreter lock with every busy worker and waits for each
new thread to start. (The loop's worst pauses under many conversations are
the cyclic garbage collector's: ``bench/loop_stall.py``.)"""


async def compute_off_loop(function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run ``function``, CPU work of the library's own (no I/O), on the library's worker thread.

    Calls wait their turn in order; the caller's context (tracing callbacks,
    a run's config) goes with the call, as with ``asyncio.to_thread``.

    Args:
        function: What to run; it must not wait on the network or on another
            call to this function (every later call would wait behind it).
        *args: Its arguments.
        **kwargs: Its keyword arguments.

    Returns:
        What it returns.
    """
    context = contextvars.copy_context()
    call = functools.partial(context.run, function, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_WORKER[0], call)


def in_forked_child(renew: Callable[[], None]) -> Callable[[], None]:
    """Run ``renew`` in a forked child (a decorator): the threads of the parent did not come along.

    Locks they held stay held, and work they were doing never finishes; a
    module renews its own there. (Not on Windows, which does not fork.)
    """
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=renew)
    return renew


@in_forked_child
def _after_fork_in_child() -> None:
    _breath[0] = -1  # the parent's worker is gone; the new one marks itself when it starts
    _WORKER[0] = _new_worker()


def twin(sync: Callable[..., _T], asynchronous: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any) -> Call[_T]:
    """A step made by ``sync(*args, **kwargs)``, or awaited as ``asynchronous(*args, **kwargs)``."""
    return Call(functools.partial(sync, *args, **kwargs), functools.partial(asynchronous, *args, **kwargs))


async def _now(function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    return function(*args, **kwargs)


def inline(function: Callable[..., _T], *args: Any, **kwargs: Any) -> Call[_T]:
    """A step made by ``function`` in place on both paths (it is quick and never blocks)."""
    return Call(functools.partial(function, *args, **kwargs), functools.partial(_now, function, *args, **kwargs))


def blocking(function: Callable[..., _T], *args: Any, **kwargs: Any) -> Call[_T]:
    """A step made by ``function`` in place, or in a worker thread on the async path."""
    return Call(functools.partial(function, *args, **kwargs), functools.partial(off_loop, function, *args, **kwargs))


def computing(function: Callable[..., _T], *args: Any, **kwargs: Any) -> Call[_T]:
    """``blocking`` for CPU work of the library's own: on the async path it runs on the library's worker thread."""
    return Call(
        functools.partial(function, *args, **kwargs), functools.partial(compute_off_loop, function, *args, **kwargs)
    )


def refuse_awaitable(result: _T, function: object, field: str, fix: str) -> _T:
    """What a user's function returned on the sync path, where an awaitable cannot be awaited.

    Args:
        result: What ``function`` returned.
        function: The user's function (named in the error).
        field: The argument it was passed as.
        fix: What to do instead, e.g. ``"pass a plain function, or use ainvoke"``.

    Returns:
        ``result``, when it is not awaitable.

    Raises:
        ConfigurationError: ``result`` is awaitable: ``function`` is async, and
            on the sync path its body would never run. The awaitable is closed
            first, so no "never awaited" warning follows the error.
    """
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise ConfigurationError(field, function, f"an async function cannot run on the sync path; {fix}")
    return result


def _called(function: Callable[..., Any], args: tuple[Any, ...], field: str, fix: str) -> Any:
    return refuse_awaitable(function(*args), function, field, fix)


async def _acalled(function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    result = function(*args)
    return await result if inspect.isawaitable(result) else result


def user_call(function: Callable[..., Any], *args: Any, field: str, fix: str) -> Call[Any]:
    """A step calling a user's function, plain or ``async``, in place.

    On the async path an awaitable it returns is awaited; on the sync path it
    is refused (``refuse_awaitable``), since nothing there could await it.
    """
    return Call(functools.partial(_called, function, args, field, fix), functools.partial(_acalled, function, args))


def drive(flow: Flow[_T]) -> _T:
    """Run ``flow`` with blocking calls; return what it returns.

    Example:
        >>> def flow():
        ...     x = yield blocking(len, "abc")
        ...     return x * 2
        >>> drive(flow())
        6
    """
    try:
        step = next(flow)
        while True:
            try:
                value = step.run()
            except Exception as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        flow.close()


async def adrive(flow: Flow[_T]) -> _T:
    """Run ``flow`` with awaited calls; see ``drive``."""
    try:
        step = next(flow)
        while True:
            try:
                value = await step.arun()
            except Exception as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        flow.close()
