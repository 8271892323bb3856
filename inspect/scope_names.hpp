// The scope each value was made in: attached to a tape before recording, a ScopeNames hears the TapeScopes open
// and close and remembers, for each value, the name of the innermost open one, nested names joined with '.'
// (TapeScope(tape, "transformer.h.0") around TapeScope(tape, "attn"): "transformer.h.0.attn"). The drawing groups
// by them (DotOptions::scopes, inspect/tape_dot.hpp). A name is stored once; a value costs nothing, as the
// record is of where the scope changed. clear() forgets the names unless a scope is open across it.
//
//   ScopeNames scopes(tape);
//   Var loss = model.loss(tape, x, y);
//   scopes.scope_of(loss.id());   // "" outside every scope
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "../engine/tape_observer.hpp"

namespace tapegrad {

class ScopeNames final : public TapeObserver {
 public:
  explicit ScopeNames(Tape& tape) : tape_(tape) { tape_.add_observer(this); }
  ~ScopeNames() override { tape_.remove_observer(this); }
  ScopeNames(const ScopeNames&) = delete;
  ScopeNames& operator=(const ScopeNames&) = delete;

  // The name of the scope open when value `id` was made ("" outside every scope); throws for an id out of range.
  std::string_view scope_of(uint32_t id) const;

  void on_scope_enter(const Tape&, std::string_view name) override;
  void on_scope_exit(const Tape&) override;
  void on_clear(const Tape&) override;

 private:
  struct Scope {
    std::string name;  // the full name, "transformer.h.0.attn"
    uint32_t parent;   // as open_: 1 + its index in scopes_, 0 for none
    size_t last;       // where its last component starts in name
  };
  struct Change {
    uint32_t first_value;  // from this value on
    uint32_t scope;        // this scope is open (1 + index in scopes_; 0: none)
  };
  void changed();  // the innermost open scope changed at the tape's next value
  Tape& tape_;
  std::vector<Scope> scopes_;
  std::vector<uint32_t> open_;   // the open scopes, innermost last
  std::vector<Change> changes_;  // in value order
};

}  // namespace tapegrad
