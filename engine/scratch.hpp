// Scratch: the working memory of the ops' rules (the buffers a forward, VJP, JVP or second-order rule writes and
// reads while it runs and drops when it returns), from one buffer per tape.
//
// How a node uses it. When it is recorded, a node states what its rules need as ScratchNeeds, `chunks` chunks of
// bytes_per_chunk bytes each: one chunk per range of the parallel loop that uses them (chunks = parallel_chunks(n,
// grain), so ranges that run at once get disjoint chunks), or one chunk for a rule that runs on one thread. It
// calls reserve_scratch(tape, first_order, second_order) after its checks and before its forward: the tape's
// scratch grows at once to the first-order need (the forward's, the VJP's and the JVP's, whichever is largest), so
// that a training step's rules allocate nothing; the second-order rule's need is only noted, and taken when a
// Hessian-vector product first runs it. In a rule, scratch.take(needs...) (outside the parallel loop: it may
// grow) hands out the chunks, and range c carves its arrays from chunk(c) with take<T>(n) (what the previous user
// left) or zeroed<T>(n).
//
// Why one buffer per tape:
//   - Memory. Backward, forward mode and Tape::hvp run one node at a time, and a node its rules one after another,
//     so no two nodes hold scratch at once: the tape's scratch is the largest single need, not a sum over nodes,
//     and nothing grows per node. It grows only with the chunks of one loop (at most num_threads(), one for loops
//     too small to split), never with the number of threads that ever ran a rule.
//   - Lifetime. It lives as long as the tape and its arena and is kept across Tape::clear(), so a training step
//     after the first allocates nothing, as the arena does.
//   - Counted. Each node's reservation is recorded (scratch_reserved_by), so tapegrad explain and the tape
//     drawing can show it beside the arena bytes the node keeps (Node::bytes_kept); capacity() is the tape's total.
// What it replaces: tape.zeros/empty called inside a VJP (arena memory that stayed allocated to the end of the
// step, each node's adding to the arena's high water), thread_local vectors (shared by every tape of a thread,
// never freed, one set per thread that ever ran the rule, counted nowhere), and fresh vectors per call or per
// range (an allocation and its page faults on every call).
//
// Every array in a chunk starts on a 64-byte boundary, so arrays of different ranges never share a cache line.
// The memory is mapped from the kernel (as the arena's blocks are): growing unmaps the old buffer, whose pages leave
// the resident set at once, and pages become resident only when a rule first touches them.
// Not thread-safe: a tape is recorded and differentiated by one thread at a time; only the ranges of one rule's
// parallel loop use it at once, each in its own chunk.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "tensor.hpp"

namespace tapegrad {

class Tape;

// The bytes an array of `bytes` takes in a chunk: rounded up to the 64-byte boundary the next array starts on.
constexpr size_t scratch_round(size_t bytes) { return (bytes + 63) & ~size_t{63}; }

// `chunks` chunks of bytes_per_chunk bytes (a multiple of 64).
struct ScratchNeed {
  size_t bytes_per_chunk = 0;
  int64_t chunks = 0;
  size_t bytes() const { return bytes_per_chunk * static_cast<size_t>(chunks); }
};

// `chunks` chunks, each holding one array of every length in `arrays` (elements of dtype).
ScratchNeed scratch_need(DType dtype, std::initializer_list<int64_t> arrays, int64_t chunks = 1);

// One chunk, as a cursor that hands out its arrays in order. Throws if they outgrow the chunk (a need computed
// from other sizes than the rule's).
class ScratchChunk {
 public:
  ScratchChunk(std::byte* data, size_t bytes) : at_(data), left_(bytes) {}
  // The next n elements, holding whatever the previous user left: for arrays that are written before they are read.
  template <class T>
  T* take(int64_t n) {
    const size_t bytes = scratch_round(static_cast<size_t>(n) * sizeof(T));
    if (bytes > left_) overrun(bytes);
    T* p = reinterpret_cast<T*>(at_);
    at_ += bytes;
    left_ -= bytes;
    return p;
  }
  // The next n elements, set to 0.
  template <class T>
  T* zeroed(int64_t n) {
    T* p = take<T>(n);
    std::fill(p, p + n, T(0));
    return p;
  }

 private:
  [[noreturn]] void overrun(size_t bytes) const;
  std::byte* at_;
  size_t left_;
};

// The chunks of one need, as take() hands them out: chunk(c) for range c of the rule's parallel loop.
class ScratchChunks {
 public:
  ScratchChunks() = default;
  ScratchChunks(std::byte* data, const ScratchNeed& need) : data_(data), need_(need) {}
  ScratchChunk chunk(int64_t c) const;
  int64_t chunks() const { return need_.chunks; }

 private:
  std::byte* data_ = nullptr;
  ScratchNeed need_;
};

class Scratch {
 public:
  Scratch() = default;
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // Grows the buffer now to `bytes`, if it is smaller.
  void reserve(size_t bytes) { grow(bytes); }
  // The chunks of each need, laid one after another (growing the buffer first where a need was not reserved, e.g.
  // a second-order rule's at its first run). Call it outside the rule's parallel loop; the chunks stay valid until
  // the next take() or reserve().
  template <class... Needs>
  std::array<ScratchChunks, sizeof...(Needs)> take(const Needs&... needs) {
    grow((size_t{0} + ... + needs.bytes()));
    std::byte* at = data_;
    return {place(at, needs)...};
  }
  // The one chunk of `need` (need.chunks = 1), for a rule that runs on one thread.
  ScratchChunk take_one(const ScratchNeed& need) { return take(need)[0].chunk(0); }
  size_t capacity() const { return capacity_; }  // bytes held: the largest need taken or reserved so far

  // The record of what each node of one recording reserved (reserve_scratch writes it, the generation of the
  // tape tells recordings apart; a new recording's first reservation forgets the last one's, keeping its memory).
  struct Reservation {
    size_t node;          // index on the tape
    size_t first_order;   // bytes: the most its forward, VJP or JVP take at once
    size_t second_order;  // bytes its second-order rule takes (at a Hessian-vector product)
  };
  void note(uint32_t generation, size_t node, size_t first_order, size_t second_order);
  // The reservation of node `node` of recording `generation`; zeros where it reserved nothing.
  Reservation reserved_by(uint32_t generation, size_t node) const;

 private:
  static ScratchChunks place(std::byte*& at, const ScratchNeed& need) {
    ScratchChunks c(at, need);
    at += need.bytes();
    return c;
  }
  void grow(size_t bytes);
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
  uint32_t generation_ = 0;
  std::vector<Reservation> reservations_;  // in node order
};

// For the node `tape` records next: grows the tape's scratch to first_order bytes now and notes both as the node's
// (nothing is noted when the tape does not record, under a NoGradGuard). first_order is the most the node's
// forward, VJP and JVP take at once (the sum of the needs one take() gets), second_order its second-order rule's.
// Call it after the op's checks, before the forward, and record the node right after the forward.
void reserve_scratch(Tape& tape, size_t first_order, size_t second_order = 0);
// What node `node` of the tape's current recording reserved (zeros: none).
Scratch::Reservation scratch_reserved_by(const Tape& tape, size_t node);

}  // namespace tapegrad
