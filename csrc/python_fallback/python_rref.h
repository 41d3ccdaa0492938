#pragma once

// The Python side of RRefs: Python objects as an owner's values, to_here()
// of them, and proxies' method calls. (remote() of a Python callable runs
// through the PYTHON_CALL handler, run_python.h.) Part of the bridge: the
// only C++ that takes the GIL.

#include <pybind11/pybind11.h>

#include <ATen/core/ivalue.h>

#include <optional>

#include "rref/rref_context.h"

namespace torchrpc::python_fallback {

// encoder(value[, name]) returns ("ok", payload: bytes, tensors) or the "err" tuple.
// methodRunner(object, name, args: tuple, kwargs: dict) calls object.name(...)
//   for RREF_METHOD_CALL; returns ("value", result, label) (sent as an IValue
//   if plainIValue takes it, else pickled with encoder(result, label)), or
//   ("err", ...), ("async", future).
void installRRefPython(rref::RRefContext& ctx, pybind11::object encoder, pybind11::object methodRunner);

// A Python object as an IValue (PyObject tag); call with the GIL held.
c10::IValue pyObjectIValue(pybind11::object obj);

// A plain Python value as the IValue that converts back to an equal Python
// value of the same type, or nullopt when only a pickle would keep it: exact
// int (64 bits), float, bool, str, None, CPU strided tensors of exact type
// torch.Tensor, tuples of plain values, and non-empty lists and str-keyed
// dicts of one exact element type (tensor, int, float, bool or str). A
// tensor that requires grad is plain only if `grads` (gradsRecorded()).
// The one check of RRef proxies (both ends), and several times cheaper than
// torch::jit::toIValue(obj, AnyType), which infers a full type first. Needs
// the GIL.
// Containers nested deeper than kMaxPlainDepth are not plain.
constexpr int kMaxPlainDepth = 64;
std::optional<c10::IValue> plainIValue(const pybind11::handle& obj, bool grads, int depth = 0);

// Whether a tensor that requires grad, sent from this thread as an IValue,
// arrives requiring grad: grad mode is on in a distributed autograd context,
// whose recording gives it its history. Otherwise only a pickle carries
// requires_grad.
bool gradsRecorded();

}  // namespace torchrpc::python_fallback
