#include "message/plain_codec.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/jit_type.h>

#include <cstdint>
#include <cstring>

namespace torchrpc::message {

namespace {

constexpr int kMaxDepth = 64;
// Containers and tensors held more than once are tracked to keep aliasing
// as the pickle does (by falling back to it); past this many, pickle anyway.
constexpr size_t kMaxShared = 256;

enum Tag : uint8_t { kNone, kFalse, kTrue, kInt, kFloat, kStr, kTensor, kTuple, kList, kDict };
// The element type of a list, or the key or value type of a dict.
enum Kind : uint8_t { kAnyKind, kIntKind, kFloatKind, kBoolKind, kStrKind, kTensorKind, kKinds };

int kindOf(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::AnyType: return kAnyKind;
    case c10::TypeKind::IntType: return kIntKind;
    case c10::TypeKind::FloatType: return kFloatKind;
    case c10::TypeKind::BoolType: return kBoolKind;
    case c10::TypeKind::StringType: return kStrKind;
    case c10::TypeKind::TensorType: return kTensorKind;
    default: return -1;
  }
}

c10::TypePtr typeOf(uint8_t kind) {
  switch (kind) {
    case kIntKind: return c10::IntType::get();
    case kFloatKind: return c10::FloatType::get();
    case kBoolKind: return c10::BoolType::get();
    case kStrKind: return c10::StringType::get();
    case kTensorKind: return c10::TensorType::get();
    default: return c10::AnyType::get();
  }
}

bool holds(uint8_t kind, const c10::IValue& v) {
  switch (kind) {
    case kIntKind: return v.isInt();
    case kFloatKind: return v.isDouble();
    case kBoolKind: return v.isBool();
    case kStrKind: return v.isString();
    case kTensorKind: return v.isTensor();
    default: return true;
  }
}

class Encoder {
 public:
  Encoder(std::string& out, std::vector<at::Tensor>& tensors) : out_(out), tensors_(tensors) {}

  bool value(const c10::IValue& v, int depth) {
    if (depth > kMaxDepth) return false;
    if (v.isNone()) return byte(kNone);
    if (v.isBool()) return byte(v.toBool() ? kTrue : kFalse);
    if (v.isInt()) return byte(kInt) && u64(static_cast<uint64_t>(v.toInt()));
    if (v.isDouble()) {
      uint64_t bits;
      const double d = v.toDouble();
      std::memcpy(&bits, &d, sizeof(bits));
      return byte(kFloat) && u64(bits);
    }
    if (v.isString()) {
      const std::string& s = v.toStringRef();
      if (!byte(kStr) || !u32(s.size())) return false;
      out_.append(s);
      return true;
    }
    if (v.isTensor()) {
      if (!distinct(v) || !byte(kTensor) || !u32(tensors_.size())) return false;
      tensors_.push_back(v.toTensor());
      return true;
    }
    if (v.isTuple()) {
      const auto& elements = v.toTupleRef().elements();
      return byte(kTuple) && u32(elements.size()) && all(elements, kAnyKind, depth);
    }
    if (v.isList()) {
      const int kind = kindOf(v.toList().elementType());
      const auto elements = v.toListRef();
      return kind >= 0 && distinct(v) && byte(kList) && byte(kind) && u32(elements.size()) &&
             all(elements, kind, depth);
    }
    if (v.isGenericDict()) {
      if (!distinct(v)) return false;  // before the copy below adds a reference
      const auto dict = v.toGenericDict();
      const int key = kindOf(dict.keyType()), value = kindOf(dict.valueType());
      if ((key != kStrKind && key != kIntKind) || value < 0) return false;
      if (!byte(kDict) || !byte(key) || !byte(value) || !u32(dict.size())) return false;
      for (const auto& entry : dict) {
        if (!holds(key, entry.key()) || !holds(value, entry.value())) return false;
        if (!this->value(entry.key(), depth + 1) || !this->value(entry.value(), depth + 1)) return false;
      }
      return true;
    }
    return false;  // objects (RRefs), devices, complex, futures, ...: pickled
  }

 private:
  bool all(c10::ArrayRef<c10::IValue> elements, int kind, int depth) {
    for (const auto& e : elements) {
      if (!holds(kind, e) || !value(e, depth + 1)) return false;
    }
    return true;
  }

  // False if `v`, a tensor or mutable container, was already written: the
  // pickle would decode both places as one object.
  bool distinct(const c10::IValue& v) {
    if (v.use_count() <= 1) return true;
    const void* p = v.internalToPointer();
    for (const void* seen : shared_) {
      if (seen == p) return false;
    }
    if (shared_.size() == kMaxShared) return false;
    shared_.push_back(p);
    return true;
  }

  bool byte(uint8_t b) {
    out_.push_back(static_cast<char>(b));
    return true;
  }
  bool u32(size_t n) {
    if (n > UINT32_MAX) return false;
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    return true;
  }
  bool u64(uint64_t n) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    return true;
  }

  std::string& out_;
  std::vector<at::Tensor>& tensors_;
  std::vector<const void*> shared_;
};

class Decoder {
 public:
  Decoder(std::string_view in, const std::vector<at::Tensor>& tensors) : in_(in), tensors_(tensors) {}

