#include <doctest/doctest.h>

#include <cstdint>

#include "engine/scratch.hpp"
#include "engine/tape.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

TEST_CASE("scratch: chunks are disjoint, 64-byte aligned, and zeroed on request") {
  Scratch s;
  const ScratchNeed need = scratch_need(DType::f32, {10, 3}, 3);  // per chunk: 64 + 64 bytes
  CHECK(need.bytes_per_chunk == 128);
  CHECK(need.bytes() == 384);
  s.reserve(need.bytes());
  const size_t reserved = s.capacity();
  CHECK(reserved >= 384);
  const auto [chunks] = s.take(need);
  float* first[3];
  for (int64_t c = 0; c < 3; ++c) {
    ScratchChunk chunk = chunks.chunk(c);
    first[c] = chunk.take<float>(10);
    float* second = chunk.zeroed<float>(3);
    CHECK(reinterpret_cast<uintptr_t>(first[c]) % 64 == 0);
    CHECK(reinterpret_cast<uintptr_t>(second) % 64 == 0);
    CHECK(second - first[c] == 16);
    for (int i = 0; i < 3; ++i) CHECK(second[i] == 0.0f);
    CHECK_THROWS(chunk.take<float>(1));  // the chunk holds what the need listed, no more
  }
  CHECK(first[1] - first[0] == 32);
  CHECK(first[2] - first[1] == 32);
  CHECK_THROWS(chunks.chunk(3));
  CHECK(s.capacity() == reserved);  // taking what was reserved allocates nothing
}

TEST_CASE("scratch: needs taken together are laid one after another; a larger need grows the buffer") {
  Scratch s;
  const ScratchNeed a = scratch_need(DType::f64, {8}, 2), b = scratch_need(DType::f64, {4}, 1);
  const auto [ca, cb] = s.take(a, b);
  CHECK(s.capacity() >= a.bytes() + b.bytes());
  double* pa = ca.chunk(1).take<double>(8);
  double* pb = cb.chunk(0).take<double>(4);
  CHECK(pb - pa == 8);
  const ScratchNeed big = scratch_need(DType::f64, {100000}, 1);
  (void)s.take_one(big);
  CHECK(s.capacity() >= big.bytes());
}

TEST_CASE("scratch: a node's reservation is recorded, the buffer outlives clear() and does not grow per step") {
  Tape tape;
  size_t capacity = 0;
  for (int step = 0; step < 3; ++step) {
    tape.clear();
    Var x = tape.leaf(Tensor::full(DType::f32, {6, 8}, 0.5f));
    Var w1 = tape.leaf(Tensor::full(DType::f32, {16, 8}, 0.1f)),
        w2 = tape.leaf(Tensor::full(DType::f32, {8, 16}, 0.2f));
    Var y = mlp(x, w1, {}, w2, {}, GeluForm::tanh);
    tape.backward(sum(y));
    const size_t node = 0;  // mlp is the tape's first node
    const Scratch::Reservation r = scratch_reserved_by(tape, node);
    CHECK(r.first_order == 2 * scratch_round(6 * 16 * sizeof(float)));   // h and h̄ (or ḣ), (N, H) each
    CHECK(r.second_order == 5 * scratch_round(6 * 16 * sizeof(float)));  // the second-order rule's five
    CHECK(scratch_reserved_by(tape, 1).first_order == 0);                // sum reserves nothing
    if (step == 0) capacity = tape.scratch().capacity();
    CHECK(tape.scratch().capacity() == capacity);
    CHECK(capacity >= r.first_order);
  }
}
