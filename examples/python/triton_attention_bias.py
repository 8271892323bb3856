"""Attention with a trainable bias as a Triton GPU kernel, forward and backward, right and with slips.

The map is O = softmax(S)·V row by row with S = scale·Q·Kᵀ + B, scale = 1/√d, and B a bias of the scores' own shape
(batch·heads, T, T) (docs/derivations.md §5). The kernels never hold a whole T×T matrix: the forward walks the keys
in blocks with the online softmax and keeps, per query row i, only O_i and the log-sum-exp L_i = log Σ_j exp S_ij.
The backward rebuilds any tile of probabilities from its scores, P_ij = exp(S_ij − L_i), and with D_i = rowsum(dO ⊙ O)_i
(= Σ_j P_ij dP_ij, since O_i = Σ_j P_ij V_j) forms

    dV = Pᵀ·dO,   dP = dO·Vᵀ,   dS = P ⊙ (dP − D·1ᵀ),   dB = dS,   dQ = scale·dS·K,   dK = scale·dSᵀ·Q.

Inputs are bfloat16, float16 or float32; the scores, the softmax state and every product accumulate in float32
(the 16-bit operands go through the tensor cores, float32 operands in full IEEE precision, not TF32).

make_triton_attention_bias(variant) builds the kernel's torch.autograd.Function; besides "right" it builds wrong
ones, to be told apart from the right one by a gradient check at the kernel's own precision:

- "db_missing_rowsum" (a slip in every precision): dB is stored as P ⊙ dP, one line before the rowsum term is
  subtracted; dQ and dK still use the full dS, so only dB is wrong.
- "dk_no_scale" (a slip in every precision): dK = dSᵀ·Q, the factor scale left out.
- "dq_scale_twice_16bit" (a slip only for 16-bit inputs): the 16-bit launch folds scale into dS before rounding it
  for the tensor cores, and still lets the kernel multiply dQ by scale at the end: dQ comes out scale²·dS·K.
  float32 inputs take the other launch and are right.
- "accumulate_low" (a rounding defect, not a slip): dV and dK are carried across the query blocks in the input's
  dtype instead of float32. The formula is right; each block's running sum is rounded to 8 (bfloat16) or 11
  (float16) significant bits, one rounding per block of 64 query rows, so the error next to the right kernel's
  grows with T; at float32 there is none.

reference(q, k, v, b) is the same map in composite torch ops, what the kernel replaces. main() prints, for each
variant and dtype, the largest |error| of O and of each gradient against float64 autograd of reference().
"""

import math
import sys

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

