"""Edge probes: gradcheck(fn, inputs, edges=True) runs fn's forward and backward where backwards break.

A random point is where backwards are right; they break at the edges of the op's domain. After the ordinary check,
each checked input x gets a few inputs built from the given ones, along the axis fn reduces over (the last axis whose
elements share an output, found by moving one element at a time, a little and far, up and down: a max moves with an
element only once it is the max; the last axis where none does):
    masked_rows    one row all −∞ (where a single −∞ is in the op's domain: the output stays finite)
    one_left       one row −∞ but for its first element
    constant_rows  one row constant;  ties: a row's two largest and two smallest made equal
    zeros          one row 0, and the whole input 0
    large          one row ±L, L the dtype's exp overflow (float16 12, bfloat16 and float32 90, float64 710)
    tiny           one row ±t, t so small that t² underflows (float16 1e-4, 1e-30, float64 1e-200)
    length_one     the axis cut to its first element, in every input of that length there (counted from the end, as
                   broadcasting aligns axes): a sample variance's n − 1, a mean over n − 1 steps
and each input that is a mask (bool, or floats all in {0, 1} or {0, −∞}) and not checked gets one row set all to each
of its two values and its first element flipped (mask_rows: a query with no key, a row with no weight).

fn runs there at the inputs' own dtype and device, with torch autograd, at a random ȳ and at ȳ = 0. What is held:
  - no NaN or ∞ in y where the reference is finite: the `reference` callable, else fn itself in float64 (an
    overflow at the dtype), or, where that is NaN too, fn in float64 next to the edge (a row 10⁻³ of the way back to
    the given one, −∞ made −10⁴): a finite limit. A NaN from a mask's edge, whose inputs hold no NaN, is a finding;
  - x̄ exactly 0 at ȳ = 0, and no NaN in x̄ (x̄ is then a finding on its own: where y is finite the rule is 0/0 or
    ∞·0, and where y is not, ȳ there is 0 and x̄ must not depend on it); no ∞ in x̄ where the derivative is finite:
    one-sided differences of fn in float64 at two steps that do not grow;
  - x̄ agreeing with the reference's derivative where both are finite: the reference's autograd in float64, else
    central differences of fn's own forward in float64 along the directions of the probed row (each group of equal
    elements moved together, the rest along one random direction), each step a multiple of the element itself,
    skipped where one-sided differences disagree (a kink: any subgradient is right there).
Edges declared undefined (edges={"masked_rows": "nan"}) are not probed, and the report says so in one line.
"""

import math
from dataclasses import dataclass, field

import torch

from ._edges_judge import NAMES, _as64, _forward, _judge, _name, _report

EDGES = ("masked_rows", "one_left", "constant_rows", "ties", "zeros", "large", "tiny", "length_one", "mask_rows")
UNDEFINED = ("nan", "inf", "undefined")
LARGE = {torch.float16: 12.0, torch.bfloat16: 90.0, torch.float32: 90.0, torch.float64: 710.0}
TINY = {torch.float16: 1e-4, torch.bfloat16: 1e-30, torch.float32: 1e-30, torch.float64: 1e-200}


def edge_option(edges):
    """edges= read: {} for True, {edge: why} for a dict of edges declared undefined; a ValueError naming the option
    for anything else."""
    if edges is True:
        return {}
    if not isinstance(edges, dict):
        raise ValueError(f"gradcheck: edges must be True, False, None or a dict {{edge: 'nan'}} of the edges the op "
                         f"defines as undefined, got {edges!r}")
    for key, why in edges.items():
        if key not in EDGES:
            raise ValueError(f"gradcheck: edges names no edge {key!r}; the edges are {', '.join(EDGES)}")
        if why not in UNDEFINED:
            raise ValueError(f"gradcheck: edges[{key!r}] must be one of {', '.join(map(repr, UNDEFINED))} (what the "
                             f"op gives there), got {why!r}")
    return dict(edges)