  bool value(c10::IValue& v, int depth) {
    if (depth > kMaxDepth) return fail("nested deeper than " + std::to_string(kMaxDepth));
    uint8_t tag;
    if (!byte(tag)) return false;
    switch (tag) {
      case kNone: v = c10::IValue(); return true;
      case kFalse: v = false; return true;
      case kTrue: v = true; return true;
      case kInt: {
        uint64_t n;
        if (!u64(n)) return false;
        v = static_cast<int64_t>(n);
        return true;
      }
      case kFloat: {
        uint64_t bits;
        if (!u64(bits)) return false;
        double d;
        std::memcpy(&d, &bits, sizeof(d));
        v = d;
        return true;
      }
      case kStr: {
        uint32_t n;
        if (!u32(n) || !need(n)) return false;
        v = std::string(in_.substr(pos_, n));
        pos_ += n;
        return true;
      }
      case kTensor: {
        uint32_t index;
        if (!u32(index)) return false;
        if (index >= tensors_.size()) {
          return fail("tensor " + std::to_string(index) + " of " + std::to_string(tensors_.size()));
        }
        v = tensors_[index];
        return true;
      }
      case kTuple: {
        uint32_t n;
        if (!count(n, 1)) return false;
        std::vector<c10::IValue> elements(n);
        for (auto& e : elements) {
          if (!value(e, depth + 1)) return false;
        }
        v = c10::ivalue::Tuple::create(std::move(elements));
        return true;
      }
      case kList: {
        uint8_t kind;
        uint32_t n;
        if (!kindByte(kind) || !count(n, 1)) return false;
        c10::impl::GenericList list(typeOf(kind));
        list.reserve(n);
        for (uint32_t i = 0; i < n; ++i) {
          c10::IValue e;
          if (!element(kind, e, depth)) return false;
          list.push_back(std::move(e));
        }
        v = std::move(list);
        return true;
      }
      case kDict: {
        uint8_t key, kind;
        uint32_t n;
        if (!kindByte(key) || !kindByte(kind) || !count(n, 2)) return false;
        if (key != kStrKind && key != kIntKind) return fail("a dict keyed by kind " + std::to_string(key));
        c10::impl::GenericDict dict(typeOf(key), typeOf(kind));
        dict.reserve(n);
        for (uint32_t i = 0; i < n; ++i) {
          c10::IValue k, e;
          if (!element(key, k, depth) || !element(kind, e, depth)) return false;
          dict.insert_or_assign(std::move(k), std::move(e));
        }
        v = std::move(dict);
        return true;
      }
      default:
        return fail("unknown tag " + std::to_string(tag));
    }
  }

  bool finished() { return pos_ == in_.size() || fail(std::to_string(in_.size() - pos_) + " bytes after the value"); }
  std::string error() const { return error_; }

 private:
  bool element(uint8_t kind, c10::IValue& e, int depth) {
    if (!value(e, depth + 1)) return false;
    return holds(kind, e) || fail("a " + typeOf(kind)->annotation_str() + " container holds a " + e.tagKind());
  }

  bool fail(const std::string& what) {
    if (error_.empty()) error_ = what + " (at byte " + std::to_string(pos_) + ")";
    return false;
  }
  bool need(size_t n) {
    return n <= in_.size() - pos_ || fail("declares " + std::to_string(n) + " bytes, " +
                                          std::to_string(in_.size() - pos_) + " left");
  }
  // An element count: each element takes at least `bytesEach` bytes.
  bool count(uint32_t& n, size_t bytesEach) {
    if (!u32(n)) return false;
    return static_cast<size_t>(n) * bytesEach <= in_.size() - pos_ ||
           fail("declares " + std::to_string(n) + " elements, " + std::to_string(in_.size() - pos_) + " bytes left");
  }
  bool kindByte(uint8_t& kind) { return byte(kind) && (kind < kKinds || fail("unknown kind " + std::to_string(kind))); }
  bool byte(uint8_t& b) {
    if (!need(1)) return false;
    b = static_cast<uint8_t>(in_[pos_++]);
    return true;
  }
  bool u32(uint32_t& n) {
    uint64_t wide;
    if (!little(wide, 4)) return false;
    n = static_cast<uint32_t>(wide);
    return true;
  }
  bool u64(uint64_t& n) { return little(n, 8); }
  bool little(uint64_t& n, int bytes) {
    if (!need(bytes)) return false;
    n = 0;
    for (int i = 0; i < bytes; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(in_[pos_ + i])) << (8 * i);
    pos_ += bytes;
    return true;
  }

  std::string_view in_;
  size_t pos_ = sizeof(kPlainMagic);
  const std::vector<at::Tensor>& tensors_;
  std::string error_;
};

}  // namespace

bool encodePlain(const c10::IValue& value, std::string& out, std::vector<at::Tensor>& tensors) {
  const size_t bytesBefore = out.size(), tensorsBefore = tensors.size();
  out.append(kPlainMagic, sizeof(kPlainMagic));
  if (Encoder(out, tensors).value(value, 0)) return true;
  out.resize(bytesBefore);
  tensors.resize(tensorsBefore);
  return false;
}

bool isPlain(std::string_view payload) {
  return payload.size() >= sizeof(kPlainMagic) && std::memcmp(payload.data(), kPlainMagic, sizeof(kPlainMagic)) == 0;
}

std::string decodePlain(std::string_view payload, const std::vector<at::Tensor>& tensors, c10::IValue& value) {
  if (!isPlain(payload)) return "not a plain payload";
  Decoder decoder(payload, tensors);
  if (decoder.value(value, 0) && decoder.finished()) return "";
  return decoder.error();
}

}  // namespace torchrpc::message
