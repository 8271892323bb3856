#!/usr/bin/python3
"""The PyTorch side of `tapegrad bench --vs-torch`: the same workloads in PyTorch, float32, each timed on the
strongest path the installed PyTorch offers for it.

  serve       what tapegrad bench runs: JSON commands on stdin, one per line, one JSON answer per line on stdout
              ("run" does "warmup" untimed runs, then "reps" timed ones, and answers the ms per timed run);
              tapegrad alternates short blocks of its own runs with blocks of these, so both see the same machine
  train-rss   train the default model for --steps steps and print {"vmhwm_kb": ...} (run as a child by serve)

Commands and answers in serve:
  info                      {"torch", "threads", "blas", "openmp_blas", "python", "sdpa", "compile", "blas_backend"}:
                            PyTorch's version, its thread count, the BLAS libraries loaded, whether Debian's
                            OpenBLAS-openmp is installed, the interpreter, whether scaled_dot_product_attention
                            and torch.compile exist, and the BLAS behind matrix products (the build's BLAS_INFO,
                            MKL or not, the library loaded)
  prepare id workload args  {"ok": true, "peer": "..."}, the peer naming what is timed; {"error": "..."} when the
                            workload cannot run here (tapegrad prints the reason and leaves the column empty)
  run id reps warmup        {"ms": ...}
  release id, quit          {"ok": true}

Workloads (the names tapegrad bench sends), each with its peer (the string prepare answers):
  matmul M K N                 torch.mm of (M, K) by (K, N); peer "torch.mm"
  attention_fwd NODE B H T D   the node's causal map, forward alone (under torch.no_grad) or forward + backward
  attention_bwd NODE B H T D   with a random cotangent; scale 1/sqrt(D), SDPA's default. By NODE:
    attention, tiled_attention   F.scaled_dot_product_attention(is_causal=True) when PyTorch has it (2.0 and
                                 later), peer "scaled_dot_product_attention(is_causal=True)"; otherwise
                                 nanoGPT's manual path, peer "composite: matmul, causal mask, softmax, matmul"
    beta_attention               peer "composite: matmul, mask, β row-normalize, matmul"
    linear_attention             peer "composite: elu+1 feature maps, masked matmul, row sums"
                                 (PyTorch has no fused kernel for these two)
  train_step                   one step of the GPT (models/gpt.cpp as mirrored in torch_checkpoint.py; by default
                               4 layers, 4 heads, 128 wide, context 64, batch 12, vocabulary 65): forward,
                               backward, clipping at 1.0, AdamW (betas 0.9, 0.99, weight decay 0.1 on matrices),
                               zero_grad; peer "eager". args: [] for the default model, or {model: {n_layer, n_head,
                               n_embd, block_size, attention, ...}, batch, autocast: "bf16" or null}. Softmax
                               attention runs through scaled_dot_product_attention where PyTorch has it, as
                               nanoGPT's model.py does; with autocast "bf16" the forward runs under
                               torch.autocast("cpu", torch.bfloat16) (peer "eager, bf16 autocast")
  loss_gradient                the gradient of the GPT's loss over its parameters on one batch
                               (torch.autograd.grad, no optimizer); peer "autograd.grad"; args as train_step
  loss_hvp                     H·v of the same loss for a random direction v: double backward, the gradient
                               with create_graph=True, then the gradient of <g, v> (what
                               torch.autograd.functional.hvp does); peer "double backward"
  train_step_compiled          the same step with the model's forward under torch.compile (backward, clipping
                               and AdamW unchanged); prepare compiles it and runs it once, and answers an error
                               when torch.compile is missing (before PyTorch 2.0) or fails; peer "torch.compile"

Threads and BLAS: Debian's PyTorch takes its matrix products from the system's
libblas.so.3 (PyTorch's own wheels bring MKL). The script re-runs itself, before importing torch, with
OMP_NUM_THREADS set to the thread count and, when Debian's libopenblas0-openmp is installed, LD_LIBRARY_PATH
pointing at it: OpenBLAS' OpenMP build shares PyTorch's OpenMP threads, where the pthread build would start its
own and oversubscribe the cores. `info` reports which library was loaded ("blas") and what PyTorch was built
with ("blas_backend"). While serving, whatever the libraries print goes to stderr: stdout carries the answers.

Exit code 77 when PyTorch is not importable.
"""

