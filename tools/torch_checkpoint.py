#!/usr/bin/python3
"""Checkpoints across tapegrad and PyTorch: a PyTorch GPT that mirrors models/gpt.cpp, in both directions.

  load    read a checkpoint written by `tapegrad train` into the PyTorch model, compute the loss and the logits
          of fixed texts, and compare with `tapegrad evaluate` on the same checkpoint and texts
  export  build the PyTorch model with random weights, write it as a tapegrad checkpoint, have tapegrad load it
          (`tapegrad evaluate`) and compare the same way; one model per attention kind given
  hvp     one Hessian-vector product of the loss of a text over the parameters: tapegrad's (`tapegrad evaluate
          --hvp-out`, from each op's hand-derived second-order rule) against PyTorch's double backward,
          autograd.grad of the gradient, on the same checkpoint, text and direction
  test    what ctest runs: `tapegrad train` for 20 steps into a temporary directory, then load, hvp, then export

The model (models/gpt.cpp, nanoGPT's layout and parameter names): token + position embeddings, n_layer pre-norm
blocks x += attn(ln_1(x)); x += mlp(ln_2(x)) with mlp = c_proj(gelu(c_fc(.))), a final ln_f, and the head
tied to the token embedding. The gelu is the exact x*Phi(x) (nanoGPT's nn.GELU()) when the configuration says
gelu = "exact", GPT-2's tanh form when it says "tanh" or nothing (checkpoints from before the choice). LayerNorm
has eps 1e-5 and no bias unless bias = true; Linear layers likewise.
Attention is causal (key j <= query i) with scale 1/sqrt(d) per head, d = n_embd / n_head:
  softmax, tiled   A = softmax(s q k^T + M) v, M = -inf above the diagonal                       c_attn: q, k, v
  beta             beta(s q k^T * M01) v, beta(x) = x / (1 + ||x||) per row, masked scores 0       c_attn: q, k, v
  linear           (W v) / (W 1), W = (phi(q) phi(k)^T) * M01, phi = elu + 1, no scale            c_attn: q, k, v
  optimised        as softmax with v = the block input x split into heads (no value projection)   c_attn: q, k
  efficient        as softmax with k = v = x split into heads                                     c_attn: q
  super            as efficient with v = tril(w_a[:T, :T]) x; w_a (block_size, block_size)        c_attn: q

Exit codes: 0 every comparison within tolerance, 1 a difference above it or a failed command,
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
    import torch.nn.functional as F
except ImportError as err:  # without torch the check is skipped, not passed
    print(f"SKIPPED: PyTorch is not importable by {sys.executable} ({err})")
    sys.exit(SKIP)

import numpy as np  # noqa: E402

import safetensors_io  # noqa: E402  (tools/safetensors_io.py, next to this script)

KINDS = ["softmax", "tiled", "beta", "linear", "optimised", "efficient", "super"]
LOSS_RTOL = 1e-5     # |loss_tapegrad - loss_torch| / |loss_torch|, both float32
LOGITS_ATOL = 1e-4   # max |logits_tapegrad - logits_torch| at the last position, float32
HVP_RTOL = 1e-3      # ||Hv_tapegrad - Hv_torch|| / ||Hv_torch||, tapegrad float32 against torch float64
SAMPLE_TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
               "First Citizen:\nYou are all resolved rather to die than to famish?\n")


# ---- the model -------------------------------------------------------------------------------------------------

class LayerNorm(torch.nn.Module):
    """Over the last axis, eps 1e-5; the bias is optional (absent when the model has bias = false)."""

    def __init__(self, n, bias):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.bias = torch.nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


def causal_keep(T, dtype):
    return torch.ones(T, T, dtype=dtype).tril()


class Attention(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, kind = cfg["n_embd"], cfg["attention"]
        projections = {"optimised": 2, "efficient": 1, "super": 1}.get(kind, 3)
        self.kind, self.n_head, self.n_embd = kind, cfg["n_head"], C
        self.c_attn = torch.nn.Linear(C, projections * C, bias=cfg["bias"])
        if kind == "super":
            self.w_a = torch.nn.Parameter(torch.zeros(cfg["block_size"], cfg["block_size"]))
        self.c_proj = torch.nn.Linear(C, C, bias=cfg["bias"])

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        heads = lambda t: t.reshape(B, T, H, C // H).transpose(1, 2)  # (B, T, C) -> (B, h, T, d)
        a = self.c_attn(x)
        q = heads(a[..., :C])
        if self.kind == "optimised":
            k, v = heads(a[..., C : 2 * C]), heads(x)
        elif self.kind == "efficient":
            k, v = heads(x), heads(x)
        elif self.kind == "super":
            k, v = heads(x), heads(torch.tril(self.w_a[:T, :T]) @ x)
        else:
            k, v = heads(a[..., C : 2 * C]), heads(a[..., 2 * C : 3 * C])
        y = attend(self.kind, q, k, v)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


def attend(kind, q, k, v):
    """Causal attention of one kind on (B, h, T, d) heads."""
    T = q.shape[-2]
    keep = causal_keep(T, q.dtype)
    if kind == "linear":
        w = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2) * keep
        return (w @ v) / w.sum(dim=-1, keepdim=True)
    if kind != "beta" and hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2.0 and later, as nanoGPT
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if kind == "beta":
        p = scores * keep
        return (p / (1 + p.norm(dim=-1, keepdim=True))) @ v
    return torch.softmax(scores.masked_fill(keep == 0, float("-inf")), dim=-1) @ v


class MLP(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["n_embd"]
        self.c_fc = torch.nn.Linear(C, 4 * C, bias=cfg["bias"])
        self.c_proj = torch.nn.Linear(4 * C, C, bias=cfg["bias"])
        self.approximate = {"exact": "none", "tanh": "tanh"}[cfg.get("gelu", "tanh")]

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))


class Block(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.attn = Attention(cfg)
        self.ln_2 = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(torch.nn.Module):
    """named_parameters() are exactly tapegrad's checkpoint names; the head is tied (no lm_head parameter)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = dict(cfg)
        self.transformer = torch.nn.ModuleDict(dict(
            wte=torch.nn.Embedding(cfg["vocab_size"], cfg["n_embd"]),
            wpe=torch.nn.Embedding(cfg["block_size"], cfg["n_embd"]),
            h=torch.nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])]),
            ln_f=LayerNorm(cfg["n_embd"], cfg["bias"]),
        ))

    def forward(self, idx, targets):
        t = self.transformer
        pos = torch.arange(idx.shape[1])
        x = t.wte(idx) + t.wpe(pos)
        for block in t.h:
            x = block(x)
        logits = F.linear(t.ln_f(x), t.wte.weight)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


