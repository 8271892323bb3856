"""A slip repeated at every step of a loop of the forward, named from the forward.

A line run many times (a recurrence h = a·h + x_t over t) makes one call per step, and a backward written for the
loop makes its slip at every step, where one edge or one substitution (tapegrad/_forward.py) changes one step only.
Two such slips keep the rule's shape, each fitted as x̄_user = the VJP of the forward changed at every step:

  the gradient not carried   an operand of the line detached at every step where it is the line's own earlier
                             output (h in a·h): x̄ then takes at each step the gradient that reaches the step's
                             output from ȳ there, without what comes back through the later steps (ā = Σ ȳ_t·h_{t−1}
                             where Σ dh_t·h_{t−1} belongs): wrong_value, the output's gradient read for the
                             accumulated one. Where the operand is no earlier output of the line, every step's term
                             through it is left out: term_dropped.
  a step's other value       in a product f(p, q) run at every step (p·q, or p @ q), the term through p read with q
                             taken from another line's output at the same step (h_t, the step's update, where h_{t−1}
                             belongs): the product's output at step t gets f(p − detach(p), q′_t − q_t) added, q′_t
                             the other line's value at that step (zero in value; in p, the product's derivative at
                             q′_t − q_t); x̄_p = Σ dh_t·q′_t: wrong_value.
"""

import torch

from ._forward_record import _ELEMENTWISE_PRODUCT, _MATMUL, lines
from ._forward_rewrite import operands_of, replace_operand


def _loops(calls):
    """The calls of each line made more than once, in order, by (place, name)."""
    return [group for group in lines(calls) if len(group) > 1]


def _not_carried(search):
    found = {}
    made_by = {id(c.out): c for c in search.calls}
    for group in _loops(search.calls):
        first = group[0].index
        for j in range(max(len(c.operands) for c in group)):
            if len(found) == len(search.errors):
                return found
            holders = [c for c in group if len(c.operands) > j]
            producers = [made_by.get(id(c.operands[j])) for c in holders]
            carried = all(p is not None and p.index >= first for p in producers[1:]) and len(holders) > 1

            def detach(func, args, kwargs, run, j=j):
                target = operands_of(args, kwargs)[j]
                return replace_operand(args, kwargs, target, target.detach())

            last = holders[-1]
            text, _ = search.operand(last.operands[j])
            runs = f"every one of its {len(holders)} runs"
            if carried:
                finding = lambda i: (
                    "wrong_value", search.names[i], "vjp",
                    f"x̄ is the forward's rule with `{text}` in `{last.text}` at {last.where} detached at {runs} (to "
                    f"rounding): `{text}` is made by the loop's earlier steps, so the backward takes at each step the "
                    f"gradient ȳ gives the step's output where the gradient accumulated through the later steps "
                    "belongs")
            else:
                finding = lambda i: (
                    "term_dropped", search.names[i], "vjp",
                    f"x̄ misses the term through `{text}` in `{last.text}` at {last.where} at {runs} (the error is "
                    f"−1 × their sum, to rounding); the backward must add it at every step")
            search.add_named(found, finding, {c.index: detach for c in holders})
    return found


def _other_step_value(search):
    found = {}
    loops = _loops(search.calls)
    for group in loops:
        if group[0].name not in _ELEMENTWISE_PRODUCT | _MATMUL:  # products: f(p, q) linear in each
            continue
        last = group[-1]
        if len(last.operands) != 2:
            continue
        for p in (0, 1):  # the argument whose term is read with the other factor changed
            q_text, _ = search.operand(last.operands[1 - p])
            p_text, _ = search.operand(last.operands[p])
            for partner in loops:
                if partner is group or len(partner) != len(group) or len(found) == len(search.errors):
                    continue
                if tuple(partner[0].out.shape) != tuple(last.operands[1 - p].shape):
                    continue
                values = {c.index: partner[t].out.detach() for t, c in enumerate(group)}
                # partner's output at step t is the factor of step t + 1: the value read is one step late
                late = all(group[t + 1].operands[1 - p] is partner[t].out for t in range(len(group) - 1)
                           if len(group[t + 1].operands) == 2)

                def other(out, func, args, kwargs, run, p=p, values=values):
                    tensors = [a for a in args if isinstance(a, torch.Tensor)]
                    if len(tensors) != 2 or not tensors[p].requires_grad:
                        return out
                    step = values[run.count - 1]  # this call's index: the run has counted it
                    factor, read = tensors[p], tensors[1 - p]
                    args, kwargs = replace_operand(args, kwargs, factor, factor - factor.detach())
                    args, kwargs = replace_operand(args, kwargs, read, (step - read).detach())
                    return out + func(*args, **kwargs)

                search.add_named(found, lambda i, partner=partner, late=late: (
                    "wrong_value", search.names[i], "vjp",
                    f"x̄ is the forward's rule with the term through `{p_text}` in `{last.text}` at {last.where} "
                    f"read, at each of its {len(group)} runs, with the value `{partner[0].text}` at "
                    f"{partner[0].where} makes at the same step where `{q_text}` belongs (to rounding): the "
                    f"backward multiplies by the step's output in place of the `{q_text}` the step reads"
                    + (f" (`{q_text}` one step late)" if late else "")), {}, {c.index: other for c in group})
    return found


# In the order tried: each maps the inputs it names to their finding.
LOOP_FITS = (_not_carried, _other_step_value)
