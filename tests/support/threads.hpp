// Test helpers for the engine's threads: a thread count for one scope, and
// waking the pool's workers until something they do in the background is done.
#pragma once

#include <chrono>
#include <cstddef>
#include <thread>

#include "engine/parallel.hpp"

namespace dpgrad::test {

/// Sets the engine's thread count for one scope.
struct ThreadsScope {
  int before;  // the count to restore
  explicit ThreadsScope(int n) : before(parallel::threads()) { parallel::set_threads(n); }
  ~ThreadsScope() { parallel::set_threads(before); }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;
};

/// Runs empty jobs (each wakes a sleeping worker, which then runs background work
/// while it waits for the next) until `done()` or ten seconds pass; returns done().
template <class Done>
bool wake_workers_until(Done done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < give_up) {
    parallel::for_range(2, 1, [](std::size_t, std::size_t) {});
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return done();
}

}  // namespace dpgrad::test
