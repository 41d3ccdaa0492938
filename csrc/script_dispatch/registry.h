#pragma once

// Registry: the callees this worker can run by name, without the GIL.
//
// Names are what callers send: an explicit name from torchrpc.register(), or
// a script function's qualified name. A miss asks the resolver (installed by
// the Python bridge, which imports the module hint and looks the function up
// under the GIL) once; the result is cached, so the hot path never touches
// Python. Builtin operators are cached here too, by schema name.

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "script_dispatch/callee.h"

namespace torchrpc::script_dispatch {

class Registry {
 public:
  // Returns a callee for the name, or nullptr; may run the resolver.
  using Resolver = std::function<std::shared_ptr<Callee>(const std::string& name,
                                                         const std::string& moduleHint)>;

  void add(const std::string& name, std::shared_ptr<Callee> callee);
  // With resolve=false, only what was added or resolved before.
  std::shared_ptr<Callee> find(const std::string& name, const std::string& moduleHint,
                               bool resolve = true);
  void setResolver(Resolver resolver);
  std::vector<std::string> names() const;
  // How many calls may run at once (the pool's threads): the model instances
  // an exported program keeps.
  void setConcurrency(size_t n) { concurrency_ = n; }
  size_t concurrency() const { return concurrency_; }

  // Operator by schema name, e.g. "aten::add.Tensor", as a callee (one per
  // name, so its runs are recorded together); nullptr if unknown. With
  // resolve=false, only one found before.
  std::shared_ptr<Callee> findOperator(const std::string& fullName, bool resolve = true);

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<Callee>> callees_;
  std::unordered_map<std::string, std::shared_ptr<Callee>> operators_;
  Resolver resolver_;
  std::mutex resolveMutex_;  // one resolution at a time (it takes the GIL anyway)
  std::atomic<size_t> concurrency_{1};
};

}  // namespace torchrpc::script_dispatch
