// The profile: every interval charged to one row, ops' forward and backward apart, FLOPs from the registry's cost
// functions, paused time left out, and profiling leaves the numbers unchanged.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "inspect/profile.hpp"
#include "engine/tape.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;

namespace {

const Profile::Row* find_row(const Profile& p, std::string_view name, bool op) {
  for (const auto& r : p.rows())
    if (r.name == name && r.op == op) return &r;
  return nullptr;
}

// loss = Σ softmax(a·b): one matmul, one softmax, one sum.
Var small_loss(Tape& tape, const Tensor& a, const Tensor& b) {
  return sum(softmax(matmul(tape.leaf(a), tape.leaf(b))));
}

}  // namespace

TEST_CASE("profile: each op's forward and backward, and its FLOPs from the registered cost") {
  const Tensor a = testing::random_tensor({6, 5}, DType::f64, 1), b = testing::random_tensor({5, 7}, DType::f64, 2);
  Profile prof(&builtin_registry());
  Tape tape;
  tape.add_observer(&prof);
  prof.start();
  Var loss = small_loss(tape, a, b);
  tape.backward(loss);
  tape.clear();
  prof.end_step();
  prof.pause();

  for (const char* op : {"matmul", "softmax", "sum"}) {
    const Profile::Row* r = find_row(prof, op, true);
    REQUIRE_MESSAGE(r != nullptr, op);
    CHECK(r->calls == 1);
    CHECK(r->forward_ms >= 0);
    CHECK(r->backward_ms >= 0);
  }
  const Profile::Row* mm = find_row(prof, "matmul", true);
  CHECK(mm->forward_flops == doctest::Approx(2.0 * 6 * 5 * 7));
  CHECK(mm->backward_flops == doctest::Approx(4.0 * 6 * 5 * 7));
  CHECK(find_row(prof, "softmax", true)->forward_flops == doctest::Approx(5.0 * 6 * 7));  // its element work
  CHECK(find_row(prof, "sum", true)->forward_flops == 0);  // no cost function: not counted
  CHECK(find_row(prof, "tape: leaves and glue", false) != nullptr);
  CHECK(find_row(prof, "tape: clear", false) != nullptr);
  CHECK(prof.steps() == 1);
}

TEST_CASE("profile: the rows add up to the time between start and pause; paused time is not charged") {
  const Tensor a = testing::random_tensor({8, 8}, DType::f64, 3), b = testing::random_tensor({8, 8}, DType::f64, 4);
  Profile prof;
  Tape tape;
  tape.add_observer(&prof);
  const auto t0 = std::chrono::steady_clock::now();
  prof.start();
  Var loss = small_loss(tape, a, b);
  tape.backward(loss);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  prof.mark("outside: sleep");
  prof.pause();
  const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // paused: charged to nothing
  prof.resume();
  prof.mark("outside: after resume");
  prof.pause();

  const Profile::Row* sleep = find_row(prof, "outside: sleep", false);
  REQUIRE(sleep != nullptr);
  CHECK(sleep->forward_ms >= 20);
  CHECK(prof.total_ms() <= wall);
  CHECK(find_row(prof, "outside: after resume", false)->forward_ms < 20);
  // The intervals are contiguous: nothing between start and the last event is left out.
  double sum = 0;
  for (const auto& r : prof.rows()) sum += r.ms();
  CHECK(sum == doctest::Approx(prof.total_ms()));
  CHECK(prof.total_ms() >= 20);
}

TEST_CASE("profile: a profiled computation gives the same values and gradients, bit for bit") {
  const Tensor a = testing::random_tensor({6, 5}, DType::f32, 5), b = testing::random_tensor({5, 7}, DType::f32, 6);
  auto run = [&](bool profiled) {
    Profile prof(&builtin_registry());
    Tape tape;
    if (profiled) tape.add_observer(&prof);
    prof.start();
    Var x = tape.leaf(a);
    Var loss = sum(softmax(matmul(x, tape.leaf(b))));
    tape.backward(loss);
    return std::pair{loss.value().clone(), x.grad().clone()};
  };
  const auto [y0, g0] = run(false);
  const auto [y1, g1] = run(true);
  CHECK(testing::max_abs_diff(y0, y1) == 0);
  CHECK(testing::max_abs_diff(g0, g1) == 0);
}

TEST_CASE("profile: the table and the JSON carry every row, per step") {
  const Tensor a = testing::random_tensor({4, 4}, DType::f64, 7), b = testing::random_tensor({4, 4}, DType::f64, 8);
  Profile prof(&builtin_registry());
  Tape tape;
  tape.add_observer(&prof);
  for (int step = 0; step < 3; ++step) {
    prof.start();
    tape.backward(small_loss(tape, a, b));
    tape.clear();
    prof.mark("optimizer");
    prof.end_step();
    prof.pause();
  }
  const std::string table = format_profile(prof, 1.0, "profile");
  for (const char* part : {"profile: 3 steps", "matmul", "softmax", "outside ops:", "optimizer", "sum of the rows",
                           "measured step (mean)"})
    CHECK_MESSAGE(table.find(part) != std::string::npos, part);
  const nlohmann::json j = profile_json(prof, 1.0);
  CHECK(j["steps"] == 3);
  double share = 0;
  for (const auto& r : j["rows"]) {
    share += r["share"].get<double>();
    if (r["name"] == "matmul") {
      CHECK(r["kind"] == "op");
      CHECK(r["calls"].get<double>() == doctest::Approx(1.0));
      CHECK(r["gflops"].is_number());
    }
  }
  CHECK(share == doctest::Approx(1.0));
}
