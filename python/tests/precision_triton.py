"""The held-out set's ops as Triton GPU kernels: nine fused kernels with hand-written backwards, right and with slips,
for checks at bf16, fp16 and float32 (and float64) on a CUDA device against a float64 reference.

Each op is the one of the same name in precision_heldout.py (its math, its slips and their kinds, its references,
its inputs, moved to the GPU), written again as Triton kernels the way such kernels are usually written: one
program per row (or per block of rows, or per block of channels), every value read at the input's dtype and
computed in float32 (float64 when given float64, so that the op can also be checked in float64), row statistics
kept in float32, parameter gradients as per-program partial sums added up after the launch, results stored at the
input's dtype. The linear + GELU kernel's products run on the tensor cores (tl.dot: 16-bit operands, float32
accumulation; float32 operands in IEEE precision, not TF32).

    from precision_triton import CASES        # needs Triton and a CUDA device to run a kernel
    case = CASES[0]
    fn = case.make("right")                   # or a slip's name: case.slips
    xs = case.inputs("small", torch.bfloat16, seed=0)   # on the GPU
    fn(*xs)

Run this file on a GPU machine to verify the set itself (as precision_heldout.py verifies its own):

    python3 python/tests/precision_triton.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import precision_heldout as H  # noqa: E402

try:
    import triton
    import triton.language as tl
    try:
        from triton.language.extra import libdevice
    except ImportError:  # older Triton
        from triton.language.extra.cuda import libdevice
except ImportError:
    triton = None

DEVICE = "cuda"


def _on_device(inputs):
    """A held-out case's inputs(size, dtype, seed), drawn as there and moved to the GPU."""
    def moved(size, dtype, seed):
        return tuple(x.detach().to(DEVICE).requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
                     for x in inputs(size, dtype, seed))
    return moved


def _slip(slips, variant, x):
    """The slip that acts at x's dtype: variant, or "right" for a slip of the 16-bit path at float32/float64."""
    H._check_variant(variant, slips)
    if variant != "right" and slips[variant][1] == "low" and x.dtype not in H.LOW:
        return "right"
    return variant


def _compute(x):
    """(torch dtype, Triton dtype) a kernel computes in for input x: float64 for float64, else float32."""
    return (torch.float64, tl.float64) if x.dtype == torch.float64 else (torch.float32, tl.float32)


_LOW_TL = {}


def _low(x):
    """x's own dtype in Triton (for a value a slip keeps at the input's precision)."""
    if not _LOW_TL:
        _LOW_TL.update({torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32,
                        torch.float64: tl.float64})
    return _LOW_TL[x.dtype]


def _add_up(partials, dtype):
    """The per-program partials (programs, cols) added one after the other at dtype, as a second pass does."""
    total = torch.zeros(partials.shape[1:], dtype=dtype, device=partials.device)
    for p in partials.to(dtype):
        total = total + p
    return total


def _block(n):
    return triton.next_power_of_2(n)


