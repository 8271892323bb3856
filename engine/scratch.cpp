#include "engine/scratch.hpp"

#include <sys/mman.h>

#include <new>

#include "engine/tape.hpp"

namespace tapegrad {

ScratchNeed scratch_need(DType dtype, std::initializer_list<int64_t> arrays, int64_t chunks) {
  size_t bytes = 0;
  for (int64_t n : arrays) bytes += scratch_round(static_cast<size_t>(n) * dtype_size(dtype));
  return {bytes, chunks};
}

void ScratchChunk::overrun(size_t bytes) const {
  fail("scratch: a rule takes {} bytes more from a chunk that has {} left (its need was computed from other sizes)",
       bytes, left_);
}

ScratchChunk ScratchChunks::chunk(int64_t c) const {
  if (c < 0 || c >= need_.chunks)
    fail("scratch: chunk {} of a need of {} chunks (the rule's loop has more ranges than its need)", c, need_.chunks);
  return {data_ + static_cast<size_t>(c) * need_.bytes_per_chunk, need_.bytes_per_chunk};
}

Scratch::~Scratch() {
  if (data_) munmap(data_, capacity_);
}

void Scratch::grow(size_t bytes) {
  if (bytes <= capacity_) return;
  const size_t page = 4096, mapped = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  if (data_) munmap(data_, capacity_);
  data_ = static_cast<std::byte*>(p);
  capacity_ = mapped;
}

void Scratch::note(uint32_t generation, size_t node, size_t first_order, size_t second_order) {
  if (generation != generation_) {
    reservations_.clear();
    generation_ = generation;
  }
  if (!reservations_.empty() && reservations_.back().node == node) {
    Reservation& r = reservations_.back();
    r.first_order = std::max(r.first_order, first_order);
    r.second_order = std::max(r.second_order, second_order);
    return;
  }
  reservations_.push_back({node, first_order, second_order});
}

Scratch::Reservation Scratch::reserved_by(uint32_t generation, size_t node) const {
  if (generation != generation_) return {node, 0, 0};
  auto it = std::lower_bound(reservations_.begin(), reservations_.end(), node,
                             [](const Reservation& r, size_t n) { return r.node < n; });
  if (it == reservations_.end() || it->node != node) return {node, 0, 0};
  return *it;
}

void reserve_scratch(Tape& tape, size_t first_order, size_t second_order) {
  Scratch& s = tape.scratch();
  s.reserve(first_order);
  if (tape.recording()) s.note(tape.generation(), tape.num_nodes(), first_order, second_order);
}

Scratch::Reservation scratch_reserved_by(const Tape& tape, size_t node) {
  return tape.scratch().reserved_by(tape.generation(), node);
}

}  // namespace tapegrad
