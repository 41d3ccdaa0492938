"""A call in flight on the caller: :class:`Invocation` (what rpc_sync waits
on) and :class:`InvocationFuture` (what rpc_async returns)."""

import traceback
import weakref

import torch

from torchrpc import errors, state
from torchrpc._extension import native


def plain(value):
    """The decode of a call whose response value is its result (a TorchScript,
    builtin or exported callee): such a future is completed natively."""
    return value


def _in_callback():
    # On a callback thread a future's completion or callback is running, so
    # a future it waits for must be settled here: that thread would do it.
    return native().on_callback_thread()


class Invocation:
    """One call in flight: the native Call, and how to decode its value. A
    call that can be resent with the function itself, when the callee does
    not know it (a Python function it has not cached, a TorchScript function
    it lacks), overrides :meth:`resend`.

    Each rpc_async keeps a few of these objects alive while it is in flight;
    Python's garbage collector walks them all (and, once they reach the old
    generation, the whole heap), so a call makes as few as it can: this
    object, its ``_Pending``, its future and that future's weak reference."""

    __slots__ = ("call", "decode", "_pending", "_future", "__weakref__")

    def __init__(self, call, decode):
        self.call = call
        self.decode = decode
        self._pending = None  # see _complete()
        self._future = None

    def resend(self):
        """The call sent again with its function, or None when it cannot be."""
        return None

    def _outcome(self):
        ok, value = self.call.result()
        if not ok and value[2] == errors.UnknownFunctionError.REMOTE_TYPE:
            again = self.resend()
            if again is not None:
                return None, again
        if not ok:
            raise errors.from_native(value)
        return self.decode(value), None

    def wait(self):
        value, again = self._outcome()
        return again.wait() if again is not None else value

    def future(self):
        fut = InvocationFuture()
        self._complete(fut)
        return fut

    def _complete(self, fut):
        # `pending` holds the right to settle fut in Python: whoever pops this
        # invocation from it first (the callback thread calling it, or a
        # waiting thread) settles; list.pop is atomic under the GIL. It also
        # holds this call (and so its arguments, for a resend, and fut); the
        # future refers to the call weakly. A `pending` that will not run may
        # sit in its queue a while, and then holds nothing. A plain value
        # completes fut natively instead, on a callback thread of its own,
        # without the GIL, which empties `pending` later
        # (Call.add_done_callback); the call's settle token decides between
        # that and Python.
        pending = self._pending = _Pending((self,))
        self._future = fut
        fut._invocation = weakref.ref(self)
        native_target = fut if self.decode is plain else None
        self.call.add_done_callback(state.callbacks(), pending, native_target, pending, fut._callbacks_added)

    def settle(self, fut):
        """Completes fut with this call's outcome (or hands it to the resent
        call), unless another thread took that over first; returns whether
        this thread did."""
        if _take(self._pending) is None:
            return False
        self._settle()
        return True

    def _settle(self):
        fut = self._future
        self._pending = self._future = None
        if not self.call.take_settle():
            return  # completed natively
        try:
            value, again = self._outcome()
        except BaseException as exc:
            fut._invocation = None
            # Without this frame's traceback: it references `fut`, which
            # holds exc in C++ where gc cannot see the cycle, and it would
            # keep the call's arguments (RRefs too) alive forever.
            _fail(fut, exc.with_traceback(None))
            return
        if again is not None:
            again._complete(fut)
        else:
            fut._invocation = None
            fut.set_result(value)


class _Pending(list):
    """The invocation whose future is still to be settled in Python (one
    item, or none once taken); the callback thread calls it when the call
    completes. One object serves as that callback and as the list the
    native completion empties."""

    __slots__ = ()

    def __call__(self):
        invocation = _take(self)
        if invocation is not None:
            invocation._settle()


def _fail(fut, exc):
    """Fails `fut` with `exc` as an error of its C++ future (so wait_all and
    collect_all stop at it), not as a value that wait() raises."""
    native().set_future_error(fut, exc)


