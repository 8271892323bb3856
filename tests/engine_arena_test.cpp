// Arena blocks lent between tapes: an idle arena's block serves a fresh arena, and comes back to its owner.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "engine/arena.hpp"

using namespace tapegrad;

namespace {

bool inside(const void* p, const void* block_start, size_t bytes) {
  auto a = reinterpret_cast<uintptr_t>(p), s = reinterpret_cast<uintptr_t>(block_start);
  return a >= s && a < s + bytes;
}

}  // namespace

TEST_CASE("a fresh arena borrows the block of an idle one, which takes it back afterwards") {
  Arena owner(1 << 20);
  void* first = owner.allocate(1000);
  std::memset(first, 1, 1000);
  owner.reset();  // idle: its single block may be lent
  const size_t block = owner.bytes_reserved();
  REQUIRE(block >= (1 << 20));
  {
    Arena borrower(1 << 20);
    void* p = borrower.allocate(4096);
    CHECK(inside(p, first, block));  // the owner's pages, already mapped
    CHECK(borrower.bytes_reserved() == block);
    CHECK(owner.bytes_reserved() == 0);
    borrower.reset();
  }
  CHECK(owner.allocate(64) == first);  // back with its owner
  CHECK(owner.bytes_reserved() == block);
}

TEST_CASE("an owner whose block is in use elsewhere maps a new one; everyone keeps working") {
  auto owner = std::make_unique<Arena>(1 << 16);
  void* first = owner->allocate(100);
  owner->reset();
  Arena borrower(1 << 16);
  auto* b = static_cast<char*>(borrower.allocate(100));  // borrowed, and the borrower stays busy
  CHECK(b == first);
  auto* o = static_cast<char*>(owner->allocate(100));
  CHECK(o != b);
  std::memset(b, 2, 100);
  std::memset(o, 3, 100);
  CHECK(b[99] == 2);
  owner.reset();  // the owner goes away while its block is lent: the borrower keeps it and unmaps it later
  std::memset(borrower.allocate(1000), 4, 1000);
  borrower.reset();
  Arena next(1 << 16);
  CHECK(next.allocate(8) == first);  // the orphaned block, lent on again
}

TEST_CASE("a borrower that outgrows the block merges into a block of its own and returns the borrowed one") {
  Arena owner(1 << 16);
  void* first = owner.allocate(64);
  owner.reset();
  {
    Arena borrower(1 << 16);
    CHECK(borrower.allocate(1 << 15) == first);
    borrower.allocate(1 << 17);  // does not fit: a block of its own
    borrower.reset();            // merged into one own block; the borrowed one waits for its owner
    CHECK(borrower.allocate(64) != first);
  }
  CHECK(owner.allocate(64) == first);
}