# ---- checkpoints -----------------------------------------------------------------------------------------------

def model_from_checkpoint(path):
    """The PyTorch model (float32) and vocabulary of a tapegrad checkpoint; every model tensor must match."""
    tensors, meta = safetensors_io.load(path)
    if "tapegrad.model" not in meta:
        raise ValueError(f"{path}: no 'tapegrad.model' in the metadata: not a tapegrad checkpoint")
    cfg = json.loads(meta["tapegrad.model"])
    model = GPT(cfg)
    state = model.state_dict()
    extra = [n for n in tensors if n not in state and not n.startswith("optimizer.")]
    if extra:
        raise ValueError(f"{path}: tensors the PyTorch model does not have: {extra}")
    for name, value in state.items():
        if name not in tensors:
            raise ValueError(f"{path}: no tensor {name}")
        if tuple(tensors[name].shape) != tuple(value.shape) or tensors[name].dtype != np.float32:
            raise ValueError(f"{path}: {name} is {tensors[name].dtype} {tensors[name].shape}, "
                             f"expected float32 {tuple(value.shape)}")
        value.copy_(torch.from_numpy(tensors[name]))
    return model, meta["tapegrad.vocab"]


def save_tapegrad_checkpoint(path, model, vocab):
    """The metadata tapegrad's loader reads: format, model configuration, vocabulary (sorted distinct chars)."""
    meta = {"format": "tapegrad-gpt", "tapegrad.model": json.dumps(model.cfg), "tapegrad.vocab": vocab}
    tensors = {name: p.detach().numpy().astype(np.float32) for name, p in model.named_parameters()}
    safetensors_io.save(path, tensors, meta)


def random_model(cfg, seed):
    """Random weights of the scale training reaches: every parameter, norms and biases too, moves the logits."""
    gen = torch.Generator().manual_seed(seed)
    model = GPT(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".w_a"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_((0.3 if p.dim() == 2 else 0.1) * torch.randn(p.shape, generator=gen))
    return model


# ---- comparison ------------------------------------------------------------------------------------------------

def encode(text, vocab):
    index = {c: i for i, c in enumerate(vocab)}
    missing = sorted(set(c for c in text if c not in index))
    if missing:
        raise ValueError(f"characters not in the vocabulary: {missing!r}")
    return [index[c] for c in text]


def torch_eval(model, ids, dtype):
    m = GPT(model.cfg).to(dtype)
    m.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()})
    idx = torch.tensor([ids[:-1]])
    with torch.no_grad():
        logits, loss = m(idx, torch.tensor([ids[1:]]))
    return loss.item(), logits[0, -1].double()


