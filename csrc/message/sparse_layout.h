#pragma once

// Sparse tensors on the wire (tensor_layout.h): a layout code's torch layout
// and names, a sparse tensor's components in wire order, and the invariants
// both ends check them against.

#include <ATen/core/Tensor.h>

#include <vector>

#include "message/tensor_layout.h"

namespace torchrpc::message::layout {

c10::Layout torchLayout(Code code);
// As Python spells it ("torch.sparse_coo").
const char* layoutName(Code code);
// Component k of a sparse layout ("indices", "crow_indices", "values").
const char* componentName(Code code, size_t k);

// A sparse tensor's layout code and components, in wire order; false for a
// layout that cannot travel.
bool components(const at::Tensor& t, Code& code, std::vector<at::Tensor>& parts);

// The invariants of a sparse tensor's components; throws c10::Error.
void validateSparse(Code code, c10::IntArrayRef sizes, const std::vector<at::Tensor>& parts, bool coalesced);

}  // namespace torchrpc::message::layout
