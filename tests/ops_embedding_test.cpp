// embedding: forward against a plain gather, the scatter-add of repeated ids, the tangent gather, and the errors.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

template <class T>
Tensor table_values(int64_t vocab, int64_t channels) {
  std::vector<T> v(static_cast<size_t>(vocab * channels));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(0.25 * static_cast<double>(i) - 1.5);
  return Tensor::from<T>({vocab, channels}, std::span<const T>(v));
}

}  // namespace

TEST_CASE_TEMPLATE("embedding gathers table rows: Y[p, c] = E[ids[p], c]", T, float, double) {
  Tape tape;
  const Tensor ids = Tensor::from<int32_t>({2, 3}, {4, 0, 2, 2, 1, 4});
  const Tensor table = table_values<T>(5, 4);
  Var y = embedding(tape.constant(ids), tape.leaf(table));
  REQUIRE(y.shape() == Shape{2, 3, 4});
  CHECK(y.dtype() == dtype_of<T>());
  const T* py = y.value().data<T>();
  for (int64_t p = 0; p < 6; ++p)
    for (int64_t c = 0; c < 4; ++c) {
      CAPTURE(p);
      CAPTURE(c);
      const int64_t row = ids.data<int32_t>()[p];
      CHECK(py[p * 4 + c] == table.data<T>()[row * 4 + c]);
    }
}

TEST_CASE("embedding of a scalar id is one row of shape (C)") {
  Tape tape;
  Var y = embedding(tape.constant(Tensor::from<int32_t>({}, {2})), tape.leaf(table_values<double>(3, 5)));
  REQUIRE(y.shape() == Shape{5});
  for (int64_t c = 0; c < 5; ++c) CHECK(y.value().item(c) == doctest::Approx(0.25 * static_cast<double>(10 + c) - 1.5));
}

TEST_CASE_TEMPLATE("the gradient of repeated ids is the sum of their rows of Ȳ", T, float, double) {
  Tape tape;
  const Tensor ids = Tensor::from<int32_t>({5}, {1, 3, 1, 1, 0});
  Var table = tape.leaf(table_values<T>(4, 3));
  Var y = embedding(tape.constant(ids), table);
  std::vector<T> seed(15);
  for (size_t i = 0; i < seed.size(); ++i) seed[i] = static_cast<T>(i + 1);
  tape.backward(y, Tensor::from<T>({5, 3}, std::span<const T>(seed)));
  const Tensor g = table.grad();
  REQUIRE(g.shape() == Shape{4, 3});
  auto s = [&](size_t p, size_t c) { return static_cast<double>(seed[p * 3 + c]); };
  for (size_t c = 0; c < 3; ++c) {
    CAPTURE(c);
    const auto ci = static_cast<int64_t>(c);
    CHECK(g.item(0 * 3 + ci) == s(4, c));
    CHECK(g.item(1 * 3 + ci) == s(0, c) + s(2, c) + s(3, c));  // id 1 at positions 0, 2, 3
    CHECK(g.item(2 * 3 + ci) == 0);                            // id 2 is never looked up
    CHECK(g.item(3 * 3 + ci) == s(1, c));
  }
}

TEST_CASE("backward adds into an existing table gradient") {
  Tape tape;
  Tensor grad = Tensor::from<double>({2, 2}, {10, 20, 30, 40});
  Var table = tape.param(table_values<double>(2, 2), grad);
  Var y = embedding(tape.constant(Tensor::from<int32_t>({3}, {1, 1, 0})), table);
  tape.backward(y, Tensor::from<double>({3, 2}, {1, 2, 3, 4, 5, 6}));
  CHECK(grad.to_vector() == std::vector<double>{15, 26, 34, 46});
}

TEST_CASE("the tangent of an embedding gathers the table tangent's rows") {
  Tape tape;
  const Tensor ids = Tensor::from<int32_t>({2, 2}, {2, 0, 2, 1});
  Var table = tape.leaf(table_values<double>(3, 2));
  Var y = embedding(tape.constant(ids), table);
  tape.set_tangent(table, Tensor::from<double>({3, 2}, {1, -1, 2, -2, 3, -3}));
  tape.propagate_tangents();
  const Tensor t = tape.tangent(y);
  REQUIRE(t.shape() == Shape{2, 2, 2});
  CHECK(t.to_vector() == std::vector<double>{3, -3, 1, -1, 3, -3, 2, -2});
}

TEST_CASE("embedding errors name the op and what is wrong") {
  Tape tape;
  Var table = tape.leaf(table_values<float>(4, 3));
  auto ids = [&](Shape s, std::initializer_list<int32_t> v) { return tape.constant(Tensor::from<int32_t>(s, v)); };

  SUBCASE("ids not int32") {
    std::string msg = error_of([&] { embedding(tape.leaf(Tensor::zeros(DType::f32, {3})), table); });
    CHECK(msg.find("embedding") != std::string::npos);
    CHECK(msg.find("int32") != std::string::npos);
  }
  SUBCASE("table not 2-D") {
    for (Shape s : {Shape{12}, Shape{2, 2, 3}}) {
      std::string msg = error_of([&] { embedding(ids({2}, {0, 1}), tape.leaf(Tensor::zeros(DType::f32, s))); });
      CHECK(msg.find("embedding") != std::string::npos);
      CHECK(msg.find("2-D") != std::string::npos);
      CHECK(msg.find(s.str()) != std::string::npos);
    }
  }
  SUBCASE("table not float") {
    std::string msg = error_of([&] { embedding(ids({2}, {0, 1}), tape.constant(Tensor::zeros(DType::i32, {4, 3}))); });
    CHECK(msg.find("embedding") != std::string::npos);
  }
  SUBCASE("negative id") {
    std::string msg = error_of([&] { embedding(ids({2, 2}, {0, 1, -1, 2}), table); });
    CHECK(msg.find("embedding") != std::string::npos);
    CHECK(msg.find("id -1") != std::string::npos);
    CHECK(msg.find("[1, 0]") != std::string::npos);
    CHECK(msg.find("V = 4") != std::string::npos);
  }
  SUBCASE("id equal to V") {
    std::string msg = error_of([&] { embedding(ids({3}, {0, 3, 4}), table); });
    CHECK(msg.find("embedding") != std::string::npos);
    CHECK(msg.find("id 4") != std::string::npos);
    CHECK(msg.find("[2]") != std::string::npos);
    CHECK(msg.find("V = 4") != std::string::npos);
  }
  SUBCASE("ids of the maximum rank leave no room for C") {
    std::string msg = error_of([&] { embedding(tape.constant(Tensor::zeros(DType::i32, {1, 1, 1, 1, 1, 1})), table); });
    CHECK(msg.find("embedding") != std::string::npos);
  }
}
