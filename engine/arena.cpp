#include "engine/arena.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <mutex>
#include <new>

namespace tapegrad {

struct Arena::Block {
  std::byte* data;
  size_t size;
  Arena* owner;   // unmaps it; null once the owner is gone (the holder unmaps it then)
  Arena* holder;  // allocates from it; null while it waits, free, for its owner
};

namespace {

constexpr size_t kAlign = 64;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Every block of the process, and those that may be lent: the single block of an idle arena, or a free block
// whose borrower is gone. Guarded by g_mutex, like every change of a block's owner or holder and of an idle
// arena's blocks.
std::mutex g_mutex;
std::vector<Arena::Block*> g_blocks;
std::vector<Arena::Block*> g_lendable;

void erase(std::vector<Arena::Block*>& v, Arena::Block* b) { v.erase(std::remove(v.begin(), v.end(), b), v.end()); }

void unmap(Arena::Block* b) {
  erase(g_lendable, b);
  erase(g_blocks, b);
  munmap(b->data, b->size);
  delete b;
}

// Lets go of a block this arena held: its own (or an orphan) is unmapped, a borrowed one waits for its owner.
void let_go(Arena::Block* b, const Arena* self) {
  if (b->owner == self || b->owner == nullptr) return unmap(b);
  b->holder = nullptr;
  if (std::find(g_lendable.begin(), g_lendable.end(), b) == g_lendable.end()) g_lendable.push_back(b);
}

}  // namespace

Arena::~Arena() {
  std::lock_guard<std::mutex> lock(g_mutex);
  release_blocks();
  for (Block* b : std::vector<Block*>(g_blocks))  // own blocks held elsewhere: the holder unmaps them
    if (b->owner == this) {
      b->owner = nullptr;
      if (b->holder == nullptr) unmap(b);
    }
}

// The first allocation after a reset: this arena's blocks are no longer lendable; an arena without a block
// takes one that is lendable, its own first (lent earlier), else the largest.
void Arena::activate() {
  std::lock_guard<std::mutex> lock(g_mutex);
  idle_ = false;
  for (Block* b : blocks_) erase(g_lendable, b);
  if (!blocks_.empty()) return;
  Block* pick = nullptr;
  for (Block* b : g_lendable)
    if (b->size >= block_bytes_ && (!pick || (b->owner == this) > (pick->owner == this) ||
                                    ((b->owner == this) == (pick->owner == this) && b->size > pick->size)))
      pick = b;
  if (!pick) return;
  erase(g_lendable, pick);
  if (Arena* previous = pick->holder) erase(previous->blocks_, pick);  // an idle arena's single block
  pick->holder = this;
  blocks_.push_back(pick);
}

void Arena::add_block(size_t bytes) {
  bytes = round_up(std::max(bytes, block_bytes_));
  blocks_.reserve(blocks_.size() + 1);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // page-aligned
  if (p == MAP_FAILED) throw std::bad_alloc();
  auto* b = new Block{static_cast<std::byte*>(p), bytes, this, this};
  std::lock_guard<std::mutex> lock(g_mutex);
  g_blocks.push_back(b);
  blocks_.push_back(b);
}

// Under g_mutex.
void Arena::release_blocks() {
  for (Block* b : blocks_) let_go(b, this);
  blocks_.clear();
}

void* Arena::allocate(size_t bytes) {
  if (idle_) activate();
  bytes = round_up(bytes ? bytes : 1);
  while (current_ < blocks_.size() && offset_ + bytes > blocks_[current_]->size) {
    ++current_;
    offset_ = 0;
  }
  if (current_ == blocks_.size()) add_block(bytes);
  void* p = blocks_[current_]->data + offset_;
  offset_ += bytes;
  high_water_ = std::max(high_water_, bytes_in_use());
  return p;
}

size_t Arena::bytes_in_use() const {
  size_t n = offset_;
  for (size_t i = 0; i < current_ && i < blocks_.size(); ++i) n += blocks_[i]->size;
  return n;
}

size_t Arena::bytes_reserved() const {
  std::lock_guard<std::mutex> lock(g_mutex);  // an idle arena's block may be lent meanwhile
  size_t n = 0;
  for (const Block* b : blocks_) n += b->size;
  return n;
}

void Arena::reset() {
  if (blocks_.size() > 1) {  // one block big enough for the whole of the last step
    const size_t total = bytes_reserved();
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      release_blocks();
    }
    add_block(total);
  }
  current_ = 0;
  offset_ = 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  idle_ = true;
  if (blocks_.size() == 1 && std::find(g_lendable.begin(), g_lendable.end(), blocks_[0]) == g_lendable.end())
    g_lendable.push_back(blocks_[0]);
}

}  // namespace tapegrad