VARIANTS = ("right", "db_missing_rowsum", "dk_no_scale", "dq_scale_twice_16bit", "accumulate_low")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Tiles: 64 query rows by 64 keys, the head dimension padded to a power of two (at least 16, the tensor cores'
# smallest k). Four warps per program.
BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
MAX_HEAD_DIM = 128


def reference(q, k, v, b):
    """softmax(scale·Q·Kᵀ + B)·V in composite torch ops, at the inputs' dtype and device."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    return torch.softmax(q @ k.transpose(-2, -1) * scale + b, dim=-1) @ v


if triton is not None:

    @triton.jit
    def _row_block(bh, start, T, D, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
        # Rows [start, start + BLOCK) of the T×D matrix of head bh in a row-major (heads, T, D) tensor: the row
        # indices, the element offsets, and the mask of the elements inside the matrix (rows < T, columns < D).
        rows = start + tl.arange(0, BLOCK)
        dims = tl.arange(0, BLOCK_D)
        return rows, bh * T * D + rows[:, None] * D + dims[None, :], (rows < T)[:, None] & (dims < D)[None, :]

    @triton.jit
    def _score_tile(q, k, Bias, bh, rows, keys, T, scale, DOT_PRECISION: tl.constexpr):
        # S_IJ = scale·Q_I·K_Jᵀ + B_IJ in float32; the bias reads 0 outside the T×T matrix.
        inside = (rows < T)[:, None] & (keys < T)[None, :]
        bias = tl.load(Bias + bh * T * T + rows[:, None] * T + keys[None, :], mask=inside, other=0.0)
        return tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale + bias.to(tl.float32)

    @triton.jit
    def _probability_tile(q, k, Bias, Lse, bh, rows, keys, T, scale, DOT_PRECISION: tl.constexpr):
        # P_IJ = exp(S_IJ − L_I), rebuilt from the scores; 0 outside the T×T matrix.
        s = _score_tile(q, k, Bias, bh, rows, keys, T, scale, DOT_PRECISION)
        lse = tl.load(Lse + bh * T + rows, mask=rows < T, other=0.0)
        inside = (rows < T)[:, None] & (keys < T)[None, :]
        return tl.where(inside, tl.exp(s - lse[:, None]), 0.0)

    @triton.jit
    def _forward_kernel(Q, K, V, Bias, Out, Lse, T, D, scale,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
        # One program: query rows I = [pid·BLOCK_M, +BLOCK_M) of one (batch, head). Online softmax over the key
        # blocks J: m′ = max(m, max_J S), α = exp(m − m′), ℓ′ = α·ℓ + Σ_J exp(S − m′),
        # acc′ = α·acc + exp(S − m′)·V_J; at the end O = acc/ℓ and L = m + log ℓ.
        bh = tl.program_id(1).to(tl.int64)
        rows, q_offsets, q_mask = _row_block(bh, tl.program_id(0) * BLOCK_M, T, D, BLOCK_M, BLOCK_D)
        q = tl.load(Q + q_offsets, mask=q_mask, other=0.0)
        m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        ell = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start in range(0, T, BLOCK_N):
            keys, kv_offsets, kv_mask = _row_block(bh, start, T, D, BLOCK_N, BLOCK_D)
            k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0)
            v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0)
            s = _score_tile(q, k, Bias, bh, rows, keys, T, scale, DOT_PRECISION)
            s = tl.where((keys < T)[None, :], s, float("-inf"))  # keys past T take no weight
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)  # 0 on the first block, where m = −∞
            p = tl.exp(s - m_new[:, None])
            ell = alpha * ell + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m = m_new
        tl.store(Out + q_offsets, (acc / ell[:, None]).to(Out.dtype.element_ty), mask=q_mask)
        tl.store(Lse + bh * T + rows, m + tl.log(ell), mask=rows < T)

    @triton.jit
    def _row_dot_kernel(Out, dOut, Delta, T, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        # D_i = Σ_c dO_ic·O_ic in float32: the rowsum term of dS for each query row.
        bh = tl.program_id(1).to(tl.int64)
        rows, offsets, mask = _row_block(bh, tl.program_id(0) * BLOCK_M, T, D, BLOCK_M, BLOCK_D)
        o = tl.load(Out + offsets, mask=mask, other=0.0).to(tl.float32)
        do = tl.load(dOut + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(Delta + bh * T + rows, tl.sum(o * do, 1), mask=rows < T)

    @triton.jit
    def _key_block_backward_kernel(Q, K, V, Bias, dOut, Lse, Delta, dK, dV, dBias, T, D, scale,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                   DOT_PRECISION: tl.constexpr, ACC_DTYPE: tl.constexpr,
                                   STORE_DB_BEFORE_ROWSUM: tl.constexpr, SCALE_DK: tl.constexpr):
        # One program: keys J = [pid·BLOCK_N, +BLOCK_N) of one (batch, head); walks every query block I, adds
        # dV_J += P_IJᵀ·dO_I and dK_J += dS_IJᵀ·Q_I, and writes the tile dB_IJ = dS_IJ = P ⊙ (dP − D·1ᵀ).
        bh = tl.program_id(1).to(tl.int64)
        keys, kv_offsets, kv_mask = _row_block(bh, tl.program_id(0) * BLOCK_N, T, D, BLOCK_N, BLOCK_D)
        k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC_DTYPE)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC_DTYPE)
        for start in range(0, T, BLOCK_M):
            rows, q_offsets, q_mask = _row_block(bh, start, T, D, BLOCK_M, BLOCK_D)
            q = tl.load(Q + q_offsets, mask=q_mask, other=0.0)
            do = tl.load(dOut + q_offsets, mask=q_mask, other=0.0)
            delta = tl.load(Delta + bh * T + rows, mask=rows < T, other=0.0)
            p = _probability_tile(q, k, Bias, Lse, bh, rows, keys, T, scale, DOT_PRECISION)
            # ACC_DTYPE is float32 except in the accumulate_low defect, where each sum is rounded to 16 bits.
            dv = (dv + tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=DOT_PRECISION)).to(ACC_DTYPE)
            p_dp = p * tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
            db_offsets = bh * T * T + rows[:, None] * T + keys[None, :]
            db_mask = (rows < T)[:, None] & (keys < T)[None, :]
            if STORE_DB_BEFORE_ROWSUM:  # the db_missing_rowsum slip: dB = P ⊙ dP
                tl.store(dBias + db_offsets, p_dp.to(dBias.dtype.element_ty), mask=db_mask)
            ds = p_dp - p * delta[:, None]
            if not STORE_DB_BEFORE_ROWSUM:
                tl.store(dBias + db_offsets, ds.to(dBias.dtype.element_ty), mask=db_mask)
            dk = (dk + tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=DOT_PRECISION)).to(ACC_DTYPE)
        dk = dk.to(tl.float32)
        if SCALE_DK:  # False only in the dk_no_scale slip
            dk = dk * scale
        tl.store(dK + kv_offsets, dk.to(dK.dtype.element_ty), mask=kv_mask)
        tl.store(dV + kv_offsets, dv.to(dV.dtype.element_ty), mask=kv_mask)

    @triton.jit
    def _query_block_backward_kernel(Q, K, V, Bias, dOut, Lse, Delta, dQ, T, D, scale,
                                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                     DOT_PRECISION: tl.constexpr,
                                     SCALE_DS_BEFORE_DOT: tl.constexpr, SCALE_DQ_AFTER: tl.constexpr):
        # One program: query rows I = [pid·BLOCK_M, +BLOCK_M); walks every key block J and adds
        # dQ_I += dS_IJ·K_J, the factor scale applied once: to dS before the product, or to dQ after the last block.
        bh = tl.program_id(1).to(tl.int64)
        rows, q_offsets, q_mask = _row_block(bh, tl.program_id(0) * BLOCK_M, T, D, BLOCK_M, BLOCK_D)
        q = tl.load(Q + q_offsets, mask=q_mask, other=0.0)
        do = tl.load(dOut + q_offsets, mask=q_mask, other=0.0)
        delta = tl.load(Delta + bh * T + rows, mask=rows < T, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start in range(0, T, BLOCK_N):
            keys, kv_offsets, kv_mask = _row_block(bh, start, T, D, BLOCK_N, BLOCK_D)
            k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0)
            v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0)
            p = _probability_tile(q, k, Bias, Lse, bh, rows, keys, T, scale, DOT_PRECISION)
            ds = p * (tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION) - delta[:, None])
            if SCALE_DS_BEFORE_DOT:
                ds = ds * scale
            dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
        if SCALE_DQ_AFTER:
            dq = dq * scale
        tl.store(dQ + q_offsets, dq.to(dQ.dtype.element_ty), mask=q_mask)


def _tl_dtype(dtype):
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


def _check_inputs(q, k, v, b):
    name = "triton_attention_bias"
    for label, x in (("k", k), ("v", v), ("b", b)):
        if x.dtype != q.dtype or x.device != q.device:
            raise ValueError(f"{name}: {label} is {x.dtype} on {x.device}, q is {q.dtype} on {q.device}; "
                             "all four inputs must share one dtype and device")
    if q.dtype not in DTYPES:
        raise ValueError(f"{name}: inputs are {q.dtype}; expected one of bfloat16, float16, float32")
    if q.dim() < 2 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"{name}: q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}; "
                         "expected one shape (..., T, d)")
    t, d = q.shape[-2], q.shape[-1]
    if b.shape != q.shape[:-1] + (t,):
        raise ValueError(f"{name}: b has shape {tuple(b.shape)}; expected the scores' shape "
                         f"{tuple(q.shape[:-1]) + (t,)}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: head dimension d = {d}; the tiles hold 1 ≤ d ≤ {MAX_HEAD_DIM}")
    if q.device.type != "cuda":
        raise ValueError(f"{name}: inputs are on {q.device}; the kernel runs on a CUDA device")
    if triton is None:
        raise RuntimeError(f"{name}: needs Triton, which is not installed")


def _launch_shape(q):
    t, d = q.shape[-2], q.shape[-1]
    heads = q.numel() // (t * d)
    return heads, t, d, max(16, triton.next_power_of_2(d))


def _forward(q, k, v, b):
    heads, t, d, block_d = _launch_shape(q)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    _forward_kernel[(triton.cdiv(t, BLOCK_M), heads)](
        q, k, v, b, out, lse, t, d, 1.0 / math.sqrt(d),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=block_d, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=NUM_WARPS)
    return out, lse


def _dot_precision(dtype):
    # float32 operands multiply in full precision ("ieee"); TF32 would round them to 11 bits. For 16-bit operands
    # "tf32" is Triton's default on NVIDIA GPUs and changes nothing.
    return "ieee" if dtype == torch.float32 else "tf32"


def _backward(variant, q, k, v, b, out, lse, d_out):
    heads, t, d, block_d = _launch_shape(q)
    scale = 1.0 / math.sqrt(d)
    precision = _dot_precision(q.dtype)
    low_precision = q.dtype != torch.float32
    delta = torch.empty_like(lse)
    _row_dot_kernel[(triton.cdiv(t, BLOCK_M), heads)](out, d_out, delta, t, d, BLOCK_M=BLOCK_M, BLOCK_D=block_d,
                                                      num_warps=NUM_WARPS)
    dq, dk, dv, db = (torch.empty_like(x) for x in (q, k, v, b))
    acc_dtype = _tl_dtype(q.dtype) if variant == "accumulate_low" else tl.float32
    _key_block_backward_kernel[(triton.cdiv(t, BLOCK_N), heads)](
        q, k, v, b, d_out, lse, delta, dk, dv, db, t, d, scale,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=block_d, DOT_PRECISION=precision, ACC_DTYPE=acc_dtype,
        STORE_DB_BEFORE_ROWSUM=variant == "db_missing_rowsum", SCALE_DK=variant != "dk_no_scale",
        num_warps=NUM_WARPS)
    if low_precision:
        # 16-bit inputs: scale is folded into dS before dS is rounded for the tensor cores, which keeps the
        # product dS·K at dQ's own size. The dq_scale_twice_16bit slip keeps the epilogue's scale as well, as
        # the float32 launch below has it: dQ = scale²·dS·K. float32 inputs never take this branch.
        scale_after = variant == "dq_scale_twice_16bit"
        scale_before = True
    else:
        scale_after, scale_before = True, False
    _query_block_backward_kernel[(triton.cdiv(t, BLOCK_M), heads)](
        q, k, v, b, d_out, lse, delta, dq, t, d, scale,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=block_d, DOT_PRECISION=precision,
        SCALE_DS_BEFORE_DOT=scale_before, SCALE_DQ_AFTER=scale_after, num_warps=NUM_WARPS)
    return dq, dk, dv, db


def _forward_op(ctx, q, k, v, b):
    _check_inputs(q, k, v, b)
    q, k, v, b = (x.contiguous() for x in (q, k, v, b))
    out, lse = _forward(q, k, v, b)
    ctx.save_for_backward(q, k, v, b, out, lse)
    return out


def make_triton_attention_bias(variant="right"):
    """The kernel as a torch.autograd.Function: apply(q, k, v, b), q, k, v (..., T, d), b (..., T, T)."""
    if variant not in VARIANTS:
        raise ValueError(f"triton_attention_bias: no variant {variant!r}; the variants: {', '.join(VARIANTS)}")

    def backward_op(ctx, d_out):
        q, k, v, b, out, lse = ctx.saved_tensors
        return _backward(variant, q, k, v, b, out, lse, d_out.to(q.dtype).contiguous())

    name = f"triton_attention_bias[{variant}]"
    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(_forward_op), "backward": staticmethod(backward_op), "__qualname__": name})


def inputs(heads=2, t=128, d=64, seed=0):
    """q, k, v (heads, t, d), b (heads, t, t) and a cotangent dO, standard normal, in float64 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, dtype=torch.float64, generator=g)
                 for shape in ((heads, t, d), (heads, t, d), (heads, t, d), (heads, t, t), (heads, t, d)))


