#pragma once

// Intra-op threads of the threads torchrpc creates.
//
// Torch's CPU ops split large work over an OpenMP team of at::get_num_threads()
// threads (the number of cores by default), one team per thread that starts a
// parallel region. Once a second thread (a callee's pool thread next to the
// main thread) has a team, libgomp counts more threads than cores and stops
// spinning between regions for every team: each region then pays futex
// wake-ups. Measured on 2 cores: the same ops took 8x longer in a second
// thread, and an LSTM's backward pass 10x (5.4 vs 0.5 ms).
//
// So by default a torchrpc thread runs ops on itself alone: callees get their
// parallelism from serving calls concurrently. TORCHRPC_INTRA_OP_THREADS=n
// gives each torchrpc thread n intra-op threads instead (0 keeps torch's
// setting).

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
    return v != nullptr ? std::atoi(v) : 1;
  }();
  return n;
}

// Call once at the start of every thread torchrpc creates that may run ops.
inline void initIntraOpThreads() {
  const int n = intraOpThreads();
  if (n <= 0) return;
  // Torch initialises a thread's count lazily, at its first parallel op, from
  // the global setting; get_num_threads() does that now, so it cannot later
  // undo what follows.
  (void)at::get_num_threads();
  if (omp_set_num_threads) omp_set_num_threads(n);
  if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(n);
}

}  // namespace torchrpc::common
