#pragma once

#include <pybind11/pybind11.h>

namespace torchrpc::bindings {

// Adds TorchBackendAgent, the TORCHRPC backend's agent, to the module.
void registerTorchBackend(pybind11::module& m);

}  // namespace torchrpc::bindings
