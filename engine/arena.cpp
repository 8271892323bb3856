#include "engine/arena.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <new>

namespace tapegrad {

namespace {
constexpr size_t kAlign = 64;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void Arena::add_block(size_t bytes) {
  bytes = round_up(std::max(bytes, block_bytes_));
  blocks_.reserve(blocks_.size() + 1);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // page-aligned
  if (p == MAP_FAILED) throw std::bad_alloc();
  blocks_.push_back({static_cast<std::byte*>(p), bytes});
}

void Arena::release_blocks() {
  for (const Block& b : blocks_) munmap(b.data, b.size);
  blocks_.clear();
}

void* Arena::allocate(size_t bytes) {
  bytes = round_up(bytes ? bytes : 1);
  while (current_ < blocks_.size() && offset_ + bytes > blocks_[current_].size) {
    ++current_;
    offset_ = 0;
  }
  if (current_ == blocks_.size()) add_block(bytes);
  void* p = blocks_[current_].data + offset_;
  offset_ += bytes;
  high_water_ = std::max(high_water_, bytes_in_use());
  return p;
}

size_t Arena::bytes_in_use() const {
  size_t n = offset_;
  for (size_t i = 0; i < current_ && i < blocks_.size(); ++i) n += blocks_[i].size;
  return n;
}

size_t Arena::bytes_reserved() const {
  size_t n = 0;
  for (const Block& b : blocks_) n += b.size;
  return n;
}

void Arena::reset() {
  if (blocks_.size() > 1) {  // one block big enough for the whole of the last step
    const size_t total = bytes_reserved();
    release_blocks();
    add_block(total);
  }
  current_ = 0;
  offset_ = 0;
}

}  // namespace tapegrad
