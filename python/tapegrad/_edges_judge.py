"""The edge probes' judgement (tapegrad/_edges.py says what is held): fn run at one edge input at its dtype, against
its reference in float64, and the report's rows, findings and note."""

import math
from dataclasses import dataclass

import torch

from . import _tapegrad

RTOL = {torch.float16: 0.05, torch.bfloat16: 0.05, torch.float32: 0.01, torch.float64: 0.01}
NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64"}
MAX_FINDINGS = 4

STEP = 1e-6


def _name(ctx, slot):
    """An input's name: the report's for a checked input, else fn's parameter's (x0, x1, ... without one)."""
    if slot in ctx.call.slots:
        return ctx.call.names[ctx.call.slots.index(slot)]
    from ._callables import _parameter_names
    names = _parameter_names(ctx.call.fn, len(ctx.call.inputs))
    return names[slot] if names else f"x{slot}"


def _outputs(y):
    ys = list(y) if isinstance(y, (tuple, list)) else [y]
    return [t for t in ys if isinstance(t, torch.Tensor)]


def _forward(ctx, inputs, fn=None):
    with torch.no_grad():
        return [t.detach() for t in _outputs((fn or ctx.call.fn)(*inputs, **(ctx.call.kwargs or {})))]


def _as64(inputs):
    return [v.detach().to(device="cpu", dtype=torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point()
            else (v.cpu() if isinstance(v, torch.Tensor) else v) for v in inputs]


@dataclass
class Run:
    """fn at an edge input: its outputs, ȳ (0 where y is not finite), x̄ at ȳ and at ȳ = 0 (None where fn raised)."""
    ys: list
    ybar: list
    grads: list
    grads0: list
    error: Exception = None


@dataclass
class Finding:
    probe: object
    input: str
    message: str
    worst: str
    value: float
    reference: float


def _run(ctx, inputs):
    call = ctx.call
    args, leaves = list(inputs), []
    for s in call.slots:
        args[s] = args[s].detach().clone().requires_grad_(True)
        leaves.append(args[s])
    try:
        ys = [t for t in _outputs(call.fn(*args, **(call.kwargs or {}))) if t.is_floating_point()]
        ybar = [torch.where(torch.isfinite(t.detach()),
                            torch.randn(t.shape, generator=ctx.generator, dtype=torch.float64).to(t.dtype).to(t.device),
                            torch.zeros((), dtype=t.dtype, device=t.device)) for t in ys]
        live = [(t, b) for t, b in zip(ys, ybar) if t.requires_grad]
        if not live:
            return Run(ys, ybar, [None] * len(leaves), [None] * len(leaves))
        outs, bars = [t for t, _ in live], [b for _, b in live]
        grads = torch.autograd.grad(outs, leaves, bars, retain_graph=True, allow_unused=True)
        grads0 = torch.autograd.grad(outs, leaves, [torch.zeros_like(b) for b in bars], allow_unused=True)
    except Exception as error:  # noqa: BLE001 - an op that raises at an edge is a finding
        return Run([], [], [], [], error)
    as64 = [None if g is None else g.detach().to(device="cpu", dtype=torch.float64) for g in grads]
    return Run([t.detach().to(device="cpu", dtype=torch.float64) for t in ys], ybar, as64,
               [None if g is None else g.detach().to(device="cpu", dtype=torch.float64) for g in grads0])


def _reference(ctx, inputs, ybar):
    """(outputs, x̄ or None) in float64: the reference's autograd at the same ȳ where one is given, else fn's outputs
    alone (its derivatives are the differences of _disagreement)."""
    call, inputs = ctx.call, _as64(inputs)
    fn = call.reference or call.fn
    if call.reference is None:
        return _forward(ctx, inputs, fn), None
    leaves = []
    for s in call.slots:
        inputs[s] = inputs[s].clone().requires_grad_(True)
        leaves.append(inputs[s])
    ys = [t for t in _outputs(fn(*inputs, **(call.kwargs or {}))) if t.is_floating_point()]
    bars = [torch.where(torch.isfinite(t.detach()), b.detach().cpu().double(), torch.zeros((), dtype=torch.float64))
            for t, b in zip(ys, ybar)]
    live = [(t, b) for t, b in zip(ys, bars) if t.requires_grad]
    grads = torch.autograd.grad([t for t, _ in live], leaves, [b for _, b in live], allow_unused=True) if live else \
        [None] * len(leaves)
    return [t.detach() for t in ys], [None if g is None else g.detach() for g in grads]


def _at(name, index):
    return f"{name}[{', '.join(str(int(i)) for i in index)}]"


def _first(mask):
    return tuple(int(i) for i in mask.nonzero()[0]) if mask.dim() else ()


def _gives(probe):
    """"a zero row gives", "tiny values give"."""
    return f"{probe.words} {'gives' if probe.words.split()[0] in ('a', 'an', 'the', 'one') else 'give'}"


def _symptom(v):
    return "NaN" if math.isnan(v) else "∞"


def _judge(ctx, probe):
    """Runs one probe and records its first finding (the outputs first, then each checked input's x̄)."""
    run = _run(ctx, probe.inputs)
    name = _name(ctx, probe.slot)
    if run.error is not None:
        ctx.findings.append(Finding(probe, name, f"{probe.words}: fn raises {type(run.error).__name__}: "
                                    f"{str(run.error).splitlines()[0] if str(run.error) else ''}; reproduce: "
                                    f"{probe.line}", "", math.nan, math.nan))
        return
    ref_ys, ref_grads = _reference(ctx, probe.inputs, run.ybar)
    found = _output_finding(ctx, probe, run, ref_ys, name)
    for i, input_name in enumerate(ctx.call.names):
        if found is None:
            found = _gradient_finding(ctx, probe, run, ref_grads, i, input_name)
    if found is not None:
        ctx.findings.append(found)


def _output_finding(ctx, probe, run, ref_ys, name):
    """NaN or ∞ in y where the reference is finite (in the dtype's range), or NaN where fn is finite next to the
    edge, or NaN from a mask's edge."""
    limit = torch.finfo(ctx.dtype).max
    near = None
    for j, (y, r) in enumerate(zip(run.ys, ref_ys)):
        what = "y" if len(run.ys) == 1 else f"y{j}"
        if r.shape != y.shape:
            continue
        r = r.double()
        hit = ~torch.isfinite(y) & torch.isfinite(r) & (r.abs() <= limit)
        said = "where the op in float64 gives {r:.6g}: an overflow or a 0/0 at " + NAMES.get(ctx.dtype, "its dtype")
        if not hit.any():
            nan = torch.isnan(y) & torch.isnan(r)
            if probe.near is not None and nan.any():
                near = _forward(ctx, probe.near, ctx.call.reference or ctx.call.fn) if near is None else near
                r = near[j].double() if j < len(near) and near[j].shape == y.shape else r
                hit = nan & torch.isfinite(r)
                said = "where the op is finite next to the edge ({r:.6g} there): its limit is finite"
            elif probe.near is None and probe.edge in ("mask_rows", "length_one"):
                hit = torch.isnan(y)
                said = "from inputs that hold no NaN"
        if hit.any():
            k = _first(hit)
            v, rv = float(y[k]), float(r[k])
            return Finding(probe, name, f"{_gives(probe)} {_symptom(v)} in {what}: {_at(what, k)} is {v:g} "
                           f"{said.format(r=rv)}; reproduce: {probe.line}", _at(what, k), v, rv)
    return None


def _gradient_finding(ctx, probe, run, ref_grads, i, name):
    """x̄ of input i: not 0 at ȳ = 0, NaN, ∞ where the derivative is finite, or away from the reference's."""
    g, g0 = run.grads[i], run.grads0[i]
    bar = f"{name}̄"
    if g is None:
        return None
    if g0 is not None and (torch.isnan(g0) | (g0 != 0)).any():
        k = _first(torch.isnan(g0) | (g0 != 0))
        v = float(g0[k])
        return Finding(probe, name, f"{_gives(probe)} {'NaN' if math.isnan(v) else v} in {bar} at ȳ = 0: "
                       f"{_at(bar, k)} is {v:g} where it must be exactly 0 (an output that does not reach the loss "
                       f"sends it back: a zero ȳ times NaN or ∞ in the backward); reproduce: {probe.line}",
                       _at(bar, k), v, 0.0)
    ref = None if ref_grads is None else ref_grads[i]
    bad = torch.isnan(g) if ref is None else torch.isnan(g) & ~torch.isnan(ref)
    if bad.any():
        k = _first(bad)
        finite = all(bool(torch.isfinite(y).all()) for y in run.ys)
        where = "where y is finite" if finite else "(ȳ is 0 where y is not finite)"
        return Finding(probe, name, f"{_gives(probe)} NaN in {bar}: {_at(bar, k)} is nan {where}; reproduce: "
                       f"{probe.line}", _at(bar, k), math.nan, math.nan if ref is None else float(ref[k]))
    x = probe.inputs[ctx.call.slots[i]].detach().double().cpu()
    infinite = torch.isinf(g) & torch.isfinite(x)
    if infinite.any():
        found = _infinite(ctx, probe, run, ref, i, infinite)
        if found is not None:
            return found
    if ref is not None:
        return _against_reference(ctx, probe, g, ref, name)
    if probe.slot == ctx.call.slots[i]:
        return _disagreement(ctx, probe, run, i, name)
    return None


def _infinite(ctx, probe, run, ref, i, infinite):
    """∞ in x̄ of checked input i (at the elements `infinite`) where the reference's x̄ is finite, or, with no
    reference, where one-sided differences of fn in float64 at two steps do not grow (the derivative is finite)."""
    name = ctx.call.names[i]
    k = _first(infinite)
    bar, v = f"{name}̄", float(run.grads[i][k])
    if ref is not None:
        if not math.isfinite(float(ref[k])):
            return None
        rv, said = float(ref[k]), "the reference's is"
    else:
        slot = ctx.call.slots[i]
        e = _as64(probe.inputs)
        x0 = float(e[slot][k])
        h = 1e-3 * abs(x0) if x0 != 0 else STEP
        sign = 1.0 if x0 >= 0 else -1.0
        base = _loss(ctx, e, run)
        d = []
        for step in (h, h / 100):
            moved = list(e)
            moved[slot] = e[slot].clone()
            moved[slot][k] += sign * step
            d.append((_loss(ctx, moved, run) - base) / (sign * step))
        if not all(math.isfinite(t) for t in d) or abs(d[1]) > 1.2 * abs(d[0]) + 1e-300:
            return None  # the derivative grows without bound there: ∞ is its value
        rv, said = d[1], "one-sided differences of the op in float64 give"
    return Finding(probe, name, f"{_gives(probe)} ∞ in {bar}: {_at(bar, k)} is {v:g} where the derivative is "
                   f"finite ({said} {rv:.6g}); reproduce: {probe.line}", _at(bar, k), v, rv)


def _loss(ctx, inputs, run):
    """⟨ȳ, fn(inputs)⟩ in float64 over the outputs where ȳ ≠ 0 (NaN where fn is not finite there)."""
    ys = [t for t in _forward(ctx, inputs) if t.is_floating_point()]
    total = 0.0
    for y, b in zip(ys, run.ybar):
        b = b.detach().cpu().double()
        live = b != 0
        total += float((y.double()[live] * b[live]).sum())
    return total


def _against_reference(ctx, probe, g, ref, name):
    both = torch.isfinite(g) & torch.isfinite(ref)
    if not both.any():
        return None
    rtol = RTOL.get(ctx.dtype, 0.05)
    scale = float(ref[both].abs().max())
    wrong = both & ((g - ref).abs() > rtol * ref.abs() + rtol * 0.1 * scale + 1e-12)
    if not wrong.any():
        return None
    k, bar = _first(wrong), f"{name}̄"
    return Finding(probe, name, f"{_gives(probe)} {bar} away from the reference's: {_at(bar, k)} is "
                   f"{float(g[k]):.6g}, the reference's {float(ref[k]):.6g}; reproduce: {probe.line}", _at(bar, k),
                   float(g[k]), float(ref[k]))


def _directions(ctx, probe, e, run):
    """The probed row's directions: each group of equal finite elements moved together (two at most, the largest),
    the other finite elements along one random direction; each element's step a multiple of itself (1 at 0)."""
    x = e[probe.slot]
    mask = torch.zeros(x.shape, dtype=torch.bool)
    mask[probe.row] = True
    mask &= torch.isfinite(x)
    scale = torch.where((x != 0) & torch.isfinite(x), x.abs(), torch.ones_like(x))
    values = x[mask]
    groups, single = [], mask.clone()
    for v in torch.unique(values).tolist():
        same = mask & (x == v)
        if int(same.sum()) > 1:
            groups.append(same)
            single &= ~same
    groups.sort(key=lambda m: -int(m.sum()))
    out = [(m, scale * m) for m in groups[:2]]
    if single.any():
        r = torch.randn(x.shape, generator=ctx.generator, dtype=torch.float64)
        out.append((single, scale * r * single))
    return out


def _difference(ctx, e, slot, t, run, base, confirmed=True):
    """The central difference of ⟨ȳ, fn⟩ along t, or None where it is not resolved: a side not finite, one-sided
    differences that disagree (a kink), or (confirmed) a difference at a step ten times smaller that differs (a region
    smaller than the step, as an eps's). Unconfirmed, the difference at STEP alone: enough to accept an x̄ that agrees
    with it, not to find one that does not."""
    found = []
    for step in (STEP, STEP / 10) if confirmed else (STEP,):
        sides = []
        for sign in (1, -1):
            moved = list(e)
            moved[slot] = e[slot] + sign * step * t
            sides.append(_loss(ctx, moved, run))
        if not all(math.isfinite(v) for v in sides + [base]):
            return None
        up, down = (sides[0] - base) / step, (base - sides[1]) / step
        noise = 1e-13 * (abs(sides[0]) + abs(base) + abs(sides[1])) / step
        if abs(up - down) > 1e-3 * max(abs(up), abs(down)) + 100 * noise:
            return None
        found.append(((up + down) / 2, noise))
    if not confirmed:
        return found[0][0]
    (coarse, _), (fine, noise) = found
    if abs(coarse - fine) > 1e-3 * max(abs(coarse), abs(fine)) + 100 * noise:
        return None
    return fine


def _disagreement(ctx, probe, run, i, name):
    """x̄ along the probed row's directions against central differences of fn's own forward in float64 (tapegrad/
    _edges.py); a direction that disagrees is narrowed to its element where it moves single elements."""
    e = _as64(probe.inputs)
    slot, g = probe.slot, run.grads[i]
    base = _loss(ctx, e, run)
    if not math.isfinite(base):
        return None
    rtol = RTOL.get(ctx.dtype, 0.05)
    bar = f"{name}̄"
    for m, t in _directions(ctx, probe, e, run):
        if not torch.isfinite(g[m]).all():
            continue
        a = float((g * t).sum())

        def agrees(n):
            return abs(a - n) <= rtol * max(abs(n), abs(a)) * 0.5 + rtol * 0.1 * float((g * t).abs().sum()) + 1e-10
        n = _difference(ctx, e, slot, t, run, base, confirmed=False)
        if n is None or agrees(n):
            continue
        n = _difference(ctx, e, slot, t, run, base)  # a disagreement is confirmed at a finer step first
        if n is None or agrees(n):
            continue
        elements = [tuple(int(j) for j in k) for k in m.nonzero()]
        tied = bool((t[m] == t[m][0]).all()) and len(elements) > 1
        if tied:
            where = " + ".join(_at(bar, k) for k in elements)
            what = f"{where} (the elements made equal, moved together) is {a:.6g}"
        else:
            where, what = _at(bar, elements[0]), f"⟨{bar}, t⟩ along a random t over the row is {a:.6g}"
            for k in elements[:16]:
                unit = torch.zeros_like(t)
                unit[k] = t[k]
                nk = _difference(ctx, e, slot, unit, run, base)
                ak = float((g * unit).sum())
                if nk is not None and abs(ak - nk) > rtol * max(abs(nk), abs(ak)) * 0.5 + 1e-10:
                    where, what = _at(bar, k), f"{_at(bar, k)} is {float(g[k]):.6g}"
                    a, n = float(g[k]), nk / float(t[k])
                    break
        return Finding(probe, name, f"{_gives(probe)} {bar} away from the derivative: {what}, central "
                       f"differences of the op in float64 give {n:.6g}; reproduce: {probe.line}", where, a, n)
    return None


def _report(ctx, probes, notes):
    """The report's rows "edges" (one per input probed), its findings (MAX_FINDINGS at most) and one note."""
    report, call = ctx.report, ctx.call
    names = []
    for p in probes:
        n = _name(ctx, p.slot)
        if n not in names:
            names.append(n)
    for n in names:
        mine = [f for f in ctx.findings if f.input == n]
        f = mine[0] if mine else None
        err = 0.0 if f is None else (abs(f.value - f.reference) if math.isfinite(f.value - f.reference) else math.inf)
        _tapegrad._add_check(report, dict(input=n, check="edges", mode="edge", passed=f is None, error=err,
                                          worst="" if f is None else f.worst, analytic=0.0 if f is None else f.value,
                                          numeric=0.0 if f is None else f.reference, sides=("at edge", "reference")))
    for f in ctx.findings[:MAX_FINDINGS]:
        _tapegrad._add_diagnosis(report, "edge", f.input, "edges", f.message)
    note = (f"edges: {len(probes)} inputs at the edges of the op's domain, run at {NAMES.get(ctx.dtype, ctx.dtype)} "
            f"against {'the reference' if call.reference is not None else 'the op'} in float64")
    if len(ctx.findings) > MAX_FINDINGS:
        note += f"; {len(ctx.findings) - MAX_FINDINGS} more edges break (the first {MAX_FINDINGS} are shown)"
    if ctx.declared:
        note += "; not probed, declared undefined: " + ", ".join(f"{k} ({v})" for k, v in ctx.declared.items())
    report._notes = getattr(report, "_notes", []) + [note] + [f"edges: {n}" for n in notes]
