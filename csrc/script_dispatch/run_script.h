#pragma once

// Script and builtin calls: their wire format and how the callee runs them.
// Everything here is C++ only and never takes the GIL.
//
//   SCRIPT_CALL  payload = (name: str, module_hint: str, args: tuple)
//   BUILTIN_CALL payload = (schema_name: str, args: tuple)   e.g. "aten::add.Tensor"
//   response     SCRIPT_RET (the result IValue) or EXCEPTION
//
// Arguments arrive already matched to the schema by the caller (full stack,
// defaults filled in); the callee checks them again, so a wrong or stale
// caller gets an error naming the function and the argument, never a crash.

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/stack.h>

#include "message/message.h"
#include "script_dispatch/registry.h"

namespace torchrpc::script_dispatch {

Message scriptCallMessage(const std::string& name, const std::string& moduleHint,
                          std::vector<c10::IValue> stack);
Message builtinCallMessage(const std::string& schemaName, std::vector<c10::IValue> stack);

// Runs a SCRIPT_CALL or BUILTIN_CALL. `respond` is called exactly once, with
// SCRIPT_RET or EXCEPTION, possibly later from another thread (async callee).
void run(Message&& request, Registry& registry, const TaskLauncher& launcher,
         const std::string& workerName, std::function<void(Message&&)> respond);

}  // namespace torchrpc::script_dispatch