import json
import math
import os
import re
import resource
import sys
import time

SKIP = 77
OPENMP_BLAS_DIR = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
ENV_MARK = "TAPEGRAD_TORCH_BENCH_ENV"


def threads_from_argv():
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return int(sys.argv[i + 1])
    return os.cpu_count() or 1


if os.environ.get(ENV_MARK) != "1":  # set the environment the libraries read when they load, then start again
    env = dict(os.environ)
    env[ENV_MARK] = "1"
    env["OMP_NUM_THREADS"] = str(threads_from_argv())
    if os.path.isdir(OPENMP_BLAS_DIR):
        env["LD_LIBRARY_PATH"] = OPENMP_BLAS_DIR + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    else:
        env["OPENBLAS_NUM_THREADS"] = str(threads_from_argv())
    os.execve(sys.executable, [sys.executable] + sys.argv, env)

try:
    import torch
    import torch.nn.functional as F
except ImportError as err:
    print(json.dumps({"error": f"PyTorch is not importable by {sys.executable} ({err})"}), flush=True)
    sys.exit(SKIP)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_checkpoint import GPT  # noqa: E402  (the PyTorch mirror of models/gpt.cpp)

DEFAULT_MODEL = {"vocab_size": 65, "block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128, "dropout": 0.0,
                 "bias": False, "attention": "softmax"}
BATCH = 12


def loaded_blas():
    """The BLAS shared object this process mapped (libblas.so.3 resolves to one OpenBLAS build or another)."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if ("blas" in path or "openblas" in path) and path not in found:
                found.append(os.path.realpath(path))
    return sorted(set(found))


def has_sdpa():
    """Whether this PyTorch has the fused attention F.scaled_dot_product_attention (2.0 and later)."""
    return hasattr(F, "scaled_dot_product_attention")


def has_compile():
    """Whether this PyTorch has torch.compile (2.0 and later)."""
    return hasattr(torch, "compile")


def blas_backend():
    """What PyTorch's matrix products run on: the build's BLAS_INFO, whether it has MKL, and the BLAS loaded."""
    found = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    parts = ["BLAS_INFO=" + (found.group(1) if found else "?"),
             "MKL" if torch.backends.mkl.is_available() else "no MKL"]
    loaded = loaded_blas()
    parts.append("loaded " + ", ".join(loaded) if loaded else "no BLAS library loaded")
    return "; ".join(parts)


class Unavailable(Exception):
    """A workload this PyTorch cannot run; the message is the whole answer."""


# ---- workloads ---------------------------------------------------------------------------------------------------

def causal_keep(T):
    return torch.ones(T, T).tril()


SDPA_PEER = "scaled_dot_product_attention(is_causal=True)"
COMPOSITE_PEERS = {
    "attention": "composite: matmul, causal mask, softmax, matmul",
    "tiled_attention": "composite: matmul, causal mask, softmax, matmul",
    "beta_attention": "composite: matmul, mask, β row-normalize, matmul",
    "linear_attention": "composite: elu+1 feature maps, masked matmul, row sums",
}
SOFTMAX_NODES = ("attention", "tiled_attention")


def composite(node, q, k, v, keep):
    """The node's map from primitive PyTorch ops, causal (key j <= query i), as nanoGPT's manual attention path."""
    if node == "linear_attention":
        w = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1) * keep
        return (w @ v) / w.sum(dim=-1, keepdim=True)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    if node == "beta_attention":
        p = att * keep
        return (p / (1 + p.norm(dim=-1, keepdim=True))) @ v
    att = att.masked_fill(keep == 0, float("-inf"))
    return F.softmax(att, dim=-1) @ v


def sdpa(q, k, v):
    """Causal softmax attention by PyTorch's fused kernel; its default scale is the composite's 1/sqrt(d)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Matmul:
    peer = "torch.mm"

    def __init__(self, m, k, n):
        gen = torch.Generator().manual_seed(1)
        self.a = torch.randn(m, k, generator=gen)
        self.b = torch.randn(k, n, generator=gen)

    def run(self):
        torch.mm(self.a, self.b)


