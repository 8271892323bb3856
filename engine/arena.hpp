// A bump allocator that a tape rewinds between steps: after the first step a training loop allocates
// nothing (the blocks of a step that outgrew the arena are merged into one at the next reset).
//
// Blocks are mapped from the kernel (mmap), not taken from malloc: unmapping a block gives its pages back at
// once, so the blocks a merge replaces and the arena of a destroyed tape leave the resident set (glibc keeps
// freed heap blocks it cannot trim, and after a large free serves even megabyte blocks from that heap) — all but
// 8 MiB of them in the whole process, kept for the next arena (arena.cpp: a tape made per evaluation of an op).
// Pages are resident only once touched: the unused tail of a block costs address space, not memory.
#pragma once

#include <cstddef>
#include <vector>

namespace tapegrad {

class Arena {
 public:
  explicit Arena(size_t block_bytes = size_t{16} << 20) : block_bytes_(block_bytes) {}
  ~Arena() { release_blocks(); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // 64-byte aligned, uninitialized; valid until reset().
  void* allocate(size_t bytes);
  // Everything allocated is forgotten; the memory is kept (in one block, if the step needed several).
  void reset();

  size_t bytes_in_use() const;    // since the last reset
  size_t bytes_reserved() const;  // held from the system
  size_t high_water() const { return high_water_; }

 private:
  struct Block {
    std::byte* data;
    size_t size;
  };
  std::vector<Block> blocks_;  // in filling order
  size_t current_ = 0;         // index of the block being filled
  size_t offset_ = 0;          // bytes used in it
  size_t block_bytes_;
  size_t high_water_ = 0;
  void add_block(size_t bytes);
  void release_blocks();
};

}  // namespace tapegrad
