#!/usr/bin/python3
"""Cross-check of tapegrad's attention nodes against PyTorch autograd, in float64.

For every case below the script draws Q, K, V (B, h, T, d) / (B, h, Tk, d) / (B, h, Tk, dv), a bias of one of
the broadcast shapes and an upstream gradient G, writes them to a safetensors file, runs the C++ bridge
(tests/torch_attention_bridge.cpp), which evaluates tapegrad's node and its backward with G, and compares the
bridge's O, dQ, dK, dV (and dbias) with the same map written in plain PyTorch ops and differentiated by autograd.

The reference maps (docs/derivations.md §1.4, §2.1, §4.1, §5), s = 1/sqrt(d), causal: key j <= i:
  attention, tiled_attention   O = softmax(s Q K^T + bias + M) V           M = -inf where j > i
  beta_attention               O = beta((s Q K^T) * M01) V                 beta(x) = x / (1 + ||x||) per row
  linear_attention             O = ((phi(Q) phi(K)^T * M01) V) / ((phi(Q) phi(K)^T * M01) 1),  phi = elu + 1
where M01 is the 0/1 causal mask (all ones without a mask).

Exit codes: 0 every difference <= the tolerance, 1 a difference above it or a failed bridge,
77 PyTorch is not importable (ctest reports the test as skipped).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

SKIP = 77

try:
    import torch
except ImportError as err:  # the check needs torch; without it the test is skipped, not passed
    print(f"SKIPPED: PyTorch is not importable by {sys.executable} ({err})")
    sys.exit(SKIP)

import safetensors_io  # noqa: E402  (tools/safetensors_io.py, next to this script)

B, H = 2, 3

# (name, node, causal, bias shape or None, T, Tk, d, dv, tiled block)
CASES = [
    ("attention", "attention", False, None, 5, 7, 4, 3, 0),
    ("attention_causal", "attention", True, None, 6, 6, 4, 3, 0),
    ("attention_bias_BhTTk", "attention", False, "B,h,T,Tk", 5, 7, 4, 3, 0),
    ("attention_bias_hTTk", "attention", False, "h,T,Tk", 5, 7, 4, 3, 0),
    ("attention_bias_TTk", "attention", False, "T,Tk", 5, 7, 4, 3, 0),
    ("attention_bias_B1TTk", "attention", False, "B,1,T,Tk", 5, 7, 4, 3, 0),
    ("attention_bias_B11Tk", "attention", False, "B,1,1,Tk", 5, 7, 4, 3, 0),
    ("attention_causal_bias_BhTTk", "attention", True, "B,h,T,Tk", 6, 6, 4, 3, 0),
    ("attention_causal_bias_TTk", "attention", True, "T,Tk", 6, 6, 4, 3, 0),
    ("beta", "beta_attention", False, None, 5, 7, 4, 3, 0),
    ("beta_causal", "beta_attention", True, None, 6, 6, 4, 3, 0),
    ("linear", "linear_attention", False, None, 5, 7, 4, 3, 0),
    ("linear_causal", "linear_attention", True, None, 6, 6, 4, 3, 0),
    ("linear_causal_chunks", "linear_attention", True, None, 70, 70, 4, 3, 0),
    ("linear_chunks", "linear_attention", False, None, 67, 130, 4, 3, 0),
    ("tiled", "tiled_attention", False, None, 5, 7, 4, 3, 3),
    ("tiled_bias_BhTTk", "tiled_attention", False, "B,h,T,Tk", 7, 10, 4, 3, 4),
    ("tiled_bias_hTTk", "tiled_attention", False, "h,T,Tk", 7, 10, 4, 3, 4),
    ("tiled_bias_TTk", "tiled_attention", False, "T,Tk", 7, 10, 4, 3, 4),
    ("tiled_bias_B1TTk", "tiled_attention", False, "B,1,T,Tk", 7, 10, 4, 3, 4),
    ("tiled_bias_B11Tk", "tiled_attention", False, "B,1,1,Tk", 7, 10, 4, 3, 4),
    ("tiled_causal_bias_BhTTk", "tiled_attention", True, "B,h,T,Tk", 9, 9, 4, 3, 4),
    ("tiled_causal_bias_B11Tk", "tiled_attention", True, "B,1,1,Tk", 9, 9, 4, 3, 4),
]


def bias_shape(layout, T, Tk):
    size = {"B": B, "h": H, "T": T, "Tk": Tk, "1": 1}
    return tuple(size[a] for a in layout.split(","))


def causal_keep(T, Tk):
    """0/1 mask (T, Tk): 1 where key j <= query i."""
    return torch.ones(T, Tk, dtype=torch.float64).tril()


def reference_softmax(q, k, v, causal, bias):
    s = 1.0 / math.sqrt(q.shape[-1])
    scores = s * q @ k.transpose(-1, -2)
    if bias is not None:
        scores = scores + bias
    if causal:
        hidden = causal_keep(q.shape[-2], k.shape[-2]) == 0
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def reference_beta(q, k, v, causal):
    s = 1.0 / math.sqrt(q.shape[-1])
    p = s * q @ k.transpose(-1, -2)
    if causal:
        p = p * causal_keep(q.shape[-2], k.shape[-2])
    return (p / (1.0 + p.norm(dim=-1, keepdim=True))) @ v


def reference_linear(q, k, v, causal):
    phi_q = torch.nn.functional.elu(q) + 1.0
    phi_k = torch.nn.functional.elu(k) + 1.0
    w = phi_q @ phi_k.transpose(-1, -2)
    if causal:
        w = w * causal_keep(q.shape[-2], k.shape[-2])
    return (w @ v) / w.sum(dim=-1, keepdim=True)


def reference(node, q, k, v, causal, bias):
    if node in ("attention", "tiled_attention"):
        return reference_softmax(q, k, v, causal, bias)
    if node == "beta_attention":
        return reference_beta(q, k, v, causal)
    if node == "linear_attention":
        return reference_linear(q, k, v, causal)
    raise ValueError(f"unknown node {node}")


def make_inputs(gen):
    tensors, specs = {}, []
    for name, node, causal, layout, T, Tk, d, dv, block in CASES:
        randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
        t = {"q": randn(B, H, T, d), "k": randn(B, H, Tk, d), "v": randn(B, H, Tk, dv), "g": randn(B, H, T, dv)}
        if layout is not None:
            t["bias"] = randn(*bias_shape(layout, T, Tk))
        for key, value in t.items():
            tensors[f"{name}/{key}"] = value
        spec = {"name": name, "node": node, "causal": causal, "bias": layout is not None}
        if block:
            spec["block"] = block
        specs.append(spec)
    return tensors, specs


def torch_results(name, node, causal, has_bias, inputs):
    leaves = {key: inputs[f"{name}/{key}"].clone().requires_grad_(True) for key in ("q", "k", "v", "bias")
              if key != "bias" or has_bias}
    o = reference(node, leaves["q"], leaves["k"], leaves["v"], causal, leaves.get("bias"))
    o.backward(inputs[f"{name}/g"])
    out = {"o": o.detach()}
    for key, leaf in leaves.items():
        out["d" + key] = leaf.grad
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bridge", required=True, help="path of the torch_attention_bridge program")
    ap.add_argument("--tol", type=float, default=1e-9, help="largest max-abs difference allowed (float64)")
    ap.add_argument("--seed", type=int, default=20240809)
    ap.add_argument("--keep", help="write the input and output files into this directory and keep them")
    args = ap.parse_args()

    gen = torch.Generator().manual_seed(args.seed)
    inputs, specs = make_inputs(gen)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or tmp
        os.makedirs(work, exist_ok=True)
        in_path = os.path.join(work, "attention_in.safetensors")
        out_path = os.path.join(work, "attention_out.safetensors")
        safetensors_io.save(in_path, {k: v.numpy() for k, v in inputs.items()}, {"tapegrad.cases": json.dumps(specs)})
        run = subprocess.run([args.bridge, in_path, out_path], capture_output=True, text=True)
        if run.returncode != 0:
            print(f"FAILED: the bridge exited with {run.returncode}\n{run.stdout}{run.stderr}")
            return 1
        got, _ = safetensors_io.load(out_path)

    print(f"{'node':<17} {'case':<28} {'tensor':<6} {'max |tapegrad - torch|':>22}")
    worst, failed = 0.0, []
    for name, node, causal, layout, *_ in CASES:
        want = torch_results(name, node, causal, layout is not None, inputs)
        for key, ref in want.items():
            mine = got.get(f"{name}/{key}")
            if mine is None or tuple(mine.shape) != tuple(ref.shape):
                shape = None if mine is None else tuple(mine.shape)
                print(f"{node:<17} {name:<28} {key:<6} {'shape ' + str(shape) + ' vs ' + str(tuple(ref.shape)):>22}")
                failed.append(f"{name}/{key}")
                continue
            diff = (torch.from_numpy(mine) - ref).abs().max().item()
            worst = max(worst, diff)
            mark = "" if diff <= args.tol else "  FAIL"
            if mark:
                failed.append(f"{name}/{key}")
            print(f"{node:<17} {name:<28} {key:<6} {diff:>22.3e}{mark}")
    print(f"\n{len(CASES)} cases, largest difference {worst:.3e} (tolerance {args.tol:.0e}, float64, "
          f"torch {torch.__version__})")
    if failed:
        print(f"FAILED: {len(failed)} tensors above the tolerance: {', '.join(failed)}")
        return 1
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