class AttentionNode:
    def __init__(self, node, backward, B, H, T, D):
        if node not in COMPOSITE_PEERS:
            raise ValueError(f"unknown attention node {node}")
        gen = torch.Generator().manual_seed(2)
        self.node, self.backward = node, backward
        self.q, self.k, self.v = (torch.randn(B, H, T, D, generator=gen).requires_grad_(backward) for _ in range(3))
        self.g = torch.randn(B, H, T, D, generator=gen)
        self.keep = causal_keep(T)
        self.fused = node in SOFTMAX_NODES and has_sdpa()
        self.peer = SDPA_PEER if self.fused else COMPOSITE_PEERS[node]

    def forward(self):
        if self.fused:
            return sdpa(self.q, self.k, self.v)
        return composite(self.node, self.q, self.k, self.v, self.keep)

    def run(self):
        if not self.backward:
            with torch.no_grad():
                self.forward()
            return
        self.forward().backward(self.g)
        self.q.grad = self.k.grad = self.v.grad = None


class TrainStep:
    peer = "eager"

    def __init__(self, cfg=DEFAULT_MODEL, batch=BATCH, autocast=None, seed=1337):
        torch.manual_seed(seed)
        self.autocast = autocast
        if autocast == "bf16":
            self.peer += ", bf16 autocast"
        elif autocast is not None:
            raise ValueError(f"autocast {autocast!r}: expected bf16")
        self.model = GPT(cfg)
        self.forward = self.model
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.model.named_parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                      {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.99))
        gen = torch.Generator().manual_seed(seed)
        T = cfg["block_size"]
        self.batches = [(torch.randint(cfg["vocab_size"], (batch, T), generator=gen),
                         torch.randint(cfg["vocab_size"], (batch, T), generator=gen)) for _ in range(8)]
        self.i = 0

    def run(self):
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        if self.autocast == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                _, loss = self.forward(x, y)
        else:
            _, loss = self.forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()


class CompiledTrainStep(TrainStep):
    """TrainStep with the model's forward under torch.compile; compiled here, by a first step, so that a failure
    shows at prepare and the compilation is not timed."""
    peer = "torch.compile"

    def __init__(self, **step_args):
        if not has_compile():
            raise Unavailable(f"torch.compile is not available in PyTorch {torch.__version__} (it needs 2.0 or later)")
        super().__init__(**step_args)
        try:
            self.forward = torch.compile(self.model)
            self.run()
        except Exception as err:
            lines = str(err).strip().splitlines()
            raise Unavailable(f"torch.compile failed: {type(err).__name__}: {lines[0] if lines else ''}")


class LossDerivative:
    """The gradient, or one Hessian-vector product by double backward, of the GPT's loss on one batch."""

    def __init__(self, hvp, cfg=DEFAULT_MODEL, batch=BATCH, seed=1337):
        torch.manual_seed(seed)
        self.hvp = hvp
        self.peer = "double backward" if hvp else "autograd.grad"
        self.model = GPT(cfg)
        self.params = list(self.model.parameters())
        gen = torch.Generator().manual_seed(seed)
        T = cfg["block_size"]
        self.x = torch.randint(cfg["vocab_size"], (batch, T), generator=gen)
        self.y = torch.randint(cfg["vocab_size"], (batch, T), generator=gen)
        self.v = [torch.randn(p.shape, generator=gen) for p in self.params]

    def run(self):
        _, loss = self.model(self.x, self.y)
        if not self.hvp:
            return torch.autograd.grad(loss, self.params)
        grads = torch.autograd.grad(loss, self.params, create_graph=True)
        return torch.autograd.grad(grads, self.params, grad_outputs=self.v)


