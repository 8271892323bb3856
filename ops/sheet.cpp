// The keyword arguments of an op called by name (OpArgs) and the count of its inputs (InputCount): ops/sheet.hpp.
#include "ops/sheet.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tapegrad {

namespace {

// What a value is, for an error: "the number 0.5", "the string 'tanh'", "a list of 2 integers".
std::string describe(const OpArgs::Value& v) {
  struct Describe {
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(int64_t i) const { return fmt::format("the integer {}", i); }
    std::string operator()(double d) const { return fmt::format("the number {}", d); }
    std::string operator()(const std::vector<int64_t>& l) const { return fmt::format("the list [{}]", fmt::join(l, ", ")); }
    std::string operator()(const std::string& s) const { return fmt::format("the string '{}'", s); }
  };
  return std::visit(Describe{}, v);
}

}  // namespace

OpArgs& OpArgs::set(std::string key, Value value) {
  values_.insert_or_assign(std::move(key), std::move(value));
  return *this;
}

const OpArgs::Value* OpArgs::find(std::string_view key) const {
  const auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

const OpArgs::Value& OpArgs::need(std::string_view key) const {
  if (const Value* v = find(key)) return *v;
  fail("{}: needs the keyword {}=", op_, key);
}

void OpArgs::wrong(std::string_view key, const Value& v, std::string_view expected) const {
  fail("{}: the keyword {}= must be {}, got {}", op_, key, expected, describe(v));
}

double OpArgs::number(std::string_view key) const {
  const Value& v = need(key);
  if (const double* d = std::get_if<double>(&v)) return *d;
  if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  wrong(key, v, "a number");
}
double OpArgs::number(std::string_view key, double fallback) const { return has(key) ? number(key) : fallback; }

int64_t OpArgs::integer(std::string_view key) const {
  const Value& v = need(key);
  if (const int64_t* i = std::get_if<int64_t>(&v)) return *i;
  wrong(key, v, "an integer");
}
int64_t OpArgs::integer(std::string_view key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

int OpArgs::axis(std::string_view key) const {
  const int64_t i = integer(key);
  if (i < std::numeric_limits<int>::min() || i > std::numeric_limits<int>::max())
    wrong(key, need(key), "an axis (an integer of a few digits)");
  return static_cast<int>(i);
}
int OpArgs::axis(std::string_view key, int fallback) const { return has(key) ? axis(key) : fallback; }

bool OpArgs::flag(std::string_view key) const {
  const Value& v = need(key);
  if (const bool* b = std::get_if<bool>(&v)) return *b;
  wrong(key, v, "True or False");
}
bool OpArgs::flag(std::string_view key, bool fallback) const { return has(key) ? flag(key) : fallback; }

std::vector<int64_t> OpArgs::integers(std::string_view key) const {
  const Value& v = need(key);
  if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) return *l;
  wrong(key, v, "a list of integers");
}

std::string OpArgs::text(std::string_view key) const {
  const Value& v = need(key);
  if (const std::string* s = std::get_if<std::string>(&v)) return *s;
  wrong(key, v, "a string");
}
std::string OpArgs::text(std::string_view key, std::string fallback) const {
  return has(key) ? text(key) : fallback;
}

std::string InputCount::str() const {
  if (min == max) return std::to_string(min);
  if (max == any) return min == 1 ? "one or more" : fmt::format("{} or more", min);
  if (max == min + 1) return fmt::format("{} or {}", min, max);
  return fmt::format("{} to {}", min, max);
}

}  // namespace tapegrad