@dataclass
class Probe:
    """One edge input: which edge, the input it changes (slot), the inputs, the line that reproduces it, the edge in
    words, the probed row's index (a tuple with slice(None) at the row axis), and the same inputs next to the edge
    (or None)."""
    edge: str
    slot: int
    inputs: list
    line: str
    words: str
    row: tuple
    near: list = None


@dataclass
class EdgeContext:
    """The call probed (tapegrad/_callables.py's _Call), its dtype and the report; findings and the rows' worst."""
    call: object
    report: object
    dtype: object
    declared: dict
    generator: object
    findings: list = field(default_factory=list)


def probe_edges(call, report, edges, numpy_rules=False):
    """Runs the probes of the module's text on gradcheck's call, adding to the report a row "edges" per checked
    input, a finding of kind `edge` for each edge where something breaks, and a note of what was probed."""
    if edges is None or edges is False:
        return report
    declared = edge_option(edges)
    if numpy_rules:
        raise ValueError("gradcheck: edges= probes a torch op (numpy rules bring no autograd to run at an edge)")
    dtype = min((call.inputs[s].dtype for s in call.slots if isinstance(call.inputs[s], torch.Tensor)),
                key=lambda d: torch.finfo(d).bits, default=torch.float64)
    ctx = EdgeContext(call, report, dtype, declared, torch.Generator().manual_seed(int(call.options.seed)))
    probes, notes = [], []
    for slot, name in zip(call.slots, call.names):
        probes += _input_probes(ctx, slot, name, notes)
    for slot, x in enumerate(call.inputs):
        if slot not in call.slots and _mask_values(x) is not None:
            probes += _mask_probes(ctx, slot, x)
    probes = [p for p in probes if p.edge not in declared]
    for probe in probes:
        _judge(ctx, probe)
    _report(ctx, probes, notes)
    return report


# ---- where to probe ----------------------------------------------------------------------------------------------

def _row_axis(ctx, slot):
    """The last axis of input `slot` along which two elements share an output (fn reduces over it), else the last."""
    x = ctx.call.inputs[slot].detach()
    if x.dim() == 0:
        return None
    base = torch.cat([t.reshape(-1).double() for t in _forward(ctx, ctx.call.inputs)])

    def moved(index):  # up and down, a little and far: a max or a min moves with one element one way, far enough
        changes = []
        for sign in (0.5, -0.5, 10, -10):
            inputs = list(ctx.call.inputs)
            changed = x.clone()
            changed[index] = changed[index] + sign * (1 + changed[index].abs())
            inputs[slot] = changed
            try:
                y = torch.cat([t.reshape(-1).double() for t in _forward(ctx, inputs)])
            except Exception:  # noqa: BLE001 - a point the op refuses says nothing of which outputs move
                continue
            changes.append(~((y == base) | (torch.isnan(y) & torch.isnan(base))))
        return torch.stack(changes).any(0) if changes else torch.zeros_like(base, dtype=torch.bool)
    first = moved((0,) * x.dim())
    reduced = [a for a in range(x.dim()) if x.shape[a] > 1
               and (first & moved(tuple(1 if b == a else 0 for b in range(x.dim())))).any()]
    return reduced[-1] if reduced else x.dim() - 1


def _row_index(x, axis):
    """The probed row: index 1 along the first other axis of size > 1 (else 0), 0 along the rest."""
    index, placed = [], False
    for a in range(x.dim()):
        if a == axis:
            index.append(slice(None))
        elif x.shape[a] > 1 and not placed:
            index.append(1)
            placed = True
        else:
            index.append(0)
    return tuple(index)


def _text(name, index, tail=None):
    parts = [":" if isinstance(i, slice) and tail is None else (tail if isinstance(i, slice) else str(i))
             for i in index]
    return f"{name}[{', '.join(parts)}]"


def _number(v):
    if isinstance(v, bool):
        return str(v)
    return "-inf" if v == -math.inf else f"{v:g}"


