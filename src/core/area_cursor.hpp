// Lays arrays out one after another in one allocation, each on an `align`-byte boundary: by default 128
// (so rows can be moved with 16-byte vectors and no two arrays share a cache line).
#pragma once

#include <cstddef>

namespace epx::core {

class AreaCursor {
 public:
  explicit AreaCursor(std::size_t align = 128) : align_(align) {}

  // The offset of a new array of `bytes`.
  std::size_t take(std::size_t bytes) {
    const std::size_t at = round_up(cursor_);
    cursor_ = at + bytes;
    return at;
  }
  // The allocation's size: everything taken, rounded up.
  std::size_t end() const { return round_up(cursor_); }

 private:
  std::size_t round_up(std::size_t n) const { return (n + align_ - 1) / align_ * align_; }
  std::size_t align_;
  std::size_t cursor_ = 0;
};

}  // namespace epx::core
