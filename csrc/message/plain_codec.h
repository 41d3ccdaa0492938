#pragma once

// A compact binary form for the IValues that nearly every call and result
// is made of: None, bool, int, float, str, tensors (by index into the
// message's tensor list, as the pickle's), tuples, lists of int, float,
// bool, str or tensors, and dicts keyed by str or int. torch::jit::pickle
// took about a tenth of a tiny call's CPU on each side (its memo tables,
// globals and type tags); this walks the value once.
//
// Anything else (objects such as RRefs, devices, complex numbers, nested
// container types, the same tensor or container twice) is pickled as
// before, so what a value decodes to is what its pickle would: the same
// types, container type tags included.
//
// Format: kMagic, then one value: a tag byte and its body, integers little
// endian; counts and lengths are u32. A peer's bytes are checked as they are
// read: every length against what is left, every tensor index against the
// tensor list, the nesting depth against kMaxDepth, and every element of a
// typed list or dict against its type.

#include <ATen/core/ivalue.h>

#include <string>
#include <string_view>
#include <vector>

namespace torchrpc::message {

// The first two bytes of a plain payload (a pickle starts with 0x80).
inline constexpr char kPlainMagic[2] = {'\0', 'P'};

// Appends `value` to `out` (after kPlainMagic) and its tensors to `tensors`;
// false, with both left as they were, when the value holds anything this
// form does not carry (pickle it instead).
bool encodePlain(const c10::IValue& value, std::string& out, std::vector<at::Tensor>& tensors);

// Whether `payload` is in this form (else it is a pickle).
bool isPlain(std::string_view payload);

// Decodes a plain payload into `value`; "" or what is wrong with it.
std::string decodePlain(std::string_view payload, const std::vector<at::Tensor>& tensors, c10::IValue& value);

}  // namespace torchrpc::message
