// Registering an op is one sheet function at the end of its file, which the build lists (ops/all_ops.hpp); what can
// still be forgotten fails here, naming the op or the file: every op a registered case or a GPT of each attention
// kind records on its tape has a sheet, and every file of ops/ that records nodes defines one sheet function, whose
// ops reach the built-in registry.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "ops/registry.hpp"
#include "models/gpt.hpp"
#include "ops/all_ops.hpp"
#include "ops/ops.hpp"
#include "test_paths.hpp"

using namespace tapegrad;

namespace {

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The ops recorded on `tape` that the built-in registry does not know.
std::set<std::string> unregistered_ops(const Tape& tape) {
  std::set<std::string> missing;
  for (size_t i = 0; i < tape.num_nodes(); ++i)
    if (!builtin_registry().find(tape.node(i).op)) missing.insert(tape.node(i).op);
  return missing;
}

}  // namespace

TEST_CASE("every op a registered case records has a sheet") {
  int cases = 0;
  for (const OpSheet& op : builtin_registry().ops())
    for (const GradcheckCase& c : op.cases) {
      Tape tape;
      std::vector<Tensor> xs = make_inputs(c.inputs, DType::f64, 1);
      std::vector<Var> vars;
      for (size_t i = 0; i < xs.size(); ++i) vars.push_back(tape.leaf(xs[i], c.inputs[i].differentiable()));
      c.build(tape, vars);
      const std::set<std::string> missing = unregistered_ops(tape);
      CHECK_MESSAGE(missing.empty(), "case '" << c.name << "' of '" << op.name << "' records ops without a sheet: "
                                              << fmt::format("{}", fmt::join(missing, ", ")));
      ++cases;
    }
  CHECK(cases > 140);
}

TEST_CASE("every op a GPT of each attention kind records, forward and backward, has a sheet") {
  for (const std::string& kind : attention_kinds()) {
    CAPTURE(kind);
    GPTConfig cfg;
    cfg.n_layer = 1;
    cfg.n_head = 2;
    cfg.n_embd = 16;
    cfg.block_size = 8;
    cfg.attention = kind;
    GPT model(cfg, 1);
    Tensor idx = Tensor::empty(DType::i32, {2, 8}), targets = Tensor::empty(DType::i32, {2, 8});
    for (int64_t i = 0; i < 16; ++i) {
      idx.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % cfg.vocab_size);
      targets.data<int32_t>()[i] = static_cast<int32_t>((i * 11 + 3) % cfg.vocab_size);
    }
    Tape tape;
    Var loss = model.loss(tape, idx, targets);
    tape.backward(loss);
    const std::set<std::string> missing = unregistered_ops(tape);
    CHECK_MESSAGE(missing.empty(), "a GPT with " << kind << " attention records ops without a sheet: "
                                                 << fmt::format("{}", fmt::join(missing, ", ")));
  }
}

TEST_CASE("every file of ops/ that records a node defines one sheet function, and its ops are built in") {
  namespace fs = std::filesystem;
  const fs::path root(TAPEGRAD_SOURCE_DIR);
  // As cmake/generate_sheet_list.cmake finds them: at the start of a line, so the build lists every one it finds here.
  const std::regex sheet_definition(R"(\nstd::vector<OpSheet> (\w+)\(\) \{)");
  std::set<std::string> families;
  for (const OpSheet& op : builtin_ops()) families.insert(op.family);
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root / "ops")) {
    const fs::path rel = fs::relative(entry.path(), root);
    if (entry.path().extension() != ".cpp") continue;
    const std::string text = read(entry.path());
    if (text.find("record(") == std::string::npos && text.find("pointwise(") == std::string::npos) continue;
    INFO("file: " << rel.string());
    std::vector<std::string> sheets;
    for (auto m = std::sregex_iterator(text.begin(), text.end(), sheet_definition); m != std::sregex_iterator(); ++m)
      sheets.push_back((*m)[1]);
    CHECK_MESSAGE(sheets.size() == 1, rel.string() << " records nodes: it should define one sheet function, "
                                                   << "std::vector<OpSheet> <family>_ops(), at the start of a line "
                                                   << "within namespace tapegrad, at its end");
    // Its family: the file's path under ops/ without .cpp ("attention/tiled").
    std::string family = fs::relative(entry.path(), root / "ops").replace_extension().generic_string();
    CHECK_MESSAGE(families.count(family) == 1, rel.string() << " records nodes, and no built-in op has family '"
                                                            << family << "': its sheet function is not in "
                                                            << "builtin_ops() or names another family");
    ++files;
  }
  CHECK(files >= 18);
  // And each sheet's family names the file that holds it.
  for (const OpSheet& op : builtin_ops()) {
    INFO("op: " << op.name);
    CHECK(fs::is_regular_file(root / ("ops/" + op.family + ".cpp")));
  }
}