def tapegrad_eval(binary, checkpoint, text):
    run = subprocess.run([binary, "evaluate", "--checkpoint", checkpoint, "--text", text, "--json"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"tapegrad evaluate exited with {run.returncode}: {run.stdout}{run.stderr}".strip())
    return json.loads(run.stdout)


def compare(label, binary, checkpoint, model, vocab, texts):
    """One row per text; returns the failures."""
    failures = []
    for text in texts:
        ids = encode(text, vocab)
        got = tapegrad_eval(binary, checkpoint, text)
        if got["tokens"] != ids:
            failures.append(f"{label}: tapegrad encoded the text differently")
            continue
        loss32, logits32 = torch_eval(model, ids, torch.float32)
        loss64, _ = torch_eval(model, ids, torch.float64)
        mine = torch.tensor(got["logits"], dtype=torch.float64)
        loss_rel = abs(got["loss"] - loss32) / abs(loss32)
        loss_rel64 = abs(got["loss"] - loss64) / abs(loss64)
        logits_abs = (mine - logits32).abs().max().item()
        ok = loss_rel <= LOSS_RTOL and logits_abs <= LOGITS_ATOL
        print(f"{label:<36} T={len(ids) - 1:<4} loss {got['loss']:.7f} torch {loss32:.7f}  rel {loss_rel:.1e} "
              f"(vs f64 {loss_rel64:.1e})  logits max|diff| {logits_abs:.1e}{'' if ok else '  FAIL'}")
        if not ok:
            failures.append(f"{label} T={len(ids) - 1}")
    return failures


def texts_for(vocab, block_size):
    """A full context (block_size + 1 characters) and a shorter one, from SAMPLE_TEXT or else the vocabulary."""
    source = SAMPLE_TEXT if all(c in vocab for c in SAMPLE_TEXT) else (vocab * (block_size + 2))
    source = (source * (1 + (block_size + 1) // len(source)))
    return [source[: block_size + 1], source[: max(2, block_size // 2)]]


# ---- modes -----------------------------------------------------------------------------------------------------

def mode_load(binary, checkpoint):
    model, vocab = model_from_checkpoint(checkpoint)
    print(f"load: {checkpoint} ({model.cfg['attention']}, {model.cfg['n_layer']} layers, "
          f"{sum(p.numel() for p in model.parameters())} parameters)")
    return compare(f"load {model.cfg['attention']} gelu {model.cfg.get('gelu', '(none)')}", binary, checkpoint, model,
                   vocab, texts_for(vocab, model.cfg["block_size"]))


def mode_hvp(binary, checkpoint, out_dir):
    """H·v of the loss of a full-context text: tapegrad (float32) against PyTorch's double backward (float32 and
    float64), for the direction tapegrad drew; returns the failures."""
    model, vocab = model_from_checkpoint(checkpoint)
    text = texts_for(vocab, model.cfg["block_size"])[0]
    ids = encode(text, vocab)
    path = os.path.join(out_dir, "hvp.safetensors")
    run = subprocess.run([binary, "evaluate", "--checkpoint", checkpoint, "--text", text, "--hvp-out", path],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(
            f"tapegrad evaluate --hvp-out exited with {run.returncode}: {run.stdout}{run.stderr}".strip())
    tensors, _ = safetensors_io.load(path)
    results = {}
    for dtype in (torch.float32, torch.float64):
        m = GPT(model.cfg).to(dtype)
        m.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()})
        names = [n for n, _ in m.named_parameters()]
        params = [p for _, p in m.named_parameters()]
        v = [torch.from_numpy(tensors["direction." + n]).to(dtype) for n in names]
        _, loss = m(torch.tensor([ids[:-1]]), torch.tensor([ids[1:]]))
        grads = torch.autograd.grad(loss, params, create_graph=True)
        results[dtype] = torch.autograd.grad(grads, params, grad_outputs=v)
    mine = torch.cat([torch.from_numpy(tensors["hvp." + n]).double().flatten() for n, _ in model.named_parameters()])
    ref64 = torch.cat([h.double().flatten() for h in results[torch.float64]])
    ref32 = torch.cat([h.double().flatten() for h in results[torch.float32]])
    rel = ((mine - ref64).norm() / ref64.norm()).item()
    rel32 = ((ref32 - ref64).norm() / ref64.norm()).item()
    ok = rel <= HVP_RTOL
    label = f"hvp {model.cfg['attention']} gelu {model.cfg.get('gelu', '(none)')}"
    print(f"{label:<36} T={len(ids) - 1:<4} ||Hv|| {ref64.norm().item():.6g}  tapegrad f32 vs torch f64 rel "
          f"{rel:.1e} (torch f32 vs f64 {rel32:.1e}){'' if ok else '  FAIL'}")
    return [] if ok else [label]


def mode_export(binary, kinds, out_dir, bias_values, seed):
    failures = []
    vocab = "".join(sorted(set(SAMPLE_TEXT)))
    for kind in kinds:
        for bias in bias_values:
            cfg = {"vocab_size": len(vocab), "block_size": 24, "n_layer": 2, "n_head": 2, "n_embd": 16,
                   "dropout": 0.0, "bias": bias, "attention": kind}
            # Without biases the exact gelu; with them no "gelu" at all, as a checkpoint from before the choice
            # (tapegrad must read it as the tanh form, as the mirror does).
            if not bias:
                cfg["gelu"] = "exact"
            model = random_model(cfg, seed)
            path = os.path.join(out_dir, f"export_{kind}{'_bias' if bias else ''}.safetensors")
            save_tapegrad_checkpoint(path, model, vocab)
            label = f"export {kind}{' bias' if bias else ''} gelu {cfg.get('gelu', '(none)')}"
            failures += compare(label, binary, path, model, vocab, texts_for(vocab, cfg["block_size"]))
            failures += mode_hvp(binary, path, out_dir)
    return failures


def mode_test(binary, data, kinds, keep):
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        work = keep or tmp
        os.makedirs(work, exist_ok=True)
        for kind, gelu in (("softmax", "exact"), ("super", "tanh")):
            cmd = [binary, "train", "--attention", kind, "--gelu", gelu, "--data", data, "--n-layer", "2",
                   "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4", "--max-iters", "20",
                   "--warmup-iters", "2", "--lr", "1e-2", "--eval-interval", "10", "--eval-iters", "2",
                   "--sample-tokens", "0", "--out", work, "--name", kind, "--quiet"]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"FAILED: tapegrad train exited with {run.returncode}: {run.stdout}{run.stderr}")
                return [f"train {kind}"]
            failures += mode_load(binary, os.path.join(work, kind, "checkpoint.safetensors"))
            failures += mode_hvp(binary, os.path.join(work, kind, "checkpoint.safetensors"), work)
        failures += mode_export(binary, kinds, work, (False, True), 7)
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["load", "hvp", "export", "test"])
    ap.add_argument("--tapegrad", required=True, help="path of the tapegrad program")
    ap.add_argument("--checkpoint", help="load, hvp: the checkpoint to read")
    ap.add_argument("--data", help="test: the text file to train on")
    ap.add_argument("--attention", default=",".join(KINDS), help="export, test: comma-separated kinds")
    ap.add_argument("--out", help="export, test: keep the checkpoints in this directory")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    kinds = [k for k in args.attention.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        ap.error(f"unknown attention kinds {unknown} (known: {', '.join(KINDS)})")
    torch.set_num_threads(1)

    try:
        if args.mode == "load":
            if not args.checkpoint:
                ap.error("load needs --checkpoint")
            failures = mode_load(args.tapegrad, args.checkpoint)
        elif args.mode == "hvp":
            if not args.checkpoint:
                ap.error("hvp needs --checkpoint")
            with tempfile.TemporaryDirectory() as tmp:
                failures = mode_hvp(args.tapegrad, args.checkpoint, tmp)
        elif args.mode == "export":
            with tempfile.TemporaryDirectory() as tmp:
                out = args.out or tmp
                os.makedirs(out, exist_ok=True)
                failures = mode_export(args.tapegrad, kinds, out, (False, True), args.seed)
        else:
            if not args.data:
                ap.error("test needs --data")
            failures = mode_test(args.tapegrad, args.data, kinds, args.out)
    except (ValueError, RuntimeError) as e:
        print(f"FAILED: {e}")
        return 1
    if failures:
        print(f"FAILED: {len(failures)} comparisons above the tolerance (loss rel {LOSS_RTOL:.0e}, logits abs "
              f"{LOGITS_ATOL:.0e}, hvp rel {HVP_RTOL:.0e}): {', '.join(failures)}")
        return 1
    print(f"PASSED (loss rel <= {LOSS_RTOL:.0e}, logits abs <= {LOGITS_ATOL:.0e}, float32; hvp rel <= {HVP_RTOL:.0e}; "
          f"torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
