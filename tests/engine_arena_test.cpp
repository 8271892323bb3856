// The arena: a bump allocator of 64-byte aligned pieces, rewound by reset() without giving its memory back,
// the blocks of a step that outgrew it merged into one; a destroyed arena's block serves the next arena of its size.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>

#include "engine/arena.hpp"

using namespace tapegrad;

TEST_CASE("allocations are 64-byte aligned, consecutive, and reset() starts over in the same memory") {
  Arena arena(1 << 16);
  void* first = arena.allocate(1);
  void* second = arena.allocate(100);
  CHECK(reinterpret_cast<uintptr_t>(first) % 64 == 0);
  CHECK(static_cast<char*>(second) == static_cast<char*>(first) + 64);
  CHECK(arena.bytes_in_use() == 64 + 128);
  std::memset(second, 1, 100);
  const size_t reserved = arena.bytes_reserved();
  arena.reset();
  CHECK(arena.bytes_in_use() == 0);
  CHECK(arena.allocate(8) == first);
  CHECK(arena.bytes_reserved() == reserved);
  CHECK(arena.high_water() == 64 + 128);
}

TEST_CASE("a step that outgrows the block gets more, merged into one block at the next reset") {
  Arena arena(1 << 16);
  void* first = arena.allocate(1 << 15);
  std::memset(arena.allocate(1 << 17), 2, 1 << 17);  // does not fit: a second block
  CHECK(arena.bytes_reserved() >= (1 << 16) + (1 << 17));
  const size_t reserved = arena.bytes_reserved();
  arena.reset();
  CHECK(arena.bytes_reserved() == reserved);  // one block of the size of both
  void* a = arena.allocate(1 << 15);
  void* b = arena.allocate(1 << 17);
  CHECK(static_cast<char*>(b) == static_cast<char*>(a) + (1 << 15));  // the whole step fits in it
  CHECK(arena.bytes_reserved() == reserved);
  (void)first;
}

TEST_CASE("two arenas never share memory") {
  Arena one(1 << 16), two(1 << 16);
  auto* p = static_cast<char*>(one.allocate(100));
  one.reset();
  auto* q = static_cast<char*>(two.allocate(100));
  CHECK(p != q);
  std::memset(p, 3, 100);
  std::memset(q, 4, 100);
  CHECK(p[99] == 3);
  CHECK(q[99] == 4);
}

TEST_CASE("a destroyed arena's block serves the next arena of about its size, and no much smaller one") {
  char* p = nullptr;
  {
    Arena one(1 << 20);
    p = static_cast<char*>(one.allocate(100));
    std::memset(p, 5, 100);
  }
  Arena two(1 << 20);
  CHECK(static_cast<char*>(two.allocate(100)) == p);  // kept, not unmapped and mapped again
  char* q = nullptr;
  {
    Arena big(1 << 22);
    q = static_cast<char*>(big.allocate(100));
  }
  Arena small(1 << 16);
  CHECK(static_cast<char*>(small.allocate(100)) != q);
}
