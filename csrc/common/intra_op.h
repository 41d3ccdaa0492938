#pragma once

// Intra-op threads of the threads torchrpc creates.
//
// Torch's CPU ops split large work over an OpenMP team of at::get_num_threads()
// threads, one team per thread that starts a parallel region. By default a
// torchrpc thread (a callee's pool thread, the callback thread) follows
// torch's setting, as torch.distributed.rpc's threads do: a callee that runs
// a network inside its calls computes at torch's speed, and its results are
// bit-identical to torch's for the same thread count (reductions split their
// work by thread count, so 1 and 2 threads differ in the last digits).
// A torchrpc thread takes the process's setting (torch.set_num_threads,
// OMP_NUM_THREADS, else the cores) when it starts, so set it before init_rpc;
// torch's own threads take it the same way.
//
// TORCHRPC_INTRA_OP_THREADS=n gives each torchrpc thread n intra-op threads
// instead (0 or unset: torch's setting). n=1 suits a callee that serves many
// concurrent callers on few cores: once a second thread has a team, libgomp
// counts more threads than cores and stops spinning between regions for every
// team (measurements: benchmarks/HISTORY.md, "Threads").

#include <ATen/Parallel.h>

#include <cstdlib>

extern "C" {
// Weak: resolved from the OpenMP runtime and MKL that libtorch_cpu loads, if any.
void omp_set_num_threads(int) __attribute__((weak));
int MKL_Set_Num_Threads_Local(int) __attribute__((weak));  // the C entry (mkl_set_num_threads_local is Fortran's)
}

namespace torchrpc::common {

inline int intraOpThreads() {
  static const int n = [] {
    const char* v = std::getenv("TORCHRPC_INTRA_OP_THREADS");
    return v != nullptr ? std::atoi(v) : 0;
  }();
  return n;
}

// Call once at the start of every thread torchrpc creates that may run ops:
// applies torch's setting to this thread now, as torch's own threads (its
// autograd engine's, its inter-op pool's) do at their start, then
// TORCHRPC_INTRA_OP_THREADS, if set.
inline void initIntraOpThreads() {
  // Torch initialises a thread's count lazily, at its first ATen parallel
  // op; get_num_threads() does that now. Left lazy, a thread whose first
  // parallel work was oneDNN's (an LSTM, a convolution) ran it with
  // OpenMP's default, one thread per core, whatever torch.set_num_threads
  // said: its team's spinning worker took a core, and its results could
  // differ from torch's in the last digits. It also keeps torch's lazy
  // init from undoing what follows.
  (void)at::get_num_threads();
  const int n = intraOpThreads();
  if (n <= 0) return;
  if (omp_set_num_threads) omp_set_num_threads(n);
  if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(n);
}

}  // namespace torchrpc::common
