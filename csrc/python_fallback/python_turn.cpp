#include "python_fallback/python_turn.h"

#include <condition_variable>
#include <mutex>

namespace torchrpc::python_fallback {

namespace {

using Clock = std::chrono::steady_clock;

std::mutex mutex;
std::condition_variable turnOver;
int holders = 0;         // turns held now (more than 1 only past kPatience, or among short calls)
bool longCalls = false;  // the last turn lasted kLongTurn or more
thread_local int depth = 0;  // this thread's nested turns
thread_local Clock::time_point began;

void enter() {
  std::unique_lock<std::mutex> lock(mutex);
  if (longCalls) turnOver.wait_for(lock, PythonTurn::kPatience, [] { return holders == 0; });
  ++holders;
  began = Clock::now();
}

void leave() {
  const bool wasLong = Clock::now() - began >= PythonTurn::kLongTurn;
  {
    std::lock_guard<std::mutex> lock(mutex);
    --holders;
    longCalls = wasLong;
  }
  turnOver.notify_one();
}

}  // namespace

PythonTurn::PythonTurn() {
  if (depth++ == 0) enter();
}

PythonTurn::~PythonTurn() {
  if (--depth == 0) leave();
}

PythonTurn::Pause::Pause() : depth_(depth) {
  if (depth_ == 0) return;
  depth = 0;
  leave();
}

PythonTurn::Pause::~Pause() {
  if (depth_ == 0) return;
  enter();
  depth = depth_;
}

}  // namespace torchrpc::python_fallback
