#include "inspect/scope_names.hpp"

#include <algorithm>

namespace tapegrad {

std::string_view ScopeNames::scope_of(uint32_t id) const {
  (void)tape_.value_at(id);  // throws naming an id out of range
  auto after = std::upper_bound(changes_.begin(), changes_.end(), id,
                                [](uint32_t v, const Change& c) { return v < c.first_value; });
  if (after == changes_.begin()) return {};
  const uint32_t s = std::prev(after)->scope;
  return s == 0 ? std::string_view() : std::string_view(scopes_[s - 1].name);
}

void ScopeNames::changed() {
  const auto first = static_cast<uint32_t>(tape_.num_values());
  const uint32_t scope = open_.empty() ? 0 : open_.back();
  if (!changes_.empty() && changes_.back().first_value == first) changes_.pop_back();
  changes_.push_back({first, scope});
}

void ScopeNames::on_scope_enter(const Tape&, std::string_view name) {
  const uint32_t parent = open_.empty() ? 0 : open_.back();
  uint32_t found = 0;
  for (size_t i = 0; i < scopes_.size() && !found; ++i)
    if (scopes_[i].parent == parent && std::string_view(scopes_[i].name).substr(scopes_[i].last) == name)
      found = static_cast<uint32_t>(i + 1);
  if (!found) {
    std::string full = parent == 0 ? std::string() : scopes_[parent - 1].name + '.';
    const size_t last = full.size();
    full += name;
    scopes_.push_back({std::move(full), parent, last});
    found = static_cast<uint32_t>(scopes_.size());
  }
  open_.push_back(found);
  changed();
}

void ScopeNames::on_scope_exit(const Tape&) {
  if (!open_.empty()) open_.pop_back();
  changed();
}

void ScopeNames::on_clear(const Tape&) {
  changes_.clear();
  if (open_.empty()) scopes_.clear();  // an open scope's name must outlive it
  else changed();
}

}  // namespace tapegrad
