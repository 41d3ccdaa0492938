"""A call in flight on the caller: :class:`Invocation` (what rpc_sync waits
on) and :class:`InvocationFuture` (what rpc_async returns)."""

import torch

from torchrpc import errors, state


class Invocation:
    """One call in flight: the native Call, how to decode its value, and how
    to resend it with the function itself when the callee does not know it
    (a Python function it has not cached, a TorchScript function it lacks)."""

    __slots__ = ("call", "decode", "resend", "_pending")

    def __init__(self, call, decode, resend=None):
        self.call = call
        self.decode = decode
        self.resend = resend
        self._pending = None  # see _complete()

    def _outcome(self):
        ok, value = self.call.result()
        if not ok and self.resend is not None and value[2] == errors.UnknownFunctionError.REMOTE_TYPE:
            return None, self.resend()
        if not ok:
            raise errors.from_native(value)
        return self.decode(value), None

    def wait(self):
        value, again = self._outcome()
        return again.wait() if again is not None else value

    def future(self):
        fut = InvocationFuture()
        fut._invocation = self
        self._complete(fut)
        return fut

    def _complete(self, fut):
        # The callback thread runs `done` unless a waiting thread claimed the
        # call first (Call.claim_and_wait); a `done` that will not run may sit
        # in its queue a while, so settle() empties `pending` and it holds
        # nothing (no arguments, no future).
        pending = self._pending = [self, fut]

        def done():
            if pending:
                invocation, future = pending
                invocation.settle(future)

        self.call.add_done_callback(state.callbacks(), done)

    def settle(self, fut):
        """Completes fut with this call's outcome, or hands it to the resent call."""
        if self._pending is not None:
            self._pending.clear()
            self._pending = None
        try:
            value, again = self._outcome()
        except BaseException as exc:
            fut._invocation = None
            # Without this frame's traceback: it references `fut`, which
            # holds exc in C++ where gc cannot see the cycle, and it would
            # keep the call's arguments (RRefs too) alive forever.
            fut.set_exception(exc.with_traceback(None))
            return
        if again is not None:
            fut._invocation = again
            again._complete(fut)
        else:
            fut._invocation = None
            fut.set_result(value)


class InvocationFuture(torch.futures.Future):
    """rpc_async's future. A thread that waits for it settles it itself, if
    it claims the call before the call completes; otherwise the torchrpc
    callback thread does. A waiter then needs no hand-over from that thread
    (a wake-up and the GIL), so ``rpc_async(...).wait()`` costs about what
    rpc_sync does. Once a callback has been added, only the callback thread
    settles it, so callbacks keep running there."""

    _invocation = None  # the call that settles it; None once settled
    _callbacks_added = False

    def wait(self):
        inv = self._invocation
        while inv is not None and not self._callbacks_added and not self.done():
            if not inv.call.claim_and_wait():  # polls, then sleeps; without the GIL
                break  # the call completed first: the callback thread settles it
            inv.settle(self)
            inv = self._invocation  # the resent call, or None
        return super().wait()

    def then(self, callback):
        self._callbacks_added = True
        return super().then(callback)

    def add_done_callback(self, callback):
        self._callbacks_added = True
        super().add_done_callback(callback)
