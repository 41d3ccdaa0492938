#pragma once

// The Python side of RRefs: runs remote() of Python callables on the owner
// (keeping the result as a Python object inside an IValue) and encodes Python
// values for to_here(). Part of the bridge: the only C++ that takes the GIL.

#include <pybind11/pybind11.h>

#include <ATen/core/ivalue.h>

#include "rref/rref_context.h"

namespace torchrpc::python_fallback {

// runner(payload: memoryview, tensors: list[Tensor], caller_rank: int) returns
//   ("ok", value)  or  ("err", type, message, traceback, function)
// encoder(value[, name]) returns ("ok", payload: bytes, tensors) or the "err" tuple.
// methodRunner(object, name, args: tuple, kwargs: dict) calls object.name(...)
//   for RREF_METHOD_CALL; returns ("value", result) for a result of plain
//   types (sent as an IValue), or ("ok", ...), ("err", ...), ("async", future).
void installRRefPython(rref::RRefContext& ctx, pybind11::object runner, pybind11::object encoder,
                       pybind11::object methodRunner);

// A Python object as an IValue (PyObject tag); call with the GIL held.
c10::IValue pyObjectIValue(pybind11::object obj);

// A plain Python value (torchrpc.python_fallback.plain: tensors, int, float,
// bool, str, None, tuples, and lists and str-keyed dicts of one kind) as the
// IValue that converts back to an equal Python value; throws on anything
// else. Several times cheaper than torch::jit::toIValue(obj, AnyType), which
// infers a full type first (34 us of a proxy call in a training loop).
// Needs the GIL.
c10::IValue plainIValue(const pybind11::handle& obj);

}  // namespace torchrpc::python_fallback