def _input_probes(ctx, slot, name, notes):
    """The probes of one checked input (the module's text), each with its reproduction line."""
    x = ctx.call.inputs[slot].detach()
    axis = _row_axis(ctx, slot)
    probes = []

    def add(edge, words, line, change, near=None, row=None):
        e = x.clone()
        change(e)
        inputs = list(ctx.call.inputs)
        inputs[slot] = e
        near_inputs = None
        if near is not None:
            n = x.double().clone()
            near(n, e.double())
            near_inputs = [v.detach().double() if i == slot else v for i, v in enumerate(_as64(ctx.call.inputs))]
            near_inputs[slot] = n
        probes.append(Probe(edge, slot, inputs, line, words, row if row is not None else r, near_inputs))
    dt = x.dtype
    big, tiny = LARGE.get(dt, 90.0), TINY.get(dt, 1e-30)
    positive = bool((x >= 0).all())
    if axis is None:  # 0-d: the whole input
        r = ()
        add("zeros", "a zero input", f"{name} = 0", lambda e: e.zero_())
        add("large", f"a large value ({_number(big)} at {NAMES.get(dt, dt)})", f"{name} = {_number(big)}",
            lambda e: e.fill_(big))
        add("tiny", f"a tiny value ({tiny:g} at {NAMES.get(dt, dt)})", f"{name} = {tiny:g}", lambda e: e.fill_(tiny))
        return probes
    r = _row_index(x, axis)
    row, n = _text(name, r), x.shape[axis]
    one = _text(name, r, "0")

    def tail(t):
        return _text(name, r, t)

    if _masking_applies(ctx, slot, x, r):
        add("masked_rows", "a fully masked row (all −∞)", f"{row} = -inf", lambda e: e[r].fill_(-math.inf),
            near=lambda v, e: v[r].fill_(-1e4))
        if n > 1:
            add("one_left", "a row masked but for one element", f"{tail('1:')} = -inf",
                lambda e: e[r][1:].fill_(-math.inf), near=lambda v, e: (v.copy_(e), v[r][1:].fill_(-1e4)))
    else:
        notes.append(f"{name}: one −∞ in a row is outside the op's domain (y is not finite): no masked rows")
    if n > 1:
        add("constant_rows", "a constant row", f"{row} = {one}", lambda e: e[r].fill_(e[r][0].item()),
            near=lambda v, e: v[r].copy_(e[r] + 1e-3 * (v[r] - e[r])))
        order = torch.argsort(x[r].double())
        hi, lo = [int(i) for i in order[-2:]], [int(i) for i in order[:2]]
        line = f"{tail(str(hi[0]))} = {tail(str(hi[1]))}"
        if n >= 4:
            line += f"; {tail(str(lo[1]))} = {tail(str(lo[0]))}"

        def tie(e):
            e[r][hi[0]] = e[r][hi[1]]
            if n >= 4:
                e[r][lo[1]] = e[r][lo[0]]
        add("ties", "an exact tie (a row's two largest, and two smallest, made equal)", line, tie)
        cut = _cut_to_one(ctx, slot, axis, name, notes)
        if cut is not None:
            words = f"a length of 1 along {name}'s axis {axis - x.dim()}"
            probes.append(Probe("length_one", slot, cut[0], cut[1], words, r))
    add("zeros", "a zero row", f"{row} = 0", lambda e: e[r].zero_(), near=lambda v, e: v[r].mul_(1e-3))
    if x.dim() > 1 and x.numel() > n:
        add("zeros", "an all-zero input", f"{name}.zero_()", lambda e: e.zero_(), near=lambda v, e: v.mul_(1e-3),
            row=tuple(slice(None) for _ in range(x.dim())))
    if positive:
        add("large", f"large values ({_number(big)} at {NAMES.get(dt, dt)})", f"{row} = {_number(big)}",
            lambda e: e[r].fill_(big))
        add("tiny", f"tiny values ({tiny:g} at {NAMES.get(dt, dt)})", f"{row} = {tiny:g}", lambda e: e[r].fill_(tiny),
            near=lambda v, e: v[r].fill_(tiny * 1e100 if dt == torch.float64 else 1e-3))
    else:
        add("large", f"large values (±{_number(big)} at {NAMES.get(dt, dt)})",
            f"{tail('::2')} = {_number(big)}; {tail('1::2')} = -{_number(big)}", lambda e: _alternate(e[r], big))
        add("tiny", f"tiny values (±{tiny:g} at {NAMES.get(dt, dt)})",
            f"{tail('::2')} = {tiny:g}; {tail('1::2')} = -{tiny:g}", lambda e: _alternate(e[r], tiny),
            near=lambda v, e: _alternate(v[r], tiny * 1e100 if dt == torch.float64 else 1e-3))
    return probes


