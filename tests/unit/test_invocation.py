"""torchrpc/invocation (with csrc/python_fallback/callback_runner): a future
that torchrpc failed with a Python exception raises a copy of it from each
wait(), so the frames that waited do not stay alive through the future, and
the copy keeps the type, message, attributes and cause. No worker needed."""

import errno
import gc
import weakref

import pytest
import torch

from torchrpc import errors, invocation


class _Marker:
    """Something a waiting frame holds: alive as long as that frame is."""


def _failed_future(exc):
    fut = invocation.InvocationFuture()
    fut._invocation = None  # settled: nothing left to drive
    invocation._fail(fut, exc)
    return fut


def _wait_in_a_frame(make_future, wait, markers):
    """Waits for a failed future in a frame of its own that holds a marker and
    the future; returns the error that wait raised."""
    fut = make_future()
    marker = _Marker()
    markers.append(weakref.ref(marker))
    try:
        wait(fut)
    except Exception as exc:
        return type(exc), str(exc)
    raise AssertionError("wait() did not raise")


def _remote_error():
    return errors.from_native((errors._KIND_REMOTE, "no such key", "KeyError", "Traceback (most recent call last): ..."))


def _chained_failure():
    def callback(done):
        raise ValueError("callback failed")

    parent = invocation.InvocationFuture()
    parent._invocation = None
    child = parent.then(callback)
    parent.set_result(1)
    return child


@pytest.mark.parametrize("wait", [
    pytest.param(lambda fut: fut.wait(), id="wait"),
    pytest.param(lambda fut: fut.value(), id="value"),
    pytest.param(lambda fut: torch.futures.wait_all([fut]), id="wait_all"),
    pytest.param(lambda fut: torch.futures.collect_all([fut]).wait()[0].wait(), id="collect_all"),
])
@pytest.mark.parametrize("make_future", [
    pytest.param(lambda: _failed_future(_remote_error().with_traceback(None)), id="rpc_async"),
    pytest.param(_chained_failure, id="then"),
])
def test_the_frame_that_waited_for_a_failed_future_is_freed(make_future, wait):
    markers = []
    kind, message = _wait_in_a_frame(make_future, wait, markers)
    assert issubclass(kind, (KeyError, RuntimeError)) and message
    gc.collect()
    assert markers[0]() is None, "the failed future keeps the frame that waited for it alive"


def test_each_wait_raises_a_copy_with_the_type_message_attributes_and_cause():
    original = _remote_error()
    original.__cause__ = OSError(errno.ENOENT, "missing")
    fut = _failed_future(original.with_traceback(None))
    raised = []
    for _ in range(2):
        with pytest.raises(KeyError) as info:
            fut.wait()
        raised.append(info.value)
    first, second = raised
    assert first is not second and first is not original
    for exc in raised:
        assert type(exc) is KeyError and exc.args == original.args
        assert exc.remote_type == "KeyError" and exc.remote_traceback.startswith("Traceback")
        assert exc.__notes__ == original.__notes__
        assert exc.__cause__ is original.__cause__ and exc.__cause__.errno == errno.ENOENT
    assert original.__traceback__ is None  # the stored error gained no frames


def test_a_chained_future_reports_the_callbacks_error_as_its_cause():
    with pytest.raises(RuntimeError, match="Got the following error when running the callback: "
                                           "ValueError: callback failed") as info:
        _chained_failure().wait()
    cause = info.value.__cause__
    assert isinstance(cause, ValueError) and str(cause) == "callback failed"
    assert cause.__traceback__ is None  # its frames would stay alive with the future
    assert 'in callback\n    raise ValueError("callback failed")' in cause.__notes__[-1]


class _NeedsTwo(Exception):
    def __new__(cls, a, b):
        return super().__new__(cls, a, b)


def test_a_copy_keeps_what_c_exception_types_hold_outside_their_dict():
    copy = errors.raised_copy(FileNotFoundError(errno.ENOENT, "missing", "/tmp/x"))
    assert type(copy) is FileNotFoundError and (copy.errno, copy.strerror, copy.filename) == (
        errno.ENOENT, "missing", "/tmp/x")
    stop = StopIteration(5)
    assert errors.raised_copy(stop).value == 5
    imported = ImportError("no module", name="m", path="/p")
    assert (errors.raised_copy(imported).name, errors.raised_copy(imported).path) == ("m", "/p")
    odd = _NeedsTwo(1, 2)
    assert errors.raised_copy(odd).args == (1, 2)


def test_an_exception_that_cannot_be_copied_is_raised_itself():
    class Stubborn(Exception):
        def __new__(cls, *args):
            if getattr(cls, "made", False):
                raise TypeError("only once")
            cls.made = True
            return super().__new__(cls, *args)

    original = Stubborn("x")
    assert errors.raised_copy(original) is original
