// common/slot_free_list.h — which of a fixed set of host slots (blocks of
// staging memory) are free, handed out lowest first so that the slots of one
// request tend to be adjacent and their copies merge.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <vector>

#include "common/check.h"

namespace baton {

class SlotFreeList {
 public:
  // Slots [first, first + count), all free.
  SlotFreeList(int32_t first, int32_t count) : free_(size_t(count)) {
    std::iota(free_.rbegin(), free_.rend(), first);  // the lowest last: taken first
  }

  int32_t free() const { return int32_t(free_.size()); }
  // `n` free slots (at most free()), the lowest first.
  std::vector<int32_t> take(int32_t n) {
    BATON_CHECK(n >= 0 && n <= free());
    std::vector<int32_t> taken(free_.rbegin(), free_.rbegin() + n);
    free_.resize(free_.size() - size_t(n));
    return taken;
  }
  void give_back(std::span<const int32_t> slots) {
    free_.insert(free_.end(), slots.begin(), slots.end());
    std::sort(free_.begin(), free_.end(), std::greater<>());
  }

 private:
  std::vector<int32_t> free_;  // the lowest last
};

}  // namespace baton
