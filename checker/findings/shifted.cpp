// The kind of finding "shifted": A = N with one axis of x (or of y) moved by one place, and 0 where nothing moved
// in: the rule writes each element of x̄ one place over (or reads ȳ one place over), an index off by one in a
// window, a scan, a convolution's offset or a kernel's pointer arithmetic.
#include <optional>
#include <string>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// Whether A = N moved by d places along axis `axis` of x (on_x: columns k) or of y (rows j): the entry at index i of
// that axis holds N's entry at i − d, and 0 where i − d falls outside the axis (any value there where edge_free: a
// rule that reads a padding where nothing moved in); and N is not itself the same moved (a sum's Jacobian is
// constant along x's axis: a rule that drops the first element of each row matches it moved, and is no shift).
bool moved_by(const JacobianView& v, bool on_x, int axis, int64_t d, bool edge_free = false) {
  const Shape& shape = on_x ? v.xshape : v.yshape;
  int64_t stride = 1;
  for (int a = shape.rank() - 1; a > axis; --a) stride *= shape[a];
  const int64_t len = shape[axis];
  bool n_moves = false;  // N differs from N moved somewhere inside the axis
  for (int64_t j = 0; j < v.m; ++j)
    for (int64_t k = 0; k < v.cols; ++k) {
      const size_t at = static_cast<size_t>(j * v.cols + k);
      const int64_t flat = on_x ? k : j;
      const int64_t from = (flat / stride) % len - d;
      double moved = 0;
      if (from >= 0 && from < len) {
        const int64_t src = on_x ? j * v.cols + (k - d * stride) : (j - d * stride) * v.cols + k;
        moved = v.n[static_cast<size_t>(src)];
        n_moves = n_moves || !v.tol.ok(v.n[at], moved);
      } else if (edge_free) {
        continue;
      }
      if (!v.tol.ok(v.a[at], moved)) return false;
    }
  return n_moves;
}

// An axis of x, then of y (the last axis first), of min_length places or more, along which A = N moved by one
// place (moved_by), and which way.
struct OnePlace {
  bool on_x;
  int axis;
  int64_t d;
};

std::optional<OnePlace> moved_along(const JacobianView& v, int64_t min_length, bool edge_free) {
  for (const bool on_x : {true, false}) {
    const Shape& shape = on_x ? v.xshape : v.yshape;
    for (int axis = shape.rank() - 1; axis >= 0; --axis) {
      if (shape[axis] < min_length) continue;
      for (const int64_t d : {1, -1})
        if (moved_by(v, on_x, axis, d, edge_free)) return OnePlace{on_x, axis, d};
    }
  }
  return std::nullopt;
}

// The start of a shift's finding, "analytic = numeric with axis 1 of x (3, 5) moved by +1", and what the rule does,
// "the VJP writes each element of the gradient one place later along that axis".
std::string moved_axis(const JacobianView& v, const OnePlace& m) {
  return fmt::format("analytic = numeric with axis {} of {} {} moved by {:+d}", m.axis, m.on_x ? v.input : v.y_name,
                     m.on_x ? v.xshape : v.yshape, m.d);
}

std::string moved_rule(const JacobianView& v, const OnePlace& m) {
  const bool vjp = v.check == "vjp";
  const char* what = m.on_x ? (vjp ? "writes each element of the gradient" : "reads each element of the tangent")
                            : (vjp ? "reads each element of ȳ" : "writes each element of ẏ");
  return fmt::format("the {} {} one place {} along that axis", rule_name(v.check), what, m.d > 0 ? "later" : "earlier");
}

// The whole Jacobian moved by one place along one axis of x or of y. The search ends. Not when every failing
// element is where the rule gives 0, or where N is 0: a mask's edge (an exclusive cumulative sum where the
// inclusive one belongs is also its Jacobian moved by one) is told better by the masked positions, which say which
// entries.
bool moved_one_place(JacobianSearch& s) {
  const JacobianView& v = s.v;
  if (s.failing_where_a_is_zero() || s.failing_where_n_is_zero()) return false;
  const std::optional<OnePlace> m = moved_along(v, 2, false);
  if (!m) return false;
  s.found.push_back({Finding::shifted, v.input, v.check,
                     fmt::format("{} (0 where nothing moved in), at every one of {} elements: {} (an index off by "
                                 "one: a window, a scan, a convolution's offset)",
                                 moved_axis(v, *m), v.a.size(), moved_rule(v, *m))});
  return true;
}

// The same, where the entries nothing moved into are left free (a rule that cuts its gradient from a padded buffer
// one place off reads the padding's gradient there): tried last, for a failure no other pass named, and only along
// an axis of 4 places or more, where the moved entries are most of it.
bool moved_one_place_but_the_edge(JacobianSearch& s) {
  const JacobianView& v = s.v;
  const std::optional<OnePlace> m = moved_along(v, 4, true);
  if (!m) return false;
  s.found.push_back({Finding::shifted, v.input, v.check,
                     fmt::format("{}, at every element but those at the edge nothing moved into (the rule reads "
                                 "something else there: a padding): {} (an index off by one: a window, a scan, a "
                                 "convolution's offset or padding)",
                                 moved_axis(v, *m), moved_rule(v, *m))});
  return true;
}

}  // namespace

FindingSheet shifted_finding() {
  return {
      .kind = Finding::shifted,
      .title = "shifted",
      .meaning = "A = N with one axis of x or of y moved by one place: each element written (or read) one place over",
      .found_by = "its passes over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#shifted",
      .passes = {{55, moved_one_place}, {130, moved_one_place_but_the_edge}},
      .explains = true,
  };
}

}  // namespace tapegrad