if triton is not None:

    @triton.jit
    def _sigmoid(a):
        return 1.0 / (1.0 + libdevice.exp(-a))

    # -----------------------------------------------------------------------------------------------------------
    # 1. RMSNorm: y = x·r·w, r = 1/√(mean(x²) + eps);  x̄ = r·(g − x̂·mean(g·x̂)), g = ȳ·w;  w̄ = Σ_rows ȳ·x̂.

    @triton.jit
    def _rms_forward(X, W, Y, R, D, EPS: tl.constexpr, BLOCK: tl.constexpr, C: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        x = tl.load(X + row * D + cols, mask=m, other=0.0).to(C)
        w = tl.load(W + cols, mask=m, other=0.0).to(C)
        r = 1.0 / libdevice.sqrt(tl.sum(x * x, axis=0) / D + tl.full([], EPS, C))
        tl.store(R + row, r)
        tl.store(Y + row * D + cols, (x * r * w).to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _rms_backward(X, W, GY, R, GX, WP, N, D, EPS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                      C: tl.constexpr, ACC: tl.constexpr, NO_PROJECTION: tl.constexpr, N_MINUS_1: tl.constexpr,
                      W_FROM_X: tl.constexpr, EPS_OUTSIDE: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        w = tl.load(W + cols, mask=cols < D, other=0.0).to(C)
        w_partial = tl.zeros([BLOCK], dtype=ACC)
        for i in range(ROWS):
            row = pid * ROWS + i
            m = (cols < D) & (row < N)
            x = tl.load(X + row * D + cols, mask=m, other=0.0).to(C)
            gy = tl.load(GY + row * D + cols, mask=m, other=0.0).to(C)
            r = tl.load(R + row, mask=row < N, other=1.0)
            if EPS_OUTSIDE:  # in the forward pass r was 1/√(ms + eps); here 1/(√ms + eps)
                r = 1.0 / (libdevice.sqrt(tl.sum(x * x, axis=0) / D) + tl.full([], EPS, C))
            xhat = x * r
            g = gy * w
            if NO_PROJECTION:
                gx = r * g
            elif N_MINUS_1:
                gx = r * (g - xhat * tl.sum(g * xhat, axis=0) / (D - 1))
            else:
                gx = r * (g - xhat * tl.sum(g * xhat, axis=0) / D)
            tl.store(GX + row * D + cols, gx.to(GX.dtype.element_ty), mask=m)
            if W_FROM_X:
                w_partial = (w_partial + gy * x).to(ACC)
            else:
                w_partial = (w_partial + gy * xhat).to(ACC)
        tl.store(WP + pid * D + cols, w_partial, mask=cols < D)

    # -----------------------------------------------------------------------------------------------------------
    # 2. LayerNorm: y = x̂·w + b, x̂ = (x − μ)·rstd;  x̄ = rstd·(g − mean(g) − x̂·mean(g·x̂));  w̄ = Σ ȳ·x̂, b̄ = Σ ȳ.

    @triton.jit
    def _ln_forward(X, W, B, Y, MU, RSTD, D, EPS: tl.constexpr, BLOCK: tl.constexpr, C: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        x = tl.load(X + row * D + cols, mask=m, other=0.0).to(C)
        w = tl.load(W + cols, mask=m, other=0.0).to(C)
        b = tl.load(B + cols, mask=m, other=0.0).to(C)
        mu = tl.sum(x, axis=0) / D
        xc = tl.where(m, x - mu, 0.0)
        rstd = 1.0 / libdevice.sqrt(tl.sum(xc * xc, axis=0) / D + tl.full([], EPS, C))
        tl.store(MU + row, mu)
        tl.store(RSTD + row, rstd)
        tl.store(Y + row * D + cols, (xc * rstd * w + b).to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _ln_backward(X, W, GY, MU, RSTD, GX, WP, BP, N, D, EPS: tl.constexpr, ROWS: tl.constexpr,
                     BLOCK: tl.constexpr, C: tl.constexpr, ACC: tl.constexpr, NO_MEAN: tl.constexpr,
                     RSTD_UNBIASED: tl.constexpr, PROJECTION_SIGN: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        w = tl.load(W + cols, mask=cols < D, other=0.0).to(C)
        w_partial = tl.zeros([BLOCK], dtype=ACC)
        b_partial = tl.zeros([BLOCK], dtype=ACC)
        for i in range(ROWS):
            row = pid * ROWS + i
            m = (cols < D) & (row < N)
            x = tl.load(X + row * D + cols, mask=m, other=0.0).to(C)
            gy = tl.load(GY + row * D + cols, mask=m, other=0.0).to(C)
            mu = tl.load(MU + row, mask=row < N, other=0.0)
            rstd = tl.load(RSTD + row, mask=row < N, other=1.0)
            xc = tl.where(m, x - mu, 0.0)
            if RSTD_UNBIASED:  # the variance over n − 1, as torch.var gives it, where the forward divided by n
                rstd = 1.0 / libdevice.sqrt(tl.sum(xc * xc, axis=0) / (D - 1) + tl.full([], EPS, C))
            xhat = xc * rstd
            g = gy * w
            proj = xhat * (tl.sum(g * xhat, axis=0) / D)
            if NO_MEAN:
                gx = rstd * (g - proj)
            elif PROJECTION_SIGN:
                gx = rstd * (g - tl.sum(g, axis=0) / D + proj)
            else:
                gx = rstd * (g - tl.sum(g, axis=0) / D - proj)
            tl.store(GX + row * D + cols, gx.to(GX.dtype.element_ty), mask=m)
            w_partial = (w_partial + gy * xhat).to(ACC)
            b_partial = (b_partial + gy).to(ACC)
        tl.store(WP + pid * D + cols, w_partial, mask=cols < D)
        tl.store(BP + pid * D + cols, b_partial, mask=cols < D)

    # -----------------------------------------------------------------------------------------------------------
    # 3. Softmax cross-entropy, mean over rows: z̄ = ȳ·(softmax(z) − onehot(t))/N.  And column statistics for the
    #    slips that take a softmax over the rows' axis.

    @triton.jit
    def _column_lse(Z, LSE, N, D, BLOCK_N: tl.constexpr, C: tl.constexpr):
        col = tl.program_id(0)
        rows = tl.arange(0, BLOCK_N)
        m = rows < N
        z = tl.load(Z + rows * D + col, mask=m, other=-float("inf")).to(C)
        top = tl.max(z, axis=0)
        tl.store(LSE + col, top + libdevice.log(tl.sum(tl.where(m, libdevice.exp(z - top), 0.0), axis=0)))

    @triton.jit
    def _ce_forward(Z, T, LOSS, LSE, D, BLOCK: tl.constexpr, C: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        z = tl.load(Z + row * D + cols, mask=m, other=-float("inf")).to(C)
        top = tl.max(z, axis=0)
        lse = top + libdevice.log(tl.sum(tl.where(m, libdevice.exp(z - top), 0.0), axis=0))
        target = tl.load(T + row)
        tl.store(LSE + row, lse)
        tl.store(LOSS + row, lse - tl.sum(tl.where(cols == target, z, 0.0), axis=0))

    @triton.jit
    def _ce_backward(Z, T, LSE, COL_LSE, GY, GZ, N, D, SCALE_BY: tl.constexpr, BLOCK: tl.constexpr,
                     C: tl.constexpr, SIGN: tl.constexpr, SOFTMAX_DIM0: tl.constexpr, SMOOTHING: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        z = tl.load(Z + row * D + cols, mask=m, other=0.0).to(C)
        if SOFTMAX_DIM0:
            p = libdevice.exp(z - tl.load(COL_LSE + cols, mask=m, other=0.0))
        else:
            p = libdevice.exp(z - tl.load(LSE + row))
        onehot = tl.where(cols == tl.load(T + row), 1.0, 0.0).to(C)
        if SMOOTHING:
            onehot = 0.98 * onehot + 0.02 / D
        d = onehot - p if SIGN else p - onehot
        # SCALE_BY: 0 → 1/N (the mean), 1 → 1 (the mean forgotten), 2 → 1/(N − 1)
        if SCALE_BY == 1:
            scale = tl.full([], 1.0, C)
        elif SCALE_BY == 2:
            scale = tl.full([], 1.0, C) / (N - 1)
        else:
            scale = tl.full([], 1.0, C) / N
        gy = tl.load(GY).to(C)
        tl.store(GZ + row * D + cols, (d * (gy * scale)).to(GZ.dtype.element_ty), mask=m)

    # -----------------------------------------------------------------------------------------------------------
    # 4. Linear + GELU (tanh): one matrix-product kernel with two epilogues. Forward: y = gelu(x·Wᵀ + b). Backward:
    #    dh = ȳ·gelu'(h) with h recomputed, stored at the input's dtype; then x̄ = dh·W, W̄ = dhᵀ·x by the same kernel
    #    without an epilogue.

    @triton.jit
    def _gelu_prime(h, KV, AV, CUBIC: tl.constexpr):
        t = libdevice.tanh(KV * (h + AV * h * h * h))
        return 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * KV * (1.0 + CUBIC * AV * h * h)

    @triton.jit
    def _matmul(A, B, OUT, BIAS, GY, Y, M, N, K, sam, sak, sbk, sbn, EPILOGUE: tl.constexpr, GELU_K: tl.constexpr,
                GELU_A: tl.constexpr, CUBIC: tl.constexpr, AT_OUTPUT: tl.constexpr, ERF_PRIME: tl.constexpr,
                C: tl.constexpr, F64: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr):
        # EPILOGUE: 0 → OUT = A·B;  1 → OUT = gelu(A·B + bias);  2 → OUT = GY·gelu'(A·B + bias)
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        acc = tl.zeros([BM, BN], dtype=C)
        for k0 in range(0, K, BK):
            rk = k0 + tl.arange(0, BK)
            a = tl.load(A + rm[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & (rk[None, :] < K),
                        other=0.0)
            b = tl.load(B + rk[:, None] * sbk + rn[None, :] * sbn, mask=(rk[:, None] < K) & (rn[None, :] < N),
                        other=0.0)
            if F64:  # no tensor-core path for float64: the product by a broadcast and a sum
                acc += tl.sum(a[:, :, None].to(C) * b[None, :, :].to(C), axis=1)
            elif IEEE:
                acc += tl.dot(a, b, input_precision="ieee")
            else:
                acc += tl.dot(a, b)
        out_mask = (rm[:, None] < M) & (rn[None, :] < N)
        at = rm[:, None] * N + rn[None, :]
        if EPILOGUE == 0:
            tl.store(OUT + at, acc.to(OUT.dtype.element_ty), mask=out_mask)
        else:
            KV = tl.full([], GELU_K, C)
            AV = tl.full([], GELU_A, C)
            h = acc + tl.load(BIAS + rn, mask=rn < N, other=0.0).to(C)[None, :]
            if EPILOGUE == 1:
                y = 0.5 * h * (1.0 + libdevice.tanh(KV * (h + AV * h * h * h)))
                tl.store(OUT + at, y.to(OUT.dtype.element_ty), mask=out_mask)
            else:
                gy = tl.load(GY + at, mask=out_mask, other=0.0).to(C)
                if AT_OUTPUT:  # in the forward pass gelu' was taken at h; here at the stored y
                    dgelu = _gelu_prime(tl.load(Y + at, mask=out_mask, other=0.0).to(C), KV, AV, CUBIC)
                elif ERF_PRIME:  # the exact GELU's derivative, Φ(h) + h·φ(h)
                    dgelu = (0.5 * (1.0 + libdevice.erf(h * tl.full([], 0.7071067811865476, C)))
                             + h * libdevice.exp(-0.5 * h * h) * tl.full([], 0.3989422804014327, C))
                else:
                    dgelu = _gelu_prime(h, KV, AV, CUBIC)
                tl.store(OUT + at, (gy * dgelu).to(OUT.dtype.element_ty), mask=out_mask)

    # -----------------------------------------------------------------------------------------------------------
    # 5. SwiGLU: x = [a | b] → y = silu(a)·b;  ā = ȳ·b·σ(a)(1 + a(1 − σ(a))), b̄ = ȳ·silu(a).

    @triton.jit
    def _swiglu_forward(X, Y, D, BLOCK: tl.constexpr, C: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        a = tl.load(X + row * 2 * D + cols, mask=m, other=0.0).to(C)
        b = tl.load(X + row * 2 * D + D + cols, mask=m, other=0.0).to(C)
        tl.store(Y + row * D + cols, (a * _sigmoid(a) * b).to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _swiglu_backward(X, GY, GX, D, BLOCK: tl.constexpr, C: tl.constexpr, PRIME_IS_SIGMOID: tl.constexpr,
                         TERM_SIGN: tl.constexpr, GATE_AT_SIGMOID: tl.constexpr, ONE_PLUS_A: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        a = tl.load(X + row * 2 * D + cols, mask=m, other=0.0).to(C)
        b = tl.load(X + row * 2 * D + D + cols, mask=m, other=0.0).to(C)
        g = tl.load(GY + row * D + cols, mask=m, other=0.0).to(C)
        s = _sigmoid(a)
        if PRIME_IS_SIGMOID:
            dsilu = s
        elif TERM_SIGN:
            dsilu = s * (1.0 + a * (s - 1.0))
        elif ONE_PLUS_A:
            dsilu = s * (1.0 + a)
        else:
            dsilu = s * (1.0 + a * (1.0 - s))
        gb = g * s if GATE_AT_SIGMOID else g * a * s
        tl.store(GX + row * 2 * D + cols, (g * b * dsilu).to(GX.dtype.element_ty), mask=m)
        tl.store(GX + row * 2 * D + D + cols, gb.to(GX.dtype.element_ty), mask=m)

    # -----------------------------------------------------------------------------------------------------------
    # 6. Linear scan h_t = a_t·h_{t−1} + x_t along time (B, T, D), a program per batch element and block of
    #    channels. Backward: the states again (kept in a float32 buffer), then g_t = ȳ_t + a_{t+1}·g_{t+1} in reverse;
    #    x̄_t = g_t, ā_t = g_t·h_{t−1}.

    @triton.jit
    def _scan_forward(A, X, Y, T, D, BLOCK: tl.constexpr, C: tl.constexpr):
        base = tl.program_id(0) * T * D
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < D
        h = tl.zeros([BLOCK], dtype=C)
        for t in range(T):
            a = tl.load(A + base + t * D + cols, mask=m, other=0.0).to(C)
            x = tl.load(X + base + t * D + cols, mask=m, other=0.0).to(C)
            h = a * h + x
            tl.store(Y + base + t * D + cols, h.to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _scan_backward(A, X, GY, HS, GA, GX, T, D, BLOCK: tl.constexpr, C: tl.constexpr, STATE: tl.constexpr,
                       DECAY_OFF_BY_ONE: tl.constexpr, FORWARD_SCAN: tl.constexpr, A_AT_H_T: tl.constexpr):
        base = tl.program_id(0) * T * D
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < D
        h = tl.zeros([BLOCK], dtype=C)
        for t in range(T):  # the states again, as the forward made them
            a = tl.load(A + base + t * D + cols, mask=m, other=0.0).to(C)
            x = tl.load(X + base + t * D + cols, mask=m, other=0.0).to(C)
            h = a * h + x
            tl.store(HS + base + t * D + cols, h, mask=m)
        g = tl.zeros([BLOCK], dtype=STATE)
        for i in range(T):
            t = i if FORWARD_SCAN else T - 1 - i
            gy = tl.load(GY + base + t * D + cols, mask=m, other=0.0).to(C)
            if FORWARD_SCAN:  # g_t = ȳ_t + a_t·g_{t−1}: the recurrence run forward
                decay = tl.load(A + base + t * D + cols, mask=m, other=0.0).to(C)
            elif DECAY_OFF_BY_ONE:  # a_t where a_{t+1} belongs
                decay = tl.load(A + base + t * D + cols, mask=m & (t + 1 < T), other=0.0).to(C)
            else:
                decay = tl.load(A + base + (t + 1) * D + cols, mask=m & (t + 1 < T), other=0.0).to(C)
            g = (gy + decay * g.to(C)).to(STATE)
            if A_AT_H_T:
                h_before = tl.load(HS + base + t * D + cols, mask=m, other=0.0)
            else:
                h_before = tl.load(HS + base + (t - 1) * D + cols, mask=m & (t > 0), other=0.0)
            gc = g.to(C)
            tl.store(GX + base + t * D + cols, gc.to(GX.dtype.element_ty), mask=m)
            tl.store(GA + base + t * D + cols, (gc * h_before).to(GA.dtype.element_ty), mask=m)

    # -----------------------------------------------------------------------------------------------------------
    # 7. Row cosine similarity: cos = ⟨x1, x2⟩/(‖x1‖‖x2‖);  x̄1 = ȳ·(x2/(‖x1‖‖x2‖) − cos·x1/‖x1‖²), and 1 ↔ 2.

    @triton.jit
    def _cos_forward(X1, X2, Y, D, BLOCK: tl.constexpr, C: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        a = tl.load(X1 + row * D + cols, mask=m, other=0.0).to(C)
        b = tl.load(X2 + row * D + cols, mask=m, other=0.0).to(C)
        cos = tl.sum(a * b, axis=0) / (libdevice.sqrt(tl.sum(a * a, axis=0)) * libdevice.sqrt(tl.sum(b * b, axis=0)))
        tl.store(Y + row, cos.to(Y.dtype.element_ty))

    @triton.jit
    def _cos_backward(X1, X2, GY, G1, G2, D, BLOCK: tl.constexpr, C: tl.constexpr, LOW: tl.constexpr,
                      NO_NORM_TERM: tl.constexpr, X2_NORM_1: tl.constexpr, NORM_SIGN: tl.constexpr,
                      DOT_LOW: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        a = tl.load(X1 + row * D + cols, mask=m, other=0.0).to(C)
        b = tl.load(X2 + row * D + cols, mask=m, other=0.0).to(C)
        if DOT_LOW:  # the sums carried element by element at the input's precision
            dot = tl.full([], 0.0, LOW)
            s1 = tl.full([], 0.0, LOW)
            s2 = tl.full([], 0.0, LOW)
            for j in range(D):
                aj = tl.load(X1 + row * D + j)
                bj = tl.load(X2 + row * D + j)
                dot = (dot + (aj * bj).to(LOW)).to(LOW)
                s1 = (s1 + (aj * aj).to(LOW)).to(LOW)
                s2 = (s2 + (bj * bj).to(LOW)).to(LOW)
            dot = dot.to(C)
            s1 = s1.to(C)
            s2 = s2.to(C)
        else:
            dot = tl.sum(a * b, axis=0)
            s1 = tl.sum(a * a, axis=0)
            s2 = tl.sum(b * b, axis=0)
        inv = 1.0 / libdevice.sqrt(s1 * s2)
        cos = dot * inv
        g = tl.load(GY + row).to(C)
        keep = 0.0 if NO_NORM_TERM else 1.0
        sign = 1.0 if NORM_SIGN else -1.0
        s2_for_x2 = s1 if X2_NORM_1 else s2
        g1 = g * (b * inv + keep * sign * (cos / s1) * a)
        g2 = g * (a * inv + keep * sign * (cos / s2_for_x2) * b)
        tl.store(G1 + row * D + cols, g1.to(G1.dtype.element_ty), mask=m)
        tl.store(G2 + row * D + cols, g2.to(G2.dtype.element_ty), mask=m)

    # -----------------------------------------------------------------------------------------------------------
    # 8. Row log-sum-exp: lse = m + log Σ exp(x − m);  x̄ = ȳ·exp(x − lse).

    @triton.jit
    def _lse_forward(X, OUT, LSE, MAX, D, BLOCK: tl.constexpr, C: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        x = tl.load(X + row * D + cols, mask=m, other=-float("inf")).to(C)
        top = tl.max(x, axis=0)
        lse = top + libdevice.log(tl.sum(tl.where(m, libdevice.exp(x - top), 0.0), axis=0))
        tl.store(MAX + row, top)
        tl.store(LSE + row, lse)
        tl.store(OUT + row, lse.to(OUT.dtype.element_ty))

    @triton.jit
    def _lse_backward(X, OUT, LSE, MAX, COL_LSE, GY, GX, D, BLOCK: tl.constexpr, C: tl.constexpr,
                      SOFTMAX_DIM0: tl.constexpr, MAX_FOR_LSE: tl.constexpr, SIGN: tl.constexpr,
                      LSE_SAVED_LOW: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        x = tl.load(X + row * D + cols, mask=m, other=0.0).to(C)
        if SOFTMAX_DIM0:
            p = libdevice.exp(x - tl.load(COL_LSE + cols, mask=m, other=0.0))
        elif MAX_FOR_LSE:
            p = libdevice.exp(x - tl.load(MAX + row))
        elif LSE_SAVED_LOW:  # the stored 16-bit output read back for lse
            p = libdevice.exp(x - tl.load(OUT + row).to(C))
        else:
            p = libdevice.exp(x - tl.load(LSE + row))
        g = tl.load(GY + row).to(C)
        gx = -g * p if SIGN else g * p
        tl.store(GX + row * D + cols, gx.to(GX.dtype.element_ty), mask=m)

    # -----------------------------------------------------------------------------------------------------------
    # 10. Residual + bias + LayerNorm: s = x + res + bias, y = LN(s)·w + b;  x̄ = res̄ = s̄ (LN's), bias̄ = Σ s̄,
    #     w̄ = Σ ȳ·ŝ, b̄ = Σ ȳ — column sums as per-program partials.

    @triton.jit
    def _rln_forward(X, RES, BIAS, W, B, Y, MU, RSTD, D, EPS: tl.constexpr, BLOCK: tl.constexpr, C: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        s = (tl.load(X + row * D + cols, mask=m, other=0.0).to(C) + tl.load(RES + row * D + cols, mask=m,
             other=0.0).to(C) + tl.load(BIAS + cols, mask=m, other=0.0).to(C))
        mu = tl.sum(s, axis=0) / D
        sc = tl.where(m, s - mu, 0.0)
        rstd = 1.0 / libdevice.sqrt(tl.sum(sc * sc, axis=0) / D + tl.full([], EPS, C))
        w = tl.load(W + cols, mask=m, other=0.0).to(C)
        b = tl.load(B + cols, mask=m, other=0.0).to(C)
        tl.store(MU + row, mu)
        tl.store(RSTD + row, rstd)
        tl.store(Y + row * D + cols, (sc * rstd * w + b).to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _rln_backward(X, RES, BIAS, W, B, Y, GY, MU, RSTD, GS, WP, BP, SP, N, D, EPS: tl.constexpr,
                      ROWS: tl.constexpr, BLOCK: tl.constexpr, C: tl.constexpr, NO_PROJECTION: tl.constexpr,
                      EPS_OUTSIDE: tl.constexpr, W_NO_RSTD: tl.constexpr, XHAT_FROM_OUTPUT: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        cm = cols < D
        w = tl.load(W + cols, mask=cm, other=1.0).to(C)
        b = tl.load(B + cols, mask=cm, other=0.0).to(C)
        bias = tl.load(BIAS + cols, mask=cm, other=0.0).to(C)
        w_partial = tl.zeros([BLOCK], dtype=C)
        b_partial = tl.zeros([BLOCK], dtype=C)
        s_partial = tl.zeros([BLOCK], dtype=C)
        for i in range(ROWS):
            row = pid * ROWS + i
            m = cm & (row < N)
            s = (tl.load(X + row * D + cols, mask=m, other=0.0).to(C)
                 + tl.load(RES + row * D + cols, mask=m, other=0.0).to(C) + bias)
            mu = tl.load(MU + row, mask=row < N, other=0.0)
            rstd = tl.load(RSTD + row, mask=row < N, other=1.0)
            sc = tl.where(m, s - mu, 0.0)
            if EPS_OUTSIDE:  # 1/(√var + eps) where the forward took 1/√(var + eps)
                rstd = 1.0 / (libdevice.sqrt(tl.sum(sc * sc, axis=0) / D) + tl.full([], EPS, C))
            if XHAT_FROM_OUTPUT:  # ŝ recovered from the stored 16-bit y: (y − b)/w
                shat = tl.where(m, (tl.load(Y + row * D + cols, mask=m, other=0.0).to(C) - b) / w, 0.0)
            else:
                shat = sc * rstd
            gy = tl.load(GY + row * D + cols, mask=m, other=0.0).to(C)
            g = gy * w
            gs = g - tl.sum(g, axis=0) / D
            if not NO_PROJECTION:
                gs = gs - shat * (tl.sum(g * shat, axis=0) / D)
            gs = tl.where(m, rstd * gs, 0.0)
            tl.store(GS + row * D + cols, gs.to(GS.dtype.element_ty), mask=m)
            s_partial += gs
            w_partial += gy * (sc if W_NO_RSTD else shat)
            b_partial += gy
        tl.store(WP + pid * D + cols, w_partial, mask=cm)
        tl.store(BP + pid * D + cols, b_partial, mask=cm)
        tl.store(SP + pid * D + cols, s_partial, mask=cm)


# ---------------------------------------------------------------------------------------------------------------
# The Functions: launches, and the partial sums added up.

def _flags(slips, slip):
    """{FLAG: slip == name} for the kernels' slip switches, by the upper-cased slip names given."""
    return {flag: slip == name for name, flag in slips.items()}


def make_rms_norm(variant="right"):
    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ct, c = _compute(x)
            n, d = x.shape
            y = torch.empty_like(x)
            r = torch.empty(n, dtype=ct, device=x.device)
            _rms_forward[(n,)](x, w, y, r, d, EPS=H.RMS_EPS, BLOCK=_block(d), C=c)
            ctx.save_for_backward(x, w, r)
            return y

        @staticmethod
        def backward(ctx, gy):
            x, w, r = ctx.saved_tensors
            ct, c = _compute(x)
            slip = _slip(H.RMS_SLIPS, variant, x)
            n, d = x.shape
            programs = -(-n // H.RMS_BLOCK)
            acc_t, acc = (x.dtype, _low(x)) if slip == "w_partials_low" else (ct, c)
            gx = torch.empty_like(x)
            partials = torch.empty(programs, d, dtype=acc_t, device=x.device)
            _rms_backward[(programs,)](x, w, gy.contiguous(), r, gx, partials, n, d, EPS=H.RMS_EPS,
                                       ROWS=H.RMS_BLOCK, BLOCK=_block(d), C=c, ACC=acc,
                                       **_flags({"no_projection": "NO_PROJECTION",
                                                 "projection_mean_n_minus_1": "N_MINUS_1",
                                                 "w_grad_from_x": "W_FROM_X", "eps_outside_rsqrt": "EPS_OUTSIDE"},
                                                slip))
            return gx, _add_up(partials, acc_t).to(w.dtype)

    return H._named(RMSNorm, "rms_norm", variant)


def make_layer_norm(variant="right"):
    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ct, c = _compute(x)
            n, d = x.shape
            y = torch.empty_like(x)
            mu, rstd = (torch.empty(n, dtype=ct, device=x.device) for _ in range(2))
            _ln_forward[(n,)](x, w, b, y, mu, rstd, d, EPS=H.LN_EPS, BLOCK=_block(d), C=c)
            ctx.save_for_backward(x, w, b, mu, rstd)
            return y

        @staticmethod
        def backward(ctx, gy):
            x, w, b, mu, rstd = ctx.saved_tensors
            ct, c = _compute(x)
            slip = _slip(H.LN_SLIPS, variant, x)
            n, d = x.shape
            programs = -(-n // H.LN_BLOCK)
            acc_t, acc = (x.dtype, _low(x)) if slip == "partials_low" else (ct, c)
            gx = torch.empty_like(x)
            wp, bp = (torch.empty(programs, d, dtype=acc_t, device=x.device) for _ in range(2))
            _ln_backward[(programs,)](x, w, gy.contiguous(), mu, rstd, gx, wp, bp, n, d, EPS=H.LN_EPS,
                                      ROWS=H.LN_BLOCK, BLOCK=_block(d), C=c, ACC=acc,
                                      **_flags({"no_mean_grad": "NO_MEAN", "rstd_unbiased": "RSTD_UNBIASED",
                                                "projection_sign": "PROJECTION_SIGN"}, slip))
            # b_grad_last_partial: every program stores its b̄ to one slot, and the last block's is what is left
            gb = bp[-1].to(ct) if slip == "b_grad_last_partial" else _add_up(bp, acc_t)
            return gx, _add_up(wp, acc_t).to(w.dtype), gb.to(b.dtype)

    return H._named(LayerNorm, "layer_norm", variant)


def _column_lse_of(z, ct, c):
    n, d = z.shape
    out = torch.empty(d, dtype=ct, device=z.device)
    _column_lse[(d,)](z, out, n, d, BLOCK_N=_block(n), C=c)
    return out


def make_cross_entropy(variant="right"):
    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, targets):
            ct, c = _compute(logits)
            n, d = logits.shape
            losses, lse = (torch.empty(n, dtype=ct, device=logits.device) for _ in range(2))
            _ce_forward[(n,)](logits, targets, losses, lse, d, BLOCK=_block(d), C=c)
            ctx.save_for_backward(logits, targets, lse)
            return (losses.sum() / n).to(logits.dtype)

        @staticmethod
        def backward(ctx, gy):
            logits, targets, lse = ctx.saved_tensors
            ct, c = _compute(logits)
            slip = _slip(H.CE_SLIPS, variant, logits)
            n, d = logits.shape
            col_lse = _column_lse_of(logits, ct, c) if slip == "softmax_dim0" else lse
            gz = torch.empty_like(logits)
            scale_by = {"no_mean": 1, "mean_n_minus_1": 2}.get(slip, 0)
            _ce_backward[(n,)](logits, targets, lse, col_lse, gy.reshape(1), gz, n, d, SCALE_BY=scale_by,
                               BLOCK=_block(d), C=c, **_flags({"sign": "SIGN", "softmax_dim0": "SOFTMAX_DIM0",
                                                               "label_smoothing_left_on": "SMOOTHING"}, slip))
            return gz, None

    return H._named(CrossEntropy, "cross_entropy", variant)


def _launch_matmul(a, b, out, *, epilogue=0, bias=None, gy=None, y=None, slip="right"):
    """out (M, N) = a (M, K) · b (K, N), any strides, with the linear + GELU epilogue asked for."""
    m, k = a.shape
    n = b.shape[1]
    f64 = a.dtype == torch.float64
    bm, bn, bk = (16, 16, 8) if f64 else (32, 32, 32)
    c = tl.float64 if f64 else tl.float32
    dummy = out
    _matmul[(-(-m // bm), -(-n // bn))](
        a, b, out, dummy if bias is None else bias, dummy if gy is None else gy, dummy if y is None else y,
        m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), EPILOGUE=epilogue, GELU_K=H.GELU_K,
        GELU_A=H.GELU_A, CUBIC=1.0 if slip == "cubic_missing_3" else 3.0, AT_OUTPUT=slip == "gelu_prime_at_output",
        ERF_PRIME=slip == "erf_prime_16bit", C=c, F64=f64, IEEE=a.dtype == torch.float32, BM=bm, BN=bn, BK=bk)
    return out


def make_linear_gelu(variant="right"):
    class LinearGelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
            _launch_matmul(x, w.t(), y, epilogue=1, bias=b)
            ctx.save_for_backward(x, w, b, y)
            return y

        @staticmethod
        def backward(ctx, gy):
            x, w, b, y = ctx.saved_tensors
            ct, _ = _compute(x)
            slip = _slip(H.GELU_SLIPS, variant, x)
            dh = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
            _launch_matmul(x, w.t(), dh, epilogue=2, bias=b, gy=gy.contiguous(), y=y, slip=slip)
            gx = _launch_matmul(dh, w, torch.empty_like(x))
            gw = torch.empty_like(w)
            if slip == "w_grad_transposed":
                _launch_matmul(x.t(), dh, gw)
            else:
                _launch_matmul(dh.t(), x, gw)
            return gx, gw, dh.to(ct).sum(0).to(b.dtype)

    return H._named(LinearGelu, "linear_gelu", variant)


def make_swiglu(variant="right"):
    class SwiGLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            _, c = _compute(x)
            n, d = x.shape[0], x.shape[1] // 2
            y = torch.empty(n, d, dtype=x.dtype, device=x.device)
            _swiglu_forward[(n,)](x, y, d, BLOCK=_block(d), C=c)
            ctx.save_for_backward(x)
            return y

        @staticmethod
        def backward(ctx, gy):
            (x,) = ctx.saved_tensors
            _, c = _compute(x)
            slip = _slip(H.SWIGLU_SLIPS, variant, x)
            n, d = x.shape[0], x.shape[1] // 2
            gx = torch.empty_like(x)
            _swiglu_backward[(n,)](x, gy.contiguous(), gx, d, BLOCK=_block(d), C=c,
                                   **_flags({"silu_prime_is_sigmoid": "PRIME_IS_SIGMOID",
                                             "sigmoid_term_sign": "TERM_SIGN",
                                             "gate_grad_at_sigmoid": "GATE_AT_SIGMOID",
                                             "silu_prime_1_minus_s_16bit": "ONE_PLUS_A"}, slip))
            return gx

    return H._named(SwiGLU, "swiglu", variant)


SCAN_CHANNELS = 16  # channels per program


def make_linear_scan(variant="right"):
    class LinearScan(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, x):
            _, c = _compute(x)
            bsz, steps, d = x.shape
            y = torch.empty_like(x)
            _scan_forward[(bsz, -(-d // SCAN_CHANNELS))](a, x, y, steps, d, BLOCK=SCAN_CHANNELS, C=c)
            ctx.save_for_backward(a, x)
            return y

        @staticmethod
        def backward(ctx, gy):
            a, x = ctx.saved_tensors
            ct, c = _compute(x)
            slip = _slip(H.SCAN_SLIPS, variant, x)
            bsz, steps, d = x.shape
            states = torch.empty(x.shape, dtype=ct, device=x.device)
            ga, gx = torch.empty_like(a), torch.empty_like(x)
            _scan_backward[(bsz, -(-d // SCAN_CHANNELS))](
                a, x, gy.contiguous(), states, ga, gx, steps, d, BLOCK=SCAN_CHANNELS, C=c,
                STATE=_low(x) if slip == "state_low" else c,
                **_flags({"decay_off_by_one": "DECAY_OFF_BY_ONE", "forward_scan_grad": "FORWARD_SCAN",
                          "a_grad_at_h_t": "A_AT_H_T"}, slip))
            return ga, gx

    return H._named(LinearScan, "linear_scan", variant)


def make_cosine_similarity(variant="right"):
    class CosineSimilarity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x1, x2):
            _, c = _compute(x1)
            n, d = x1.shape
            y = torch.empty(n, dtype=x1.dtype, device=x1.device)
            _cos_forward[(n,)](x1, x2, y, d, BLOCK=_block(d), C=c)
            ctx.save_for_backward(x1, x2)
            return y

        @staticmethod
        def backward(ctx, gy):
            x1, x2 = ctx.saved_tensors
            _, c = _compute(x1)
            slip = _slip(H.COS_SLIPS, variant, x1)
            n, d = x1.shape
            g1, g2 = torch.empty_like(x1), torch.empty_like(x2)
            _cos_backward[(n,)](x1, x2, gy.contiguous(), g1, g2, d, BLOCK=_block(d), C=c, LOW=_low(x1),
                                **_flags({"no_norm_term": "NO_NORM_TERM", "x2_grad_uses_norm_1": "X2_NORM_1",
                                          "norm_term_sign": "NORM_SIGN", "dot_low": "DOT_LOW"}, slip))
            return g1, g2

    return H._named(CosineSimilarity, "cosine_similarity", variant)


def make_logsumexp(variant="right"):
    class LogSumExp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ct, c = _compute(x)
            n, d = x.shape
            out = torch.empty(n, dtype=x.dtype, device=x.device)
            lse, top = (torch.empty(n, dtype=ct, device=x.device) for _ in range(2))
            _lse_forward[(n,)](x, out, lse, top, d, BLOCK=_block(d), C=c)
            ctx.save_for_backward(x, out, lse, top)
            return out

        @staticmethod
        def backward(ctx, gy):
            x, out, lse, top = ctx.saved_tensors
            ct, c = _compute(x)
            slip = _slip(H.LSE_SLIPS, variant, x)
            n, d = x.shape
            col_lse = _column_lse_of(x, ct, c) if slip == "softmax_dim0" else lse
            gx = torch.empty_like(x)
            _lse_backward[(n,)](x, out, lse, top, col_lse, gy.contiguous(), gx, d, BLOCK=_block(d), C=c,
                                **_flags({"softmax_dim0": "SOFTMAX_DIM0", "max_for_lse": "MAX_FOR_LSE",
                                          "sign": "SIGN", "lse_saved_low": "LSE_SAVED_LOW"}, slip))
            return gx

    return H._named(LogSumExp, "logsumexp", variant)


def make_residual_layer_norm(variant="right"):
    class ResidualBiasLayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, res, bias, w, b):
            ct, c = _compute(x)
            n, d = x.shape
            y = torch.empty_like(x)
            mu, rstd = (torch.empty(n, dtype=ct, device=x.device) for _ in range(2))
            _rln_forward[(n,)](x, res, bias, w, b, y, mu, rstd, d, EPS=H.RLN_EPS, BLOCK=_block(d), C=c)
            ctx.save_for_backward(x, res, bias, w, b, y, mu, rstd)
            return y

        @staticmethod
        def backward(ctx, gy):
            x, res, bias, w, b, y, mu, rstd = ctx.saved_tensors
            ct, c = _compute(x)
            slip = _slip(H.RLN_SLIPS, variant, x)
            n, d = x.shape
            programs = -(-n // H.RLN_BLOCK)
            gs = torch.empty_like(x)
            wp, bp, sp = (torch.empty(programs, d, dtype=ct, device=x.device) for _ in range(3))
            _rln_backward[(programs,)](x, res, bias, w, b, y, gy.contiguous(), mu, rstd, gs, wp, bp, sp, n, d,
                                       EPS=H.RLN_EPS, ROWS=H.RLN_BLOCK, BLOCK=_block(d), C=c,
                                       **_flags({"no_projection": "NO_PROJECTION", "eps_outside_sqrt": "EPS_OUTSIDE",
                                                 "w_grad_no_rstd": "W_NO_RSTD",
                                                 "xhat_from_output_16bit": "XHAT_FROM_OUTPUT"}, slip))
            gbias = gs[0].to(ct) if slip == "bias_grad_first_row" else _add_up(sp, ct)
            return (gs, gs.to(res.dtype, copy=True), gbias.to(bias.dtype), _add_up(wp, ct).to(w.dtype),
                    _add_up(bp, ct).to(b.dtype))

    return H._named(ResidualBiasLayerNorm, "residual_layer_norm", variant)


_MAKERS = {"rms_norm": make_rms_norm, "layer_norm": make_layer_norm, "cross_entropy": make_cross_entropy,
           "linear_gelu": make_linear_gelu, "swiglu": make_swiglu, "linear_scan": make_linear_scan,
           "cosine_similarity": make_cosine_similarity, "logsumexp": make_logsumexp,
           "residual_layer_norm": make_residual_layer_norm}


def _checked_maker(make, slips):
    def checked(variant="right"):
        H._check_variant(variant, slips)
        return make(variant)
    return checked


# Every held-out op but attention with a bias, whose Triton kernel is the repository's example; every case runs at
# fp16 on the GPU.
CASES = [H.Case(c.name, _checked_maker(_MAKERS[c.name], c.slips), c.reference, c.f_reference, _on_device(c.inputs),
                c.slips, fp16_ok=True)
         for c in H.CASES if c.name in _MAKERS]

if __name__ == "__main__":
    raise SystemExit(1 if H._verify(CASES) else 0)
