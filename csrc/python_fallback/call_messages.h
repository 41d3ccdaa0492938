#pragma once

// Call messages built from a Python caller's values (needs the GIL): the
// Python face of the message builders of script_dispatch/, jit_ops/,
// python_fallback and rref/. Arguments that do not fit the callee's schema
// are the caller's TypeError, naming the function and the argument, raised
// before anything is sent.

#include <pybind11/pybind11.h>

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "message/message.h"
#include "rref/rref.h"

namespace torchrpc::python_fallback {

// A SCRIPT_CALL of the TorchScript function `fn` (a torch.jit.ScriptFunction),
// its arguments matched to its schema here. `shipped`: None, or the (format,
// sha1, code) of script_dispatch/shipped_code.h. `asyncExecution`: `fn` is
// marked @async_execution.
message::Message scriptCallMessage(const std::string& name, const std::string& moduleHint, pybind11::handle fn,
                          const pybind11::tuple& args, const pybind11::dict& kwargs,
                          const pybind11::object& shipped, bool asyncExecution);

// A SCRIPT_CALL of a function the callee knows by `name`, or of the shipped
// code `shipped` (None, or (format, sha1, uint8 tensor or None)); the callee
// matches the arguments.
message::Message namedCallMessage(const std::string& name, const pybind11::tuple& args, const pybind11::dict& kwargs,
                         const std::string& callKind, const pybind11::object& shipped);

// A BUILTIN_CALL of the first overload of `opName` ("aten::add") that accepts
// the arguments; *schemaName gets that overload's name ("aten::add.Tensor").
message::Message builtinCallMessage(const std::string& opName, const pybind11::tuple& args, const pybind11::dict& kwargs,
                           std::string* schemaName);

// A PYTHON_CALL: a pickle of (function, arguments) and the tensors it left out.
message::Message pythonCallMessage(const pybind11::bytes& payload, std::vector<at::Tensor> tensors);

// A PYTHON_CALL of a function the callee has (by its hash, `digest`) whose
// arguments are all plain (plainIValue): (digest, name, args, kwargs) as
// IValues, in the compact form, with no pickle; nullopt when one is not.
std::optional<message::Message> plainPythonCallMessage(const pybind11::bytes& digest, const std::string& name,
                                                       const pybind11::tuple& args, const pybind11::dict& kwargs);

// An RREF_METHOD_CALL of rref's value's method `name`, when every argument is
// plain (plainIValue); nullopt when one is not (the caller then pickles).
std::optional<message::Message> methodCallMessage(const rref::RRefId& rrefId, const std::string& name,
                                         const pybind11::tuple& args, const pybind11::dict& kwargs);

}  // namespace torchrpc::python_fallback