def _take(pending):
    """The invocation still in `pending`, taken out, or None."""
    try:
        return pending.pop() if pending else None
    except IndexError:  # another thread took it between the test and the pop
        return None


_future_init = torch._C.Future.__init__


class InvocationFuture(torch.futures.Future):
    """rpc_async's future. A thread that waits for it settles it itself;
    otherwise a torchrpc callback thread does. A waiter then needs no
    hand-over from that thread (a wake-up and the GIL), so
    ``rpc_async(...).wait()`` costs about what rpc_sync does, also while
    that thread is busy. Once a callback has been added, only the callback
    thread settles it, so callbacks keep running there; a callback that
    waits for another call (or for a future chained to one with ``then``)
    is on that thread, so it settles that call itself instead of waiting
    for itself."""

    # A weak reference to the call that settles it, None once settled: a
    # slot, so that a future in flight has no __dict__ for the collector to walk.
    __slots__ = ("_invocation",)
    _callbacks_added = False

    def __init__(self):
        # torch.futures.Future's own __init__ only converts `devices` (none
        # here: CPU values), in Python; this skips that frame on every call.
        _future_init(self, ())

    def wait(self):
        self._drive()
        native().wait_for_future(self)  # on the main thread, Ctrl-C ends it
        return super().wait()

    def _drive(self):
        """Settles this future on this thread when it may (see the class)."""
        inv = self._call()
        while inv is not None and (not self._callbacks_added or _in_callback()) and not self.done():
            # Returns once the call is done (polls, then sleeps, without the
            # GIL). If it completed before this thread claimed it, its
            # completion is queued on the callback thread, which may be busy:
            # this thread settles it anyway, unless that thread took it over.
            try:
                inv.call.claim_and_wait()
            except BaseException:  # Ctrl-C: the callback thread settles it again
                if inv.call.unclaim():
                    inv.settle(self)  # it may have passed this call by meanwhile
                raise
            if not inv.settle(self):
                break
            inv = self._call()  # the resent call, or None

    def _call(self):
        ref = self._invocation
        return None if ref is None else ref()

    def then(self, callback):
        self._callbacks_coming()
        return _chain(self, callback)

    def add_done_callback(self, callback):
        self._callbacks_coming()
        super().add_done_callback(callback)

    def _callbacks_coming(self):
        # Python callbacks run in the order they were added: a future that
        # has them is completed under the GIL (Call.callbacks_coming).
        self._callbacks_added = True
        inv = self._call()
        if inv is not None:
            inv.call.callbacks_coming()


class _ChainedFuture(torch.futures.Future):
    """What ``then`` returns: completed with the callback's value (or its
    exception) when the future it follows completes. Waited for inside a
    callback, it drives that future first (InvocationFuture._drive)."""

    _parent = None

    def wait(self):
        self._drive()
        native().wait_for_future(self)
        return super().wait()

    def _drive(self):
        if self._parent is not None and not self.done():
            self._parent._drive()

    def then(self, callback):
        return _chain(self, callback)


def _chain(parent, callback):
    if not callable(callback):  # torch's then refuses it (pybind's words, which code matches on)
        raise TypeError(f"then(): incompatible function arguments. The callback must be callable; got "
                        f"{type(callback).__name__}")
    child = _ChainedFuture()
    child._parent = parent

    def run(done):
        child._parent = None
        try:
            value = callback(done)
        except Exception as exc:  # as torch's then reports it (a RuntimeError), caused by exc
            error = RuntimeError(f"Got the following error when running the callback: {type(exc).__name__}: {exc}")
            # The callback's traceback as text: its frames, and the frames
            # that called them (perhaps the waiting thread's own), would stay
            # alive for as long as `child` holds `error`, in C++, where the
            # garbage collector cannot see.
            exc.add_note("Callback traceback (most recent call last):\n" +
                         "".join(traceback.format_tb(exc.__traceback__.tb_next)).rstrip())
            error.__cause__ = exc.with_traceback(None)
            _fail(child, error)
            return
        child.set_result(value)

    torch.futures.Future.add_done_callback(parent, run)
    return child
