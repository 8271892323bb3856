#include "engine/arena.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <mutex>
#include <new>
#include <utility>

namespace tapegrad {

namespace {
constexpr size_t kAlign = 64;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Blocks that destroyed arenas gave back, kept for the next arena of any thread, up to kKeptBytes in all (not per
// thread: the memory kept does not grow with the thread count). A gradient check makes a tape for each evaluation
// of an op; mapping a fresh block for each, touching its pages (a fault each) and unmapping it (a flush of every
// core's TLB entries for it) cost more than the evaluation of a small op. A kept block is reused as it is: arena memory is
// uninitialized, as after a reset.
constexpr size_t kKeptBytes = size_t{8} << 20;

class KeptBlocks {
 public:
  // The kept block given last of at least `bytes` and at most twice that (a large block is not spent on a small
  // arena; the last given is the likeliest in cache), or {nullptr, 0}.
  std::pair<void*, size_t> take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = blocks_.size(); i-- > 0;) {
      if (blocks_[i].second >= bytes && blocks_[i].second / 2 <= bytes) {
        const auto block = blocks_[i];
        blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
        kept_ -= block.second;
        return block;
      }
    }
    return {nullptr, 0};
  }
  // Keeps the block where it fits within kKeptBytes; else unmaps it.
  void give(void* data, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (kept_ + bytes <= kKeptBytes) {
        blocks_.emplace_back(data, bytes);
        kept_ += bytes;
        return;
      }
    }
    munmap(data, bytes);
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<void*, size_t>> blocks_;
  size_t kept_ = 0;
};

KeptBlocks& kept_blocks() {
  static KeptBlocks* blocks = new KeptBlocks();  // never destroyed: arenas of static tapes release at exit too,
  // and the system takes the kept blocks back with the process
  return *blocks;
}
}  // namespace

void Arena::add_block(size_t bytes) {
  bytes = round_up(std::max(bytes, block_bytes_));
  blocks_.reserve(blocks_.size() + 1);
  auto [kept, size] = kept_blocks().take(bytes);
  if (kept != nullptr) {
    blocks_.push_back({static_cast<std::byte*>(kept), size});
    return;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // page-aligned
  if (p == MAP_FAILED) throw std::bad_alloc();
  blocks_.push_back({static_cast<std::byte*>(p), bytes});
}

void Arena::release_blocks() {
  for (const Block& b : blocks_) kept_blocks().give(b.data, b.size);
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
