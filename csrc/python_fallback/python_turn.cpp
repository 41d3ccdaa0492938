#include "python_fallback/python_turn.h"

#include <atomic>
#include <mutex>

namespace torchrpc::python_fallback {

namespace {

using Clock = std::chrono::steady_clock;

std::timed_mutex turn;             // held by the call whose turn it is
std::atomic<bool> longCalls{false};  // the last call lasted kLongTurn or more
thread_local int depth = 0;          // this thread's nested turns
thread_local bool inCall = false;    // in a call that counts (not paused, not given up)
thread_local bool holding = false;   // holds `turn` (not after kPatience, nor among short calls)
thread_local bool always = false;    // its outermost turn is PythonTurn::When::kAlways
thread_local Clock::time_point began;

void enter() {
  holding = (always || longCalls.load(std::memory_order_relaxed)) && turn.try_lock_for(PythonTurn::kPatience);
  inCall = true;
  began = Clock::now();
}

void leave() {
  if (!inCall) return;
  inCall = false;
  longCalls.store(Clock::now() - began >= PythonTurn::kLongTurn, std::memory_order_relaxed);
  if (holding) turn.unlock();
  holding = false;
}

}  // namespace

PythonTurn::PythonTurn(When when) {
  if (depth++ > 0) return;
  always = when == When::kAlways;
  enter();
}

PythonTurn::~PythonTurn() {
  if (--depth == 0) leave();
}

void PythonTurn::giveUp() { leave(); }

PythonTurn::Pause::Pause() : depth_(inCall ? depth : 0), always_(always) {
  if (depth_ == 0) return;
  depth = 0;
  leave();
}

PythonTurn::Pause::~Pause() {
  if (depth_ == 0) return;
  always = always_;
  enter();
  depth = depth_;
}

}  // namespace torchrpc::python_fallback
