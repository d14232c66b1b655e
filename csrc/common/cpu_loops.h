// How the CPU kernels spread work over torch's threads (their vector loops: cpu_vec.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "tensor_api.h"

namespace hotloop {

// Elements of work per at::parallel_for task (ATen's own GRAIN_SIZE, which lives
// in the heavy TensorIterator.h).
constexpr int64_t kGrainSize = 32768;

// f(task) for every task in [0, num_tasks), each thread taking the next task as it
// finishes one. parallel_for splits its range evenly once, so a thread that the OS
// deschedules (other processes on a busy machine) holds up its whole share while the
// others wait at the end; here they take that share on. The range parallel_for hands a
// thread only decides how many threads join. A task computes the same thing whichever
// thread runs it: results do not depend on timing or the thread count.
template <typename F>
void parallel_for_each_task(int64_t num_tasks, const F& f) {
  std::atomic<int64_t> next_task{0};
  parallel_for(0, num_tasks, 1, [&](int64_t /*begin*/, int64_t /*end*/) {
    // Relaxed: the tasks share no data, and the end of parallel_for publishes their writes.
    for (int64_t task = next_task.fetch_add(1, std::memory_order_relaxed); task < num_tasks;
         task = next_task.fetch_add(1, std::memory_order_relaxed)) {
      f(task);
    }
  });
}

// f(begin, end) over [0, n) in tasks of `grain` elements (rows), as parallel_for_each_task.
template <typename F>
void parallel_for_in_tasks(int64_t n, int64_t grain, const F& f) {
  const int64_t num_tasks = (n + grain - 1) / grain;
  parallel_for_each_task(num_tasks,
                         [&](int64_t task) { f(task * grain, std::min(n, (task + 1) * grain)); });
}

}  // namespace hotloop