def make(workload, args):
    if workload == "matmul":
        return Matmul(*args)
    if workload in ("attention_fwd", "attention_bwd"):
        return AttentionNode(args[0], workload == "attention_bwd", *[int(a) for a in args[1:]])
    if workload in ("train_step", "train_step_compiled"):
        step_args = {}
        if args:  # {model: {...}, batch, autocast}
            step_args = {"cfg": {**DEFAULT_MODEL, **args.get("model", {})}, "batch": args.get("batch", BATCH),
                         "autocast": args.get("autocast")}
        return TrainStep(**step_args) if workload == "train_step" else CompiledTrainStep(**step_args)
    if workload in ("loss_gradient", "loss_hvp"):
        return LossDerivative(workload == "loss_hvp", cfg={**DEFAULT_MODEL, **args.get("model", {})},
                              batch=args.get("batch", BATCH))
    raise ValueError(f"unknown workload {workload}")


# ---- modes -------------------------------------------------------------------------------------------------------

def vmhwm_kb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def train_rss(steps, data_path):
    """A training run as nanoGPT's loop on the text file (characters as tokens); prints the peak RSS."""
    with open(data_path, encoding="utf-8") as f:
        text = f.read()
    vocab = sorted(set(text))
    cfg = dict(DEFAULT_MODEL, vocab_size=len(vocab))
    index = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    step = TrainStep(cfg)
    gen = torch.Generator().manual_seed(1337)
    T = cfg["block_size"]
    for _ in range(steps):
        ix = torch.randint(len(data) - T - 1, (BATCH,), generator=gen)
        step.batches = [(torch.stack([data[i:i + T] for i in ix]), torch.stack([data[i + 1:i + 1 + T] for i in ix]))]
        step.run()
    print(json.dumps({"vmhwm_kb": vmhwm_kb()}), flush=True)


def serve(threads):
    torch.set_num_threads(threads)
    answers, sys.stdout = sys.stdout, sys.stderr  # what the libraries print (torch.compile's notes) goes to stderr
    prepared = {}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "info":
                answer = {"torch": torch.__version__, "threads": torch.get_num_threads(), "blas": loaded_blas(),
                          "openmp_blas": os.path.isdir(OPENMP_BLAS_DIR), "python": sys.executable,
                          "sdpa": has_sdpa(), "compile": has_compile(), "blas_backend": blas_backend()}
            elif cmd["cmd"] == "prepare":
                work = make(cmd["workload"], cmd["args"])
                prepared[cmd["id"]] = work
                answer = {"ok": True, "peer": work.peer}
            elif cmd["cmd"] == "run":
                work = prepared[cmd["id"]]
                for _ in range(cmd.get("warmup", 0)):
                    work.run()
                t0 = time.perf_counter()
                for _ in range(cmd["reps"]):
                    work.run()
                answer = {"ms": (time.perf_counter() - t0) * 1000 / cmd["reps"]}
            elif cmd["cmd"] == "release":
                prepared.pop(cmd["id"], None)
                answer = {"ok": True}
            elif cmd["cmd"] == "quit":
                print(json.dumps({"ok": True}), file=answers, flush=True)
                return
            else:
                answer = {"error": f"unknown command {cmd['cmd']}"}
        except Unavailable as err:  # reported to tapegrad, which prints it and leaves the torch column empty
            answer = {"error": str(err)}
        except Exception as err:  # likewise
            answer = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(answer), file=answers, flush=True)


def main():
    import argparse
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["serve", "train-rss"])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                                       "tinyshakespeare.txt"))
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.threads)
    else:
        torch.set_num_threads(args.threads)
        train_rss(args.steps, args.data)


if __name__ == "__main__":
    main()
