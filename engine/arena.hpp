// A bump allocator that a tape rewinds between steps: after the first step a training loop allocates
// nothing (the blocks of a step that outgrew the arena are merged into one at the next reset).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace tapegrad {

class Arena {
 public:
  explicit Arena(size_t block_bytes = size_t{16} << 20) : block_bytes_(block_bytes) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // 64-byte aligned, uninitialized; valid until reset().
  void* allocate(size_t bytes);
  void reset();

  size_t bytes_in_use() const;   // since the last reset
  size_t bytes_reserved() const; // held from the system
  size_t high_water() const { return high_water_; }

 private:
  struct Block {
    std::unique_ptr<std::byte, void (*)(void*)> data;
    size_t size;
  };
  std::vector<Block> blocks_;
  size_t current_ = 0;  // index of the block being filled
  size_t offset_ = 0;   // bytes used in it
  size_t block_bytes_;
  size_t high_water_ = 0;
  void add_block(size_t bytes);
};

}  // namespace tapegrad
