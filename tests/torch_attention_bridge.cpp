// The tapegrad side of tools/torch_attention_check.py: runs attention nodes on inputs from a safetensors file
// and writes their outputs and gradients to another, for comparison with PyTorch autograd.
//
//   torch_attention_bridge IN OUT
//
// IN holds, for every case c listed in its metadata key "tapegrad.cases" (a JSON array of
//   {"name": c, "node": attention | beta_attention | linear_attention | tiled_attention,
//    "causal": bool, "bias": bool, "block": n (tiled only)}),
// the float64 tensors  c/q (B,h,T,d),  c/k (B,h,Tk,d),  c/v (B,h,Tk,dv),  c/g (B,h,T,dv)  and, with a bias,
// c/bias (any shape that broadcasts to (B,h,T,Tk)). For each case the node computes O = f(Q, K, V[, bias]) with
// the default scale s = 1/√d, backward seeds O with G, and OUT receives
//   c/o = O,   c/dq = Jᵀ_Q G,   c/dk = Jᵀ_K G,   c/dv = Jᵀ_V G,   c/dbias = Jᵀ_bias G (with a bias).
// Exit codes: 0 done, 2 a malformed input (the message names the case).
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "models/checkpoint.hpp"
#include "ops/attention/attention.hpp"

namespace {

using namespace tapegrad;

struct BridgeCase {
  std::string name, node;
  bool causal = false, bias = false;
  int64_t block = 64;
};

BridgeCase parse_case(const nlohmann::json& j) {
  BridgeCase c;
  c.name = j.at("name").get<std::string>();
  c.node = j.at("node").get<std::string>();
  c.causal = j.value("causal", false);
  c.bias = j.value("bias", false);
  c.block = j.value("block", int64_t{64});
  return c;
}

Var run_node(const BridgeCase& c, Var q, Var k, Var v, Var bias) {
  AttentionOptions opt;
  opt.causal = c.causal;
  if (c.node == "attention") return attention(q, k, v, opt, bias);
  if (c.node == "tiled_attention") return tiled_attention(q, k, v, opt, bias, c.block);
  if (c.bias) fail("case {}: node {} takes no bias", c.name, c.node);
  if (c.node == "beta_attention") return beta_attention(q, k, v, opt);
  if (c.node == "linear_attention") return linear_attention(q, k, v, c.causal);
  fail("case {}: unknown node '{}'", c.name, c.node);
}

// One case on a fresh tape: leaves for the inputs, the node, backward with G; results appended to `out`.
void run_case(const BridgeCase& c, const Checkpoint& in, Checkpoint& out) {
  Tape tape;
  const std::string p = c.name + "/";
  Var q = tape.leaf(in.at(p + "q")), k = tape.leaf(in.at(p + "k")), v = tape.leaf(in.at(p + "v"));
  Var bias = c.bias ? tape.leaf(in.at(p + "bias")) : Var{};
  Var o = run_node(c, q, k, v, bias);
  tape.backward(o, in.at(p + "g"));
  out.tensors.push_back({p + "o", o.value().clone()});
  out.tensors.push_back({p + "dq", q.grad().clone()});
  out.tensors.push_back({p + "dk", k.grad().clone()});
  out.tensors.push_back({p + "dv", v.grad().clone()});
  if (c.bias) out.tensors.push_back({p + "dbias", bias.grad().clone()});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: torch_attention_bridge IN.safetensors OUT.safetensors\n");
    return 2;
  }
  try {
    const Checkpoint in = load_checkpoint(argv[1]);
    auto it = in.metadata.find("tapegrad.cases");
    if (it == in.metadata.end()) fail("{}: no 'tapegrad.cases' in the metadata", argv[1]);
    Checkpoint out;
    for (const auto& j : nlohmann::json::parse(it->second)) {
      const BridgeCase c = parse_case(j);
      try {
        run_case(c, in, out);
      } catch (const Error& e) {
        fail("case {}: {}", c.name, e.what());
      }
    }
    save_checkpoint(argv[2], out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_attention_bridge: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