TEST_CASE("a registry refuses an op registered twice and a case for an op it does not have, by name") {
  Registry r{builtin_ops()};
  CHECK(r.ops().size() == builtin_registry().ops().size());
  CHECK_THROWS_WITH_AS(r.add(std::vector<OpSheet>{{.name = "softmax", .family = "softmax"}}),
                       doctest::Contains("op 'softmax' is registered twice"), Error);
  CHECK_THROWS_WITH_AS(r.add_case("yours", {"c", {}, {}}), doctest::Contains("names op 'yours'"), Error);
}

TEST_CASE("an op is called by name through its sheet's call; one without a call is refused, saying so") {
  Registry r;
  r.add(std::vector<OpSheet>{
      {.name = "scaled",
       .family = "arithmetic",
       .inputs = 1,
       .call = [](std::span<const Var> x, const OpArgs& a) { return scale(x[0], a.number("s", 2.0)); }},
      {.name = "uncallable", .family = "arithmetic"}});
  CHECK(r.callable() == std::vector<std::string>{"scaled"});
  Tape tape;
  const std::vector<Var> x{tape.leaf(Tensor::full(DType::f64, {2}, 1.5))};
  CHECK(r.call("scaled", x, OpArgs{}).value().data<double>()[0] == 3.0);
  CHECK(r.call("scaled", x, OpArgs{}.set("s", int64_t{3})).value().data<double>()[1] == 4.5);
  CHECK_THROWS_WITH_AS(r.call("uncallable", x, OpArgs{}),
                       doctest::Contains("op 'uncallable' is not called by name: its sheet (family arithmetic) gives "
                                         "it no .call; the ops called by name: scaled"),
                       Error);
  CHECK_THROWS_WITH_AS(r.call("nosuch", x, OpArgs{}),
                       doctest::Contains("no op 'nosuch'; the ops called by name: scaled"), Error);
  CHECK_THROWS_WITH_AS(r.call("scaled", {}, OpArgs{}), doctest::Contains("scaled: takes 1 value, got 0"), Error);
  CHECK_THROWS_WITH_AS(r.call("scaled", x, OpArgs{}.set("s", std::string("two"))),
                       doctest::Contains("scaled on shapes (2): scaled: the keyword s= must be a number, got the "
                                         "string 'two'"),
                       Error);
  // A call needs to say how many inputs it takes.
  CHECK_THROWS_WITH_AS(
      r.add(std::vector<OpSheet>{{.name = "countless",
                                  .family = "arithmetic",
                                  .call = [](std::span<const Var> v, const OpArgs&) { return v[0]; }}}),
      doctest::Contains("op 'countless' has a .call and no .inputs"), Error);
}

TEST_CASE("every built-in op is callable by name, with the keywords its sheet reads") {
  for (const OpSheet& op : builtin_registry().ops()) {
    CAPTURE(op.name);
    CHECK(op.call);
    CHECK(op.inputs.max > 0);
  }
  Tape tape;
  const std::vector<Var> x{tape.leaf(Tensor::full(DType::f64, {2, 3}, 1.0))};
  CHECK(builtin_registry().call("sum", x, OpArgs{}.set("axis", int64_t{1})).shape() == Shape{2});
  CHECK(builtin_registry().call("sum", x, OpArgs{}).shape() == Shape{});
  CHECK(builtin_registry().call("reshape", x, OpArgs{}.set("shape", std::vector<int64_t>{3, 2})).shape() ==
        Shape{3, 2});
  CHECK_THROWS_WITH_AS(builtin_registry().call("slice", x, OpArgs{}.set("axis", int64_t{0}).set("start", int64_t{0})),
                       doctest::Contains("slice on shapes (2, 3): slice: needs the keyword stop="), Error);
  CHECK_THROWS_WITH_AS(builtin_registry().call("sum", x, OpArgs{}.set("axis", 1.0)),
                       doctest::Contains("sum: the keyword axis= must be an integer, got the number 1"), Error);
  CHECK_THROWS_WITH_AS(builtin_registry().call("concat", {}, OpArgs{}),
                       doctest::Contains("concat: takes one or more "
                                         "values, got 0"),
                       Error);
}