GRADIENTS = ("dQ", "dK", "dV", "dB")


def max_errors(apply, dtype, heads=2, t=128, d=64, seed=0):
    """Largest |error| of O and of dQ, dK, dV, dB from apply(q, k, v, b), run on inputs rounded to dtype, against
    float64 autograd of reference() on the same rounded inputs; the cotangent dO is rounded likewise."""
    q, k, v, b, d_out = (x.to(dtype).cuda() for x in inputs(heads, t, d, seed))
    leaves = [x.detach().requires_grad_() for x in (q, k, v, b)]
    out = apply(*leaves)
    out.backward(d_out)
    exact_leaves = [x.detach().double().requires_grad_() for x in (q, k, v, b)]
    exact_out = reference(*exact_leaves)
    exact_out.backward(d_out.double())
    errors = {"O": (out.double() - exact_out).abs().max().item()}
    for name, leaf, exact in zip(GRADIENTS, leaves, exact_leaves):
        errors[name] = (leaf.grad.double() - exact.grad).abs().max().item()
    return errors


def _print_table(heads, t, d):
    print(f"B·H = {heads}, T = {t}, d = {d}; max |error| against float64 autograd of reference() "
          f"({torch.cuda.get_device_name()})")
    print(f"{'variant':22s} {'dtype':9s}" + "".join(f"{name:>10s}" for name in ("O",) + GRADIENTS))
    rows = [("torch composite", reference)] + [(v, make_triton_attention_bias(v).apply) for v in VARIANTS]
    for dtype in DTYPES:
        for label, apply in rows:
            errors = max_errors(apply, dtype, heads, t, d)
            print(f"{label:22s} {str(dtype).removeprefix('torch.'):9s}"
                  + "".join(f"{errors[name]:10.2e}" for name in ("O",) + GRADIENTS))


def main(sizes=((2, 128, 64), (2, 1024, 64))):
    if triton is None or not torch.cuda.is_available():
        missing = " and ".join(w for w, gone in (("Triton", triton is None),
                                                 ("a CUDA GPU", not torch.cuda.is_available())) if gone)
        print(f"triton_attention_bias: needs Triton and a CUDA GPU; {missing} not found here, nothing run")
        return 0
    for i, (heads, t, d) in enumerate(sizes):
        if i:
            print()
        _print_table(heads, t, d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