def _cut_to_one(ctx, slot, axis, name, notes):
    """(inputs, line): every tensor input whose length at x's row axis, counted from the end, is x's, cut to its first
    element there; None, with a note, where fn (or the reference) does not take its inputs cut so."""
    x = ctx.call.inputs[slot]
    back, n = axis - x.dim(), x.shape[axis]
    inputs, cut = list(ctx.call.inputs), []
    for s, v in enumerate(inputs):
        if isinstance(v, torch.Tensor) and v.dim() >= -back and v.shape[back] == n:
            inputs[s] = v.detach().narrow(back, 0, 1).clone()
            cut.append(_name(ctx, s))
    try:
        _forward(ctx, inputs)
        if ctx.call.reference is not None:
            _forward(ctx, _as64(inputs), ctx.call.reference)
    except Exception as error:  # noqa: BLE001 - shapes that no longer fit: the op takes no such length
        notes.append(f"{name}: not probed at a length of 1 along axis {back}: fn raises on its inputs cut so "
                     f"({type(error).__name__})")
        return None
    return inputs, f"{', '.join(cut)} = {', '.join(f'{c}.narrow({back}, 0, 1)' for c in cut)}"


def _alternate(row, value):
    row[::2] = value
    row[1::2] = -value


def _masking_applies(ctx, slot, x, r):
    """Whether one −∞ (the row's last element) keeps every output finite: then −∞ is a mask the op takes."""
    e = x.clone()
    e[r][-1] = -math.inf
    inputs = list(ctx.call.inputs)
    inputs[slot] = e
    try:
        return all(bool(torch.isfinite(t).all()) for t in _forward(ctx, inputs) if t.is_floating_point())
    except Exception:  # noqa: BLE001 - an op that refuses −∞ does not take it as a mask
        return False


def _mask_values(x):
    """(masked, kept)-agnostic: the two values of a mask input (bool, or floats in {0, 1} or {0, −∞}), else None."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.numel() < 2:
        return None
    if x.dtype == torch.bool:
        return (True, False)
    if not x.is_floating_point() or x.requires_grad:
        return None
    values = set(torch.unique(x.detach()).tolist())
    for pair in ((0.0, 1.0), (0.0, -math.inf)):
        if values <= set(pair):
            return pair
    return None


def _mask_probes(ctx, slot, x):
    """A mask's probed row (its first along the last axis) set all to each of its two values; its first element
    flipped."""
    name, values = _name(ctx, slot), _mask_values(x)
    r = tuple([0] * (x.dim() - 1) + [slice(None)])
    probes = []
    for v in values:
        e = x.clone()
        e[r] = v
        probes.append(Probe("mask_rows", slot, _replace(ctx, slot, e), f"{_text(name, r)} = {_number(v)}",
                            f"the mask's row {_text(name, r)} all {_number(v)}", ()))
    e = x.clone()
    first = r[:-1] + (0,)
    flipped = values[1] if e[first].item() == values[0] else values[0]
    e[first] = flipped
    probes.append(Probe("mask_rows", slot, _replace(ctx, slot, e), f"{_text(name, first)} = {_number(flipped)}",
                        f"the mask's first position {_text(name, first)} flipped to {_number(flipped)}", ()))
    return probes


def _replace(ctx, slot, value):
    inputs = list(ctx.call.inputs)
    inputs[slot] = value
    return inputs
