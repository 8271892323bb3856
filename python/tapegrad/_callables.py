"""What a callable handed to tapegrad.gradcheck is: a torch.autograd.Function's apply, a functools.partial or a
lambda around one, a torch.nn.Module or a plain function; the Function behind it, its name and its parameters'
names. Read by the check (_gradcheck.py), the op's rules (_torch_op.py) and the naming from the forward
(_forward.py); it reads torch only where the caller has imported it."""

import functools
import inspect
import sys


def _is_torch_tensor(x):
    torch = _torch_if_loaded()
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_if_loaded():
    """torch if the caller has imported it (its tensors can only come from there); tapegrad does not load it."""
    return sys.modules.get("torch")


def _unwrap_partial(fn):
    """fn without its functools.partial layers: (the callable, how many leading positional arguments they bind)."""
    bound = 0
    while isinstance(fn, functools.partial):
        bound += len(fn.args)
        fn = fn.func
    return fn, bound


def _is_function_class(c):
    torch = _torch_if_loaded()
    return (torch is not None and isinstance(c, type) and issubclass(c, torch.autograd.Function)
            and c is not torch.autograd.Function)


def _function_class(fn):
    """The torch.autograd.Function whose `apply` fn is or calls: fn itself, a functools.partial's func, or the one
    Function a lambda's (or a function's) body reads `apply` from, found in its closure or its globals; else None."""
    fn, _ = _unwrap_partial(fn)
    target = getattr(fn, "__self__", None)
    if getattr(fn, "__name__", "") == "apply" and _is_function_class(target):
        return target
    code = getattr(fn, "__code__", None)
    if code is None or "apply" not in code.co_names:
        return None
    seen = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            seen.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            pass
    names = getattr(fn, "__globals__", {})
    seen += [names[n] for n in code.co_names if n in names]
    seen = [getattr(c, "__self__", None) if getattr(c, "__name__", "") == "apply" else c for c in seen]
    found = {c for c in seen if _is_function_class(c)}
    return found.pop() if len(found) == 1 else None


def _function_class_behind(fn):
    """The Function behind fn as _function_class finds it, or, for a module, behind its forward: the one whose
    forward names a slip and whose backward is traced (a module's own name and parameters stay the report's)."""
    return _function_class(fn.forward if _is_module(fn) else fn)


def _is_module(fn):
    torch = _torch_if_loaded()
    return torch is not None and isinstance(fn, torch.nn.Module)


def _positional_names(fn):
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _parameter_names(fn, count):
    """The callable's parameter names, when it has `count`: a lambda's or function's own (those the inputs are bound
    to), else (a partial of a Function's apply, a lambda taking *args) its Function's forward's without ctx and
    without what a partial binds; a Module's forward's."""
    unwrapped, bound = _unwrap_partial(fn)
    function_class = _function_class(fn)
    names = None
    if not (function_class is not None and unwrapped == getattr(function_class, "apply", None)):
        names = _positional_names(fn.forward if _is_module(fn) else fn)
    if (names is None or len(names) < count) and function_class is not None:
        names = _positional_names(function_class.forward)
        if names and names[0] == "ctx":
            names = names[1:]
        names = names[bound:] if names is not None and unwrapped == function_class.apply else names
    return names[:count] if names is not None and len(names) >= count else None


def _op_name(fn):
    function_class = _function_class(fn)
    if function_class is not None:
        return function_class.__name__
    if _is_module(fn):
        return type(fn).__name__
    fn, _ = _unwrap_partial(fn)
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
