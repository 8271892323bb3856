// Tensors and shapes: construction, conversion, readable errors.
#include <doctest/doctest.h>

#include <string>

#include "engine/parallel.hpp"
#include "engine/rng.hpp"
#include "engine/tensor.hpp"

using namespace tapegrad;

TEST_CASE("shapes print readably and count their elements") {
  Shape s{2, 3, 4};
  CHECK(s.str() == "(2, 3, 4)");
  CHECK(fmt::format("{}", s) == "(2, 3, 4)");
  CHECK(s.numel() == 24);
  CHECK(s.rows() == 6);
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{}.str() == "()");
}

TEST_CASE("ranks up to six are supported; a seventh axis is an error") {
  Shape s{1, 2, 3, 4, 5, 6};
  CHECK(s.rank() == 6);
  CHECK_THROWS_AS(s.push_back(7), Error);
}

TEST_CASE("axes resolve from the end and out-of-range axes name the op") {
  CHECK(normalize_axis("sum", -1, 3) == 2);
  CHECK(normalize_axis("sum", 0, 3) == 0);
  CHECK_THROWS_WITH_AS(normalize_axis("sum", 3, 3), doctest::Contains("sum: axis 3"), Error);
  CHECK_THROWS_WITH_AS(normalize_axis("sum", -4, 3), doctest::Contains("rank 3"), Error);
}

TEST_CASE("tensors are made, viewed, cloned and converted") {
  Tensor t = Tensor::from<float>({2, 2}, {1, 2, 3, 4});
  CHECK(t.dtype() == DType::f32);
  CHECK(t.item(3) == 4);
  Tensor v = t.view({4});
  CHECK(v.raw() == t.raw());
  Tensor c = t.clone();
  CHECK(c.raw() != t.raw());
  Tensor d = t.to(DType::f64);
  CHECK(d.dtype() == DType::f64);
  CHECK(d.to_vector() == std::vector<double>{1, 2, 3, 4});
  CHECK(reinterpret_cast<uintptr_t>(Tensor::empty(DType::f32, {3}).raw()) % 64 == 0);
}

TEST_CASE("misuse of tensors throws readable errors") {
  CHECK_THROWS_WITH_AS(Tensor::from<float>({2, 2}, {1, 2, 3}), doctest::Contains("(2, 2)"), Error);
  Tensor t = Tensor::zeros(DType::f32, {2});
  CHECK_THROWS_WITH_AS((void)t.data<double>(), doctest::Contains("float32"), Error);
  CHECK_THROWS_WITH_AS((void)t.view({3}), doctest::Contains("(2)"), Error);
  CHECK_THROWS_AS(t.copy_from(Tensor::zeros(DType::f64, {2})), Error);
  CHECK_THROWS_AS((void)t.item(2), Error);
}

TEST_CASE("randn is the generator's normal draws in order, on any thread count, and moves it past them") {
  // Element i is the i-th rng.normal(): the tensor's draws are made in ranges on the pool, from the counter.
  for (const int threads : {1, 2, 3}) {
    const int saved = num_threads();
    set_num_threads(threads);
    for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100003}}) {
      Rng one_by_one(41 + static_cast<uint64_t>(n)), whole(41 + static_cast<uint64_t>(n));
      const Tensor t64 = Tensor::randn(DType::f64, Shape{n}, whole, 0.5, 2.0);
      const Tensor t32 = Tensor::randn(DType::f32, Shape{n}, whole, -1.0, 0.25);
      bool same64 = true, same32 = true;
      for (int64_t i = 0; i < n; ++i) same64 = same64 && t64.data<double>()[i] == 0.5 + 2.0 * one_by_one.normal();
      for (int64_t i = 0; i < n; ++i)
        same32 = same32 && t32.data<float>()[i] == static_cast<float>(-1.0 + 0.25 * one_by_one.normal());
      CHECK(same64);
      CHECK(same32);
      CHECK(whole.state() == one_by_one.state());
      CHECK(whole.next_u64() == one_by_one.next_u64());
    }
    set_num_threads(saved);
  }
}
