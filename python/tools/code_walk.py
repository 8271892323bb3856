#!/usr/bin/env python3
"""How one call of tapegrad.gradcheck walks through the files of python/tapegrad, as a reader following it meets
them: the files entered and left, in order, from the call to the report.

    PYTHONPATH=build/python:python/tests /usr/bin/python3 python/tools/code_walk.py [--op NAME] [--slip SLIP]

The walk is read from the Python functions of the package that run (sys.setprofile): each function met for the
first time is followed into, and back out of; a function met again is not (the C++ checker calls the op's VJP and
forward hundreds of times, which a reader reads once). A module's or a class's body, run when a module is first
imported, is not followed: it is not part of the call, and whether it runs depends on what was imported before. The
file of the innermost followed function after each call and return gives the sequence; consecutive steps in one file
are one stay. It prints the stays, the files, the returns (the stays in a file the walk had already left: a helper's
result brought back to its caller counts), how many of those returns are the C++ checker's calls of the op's methods
(the forward, the VJP, ... of _torch_op.py's adapter, made from inside `_tapegrad._check`: the reader meets them as
the op's interface, not as steps of the Python around the check), and the calls back into a file in the middle of its
work (file A calls into B, which calls into A before returning: the jumps that make a reader hold two places of one
file at once).

--op and --slip pick a researcher's op (python/tests/researcher_ops.py) and one of its slips (default: layer norm
with its first slip: a failing check, so the diagnosis runs too); --slip right for the right version.
"""

import argparse
import inspect
import os
import sys

import tapegrad
import researcher_ops

PACKAGE = os.path.dirname(os.path.abspath(tapegrad.__file__))


def walk(run):
    """The walk of run()'s call through the package: (steps, reentries). steps: (the file of the innermost followed
    function after each call and return, whether the C++ checker was running then); reentries: the calls from a file
    into another file that, before returning, calls back into the first (A → B → A: the reader, in the middle of A,
    is sent back into it)."""
    seen, stack, steps, reentries = set(), [], [], []
    quiet = [0]  # depth inside a function met before, or a module's or class's body: nothing under it is followed
    in_checker = [0]  # depth of calls of the C++ module's functions (_tapegrad._check) under way

    def profile(frame, event, arg):
        if event in ("c_call", "c_return", "c_exception"):
            if getattr(arg, "__module__", None) == "tapegrad._tapegrad":
                in_checker[0] += 1 if event == "c_call" else -1
            return
        if event not in ("call", "return"):
            return
        path = frame.f_code.co_filename
        if not path.startswith(PACKAGE):
            return
        if event == "call":
            if quiet[0] or frame.f_code in seen or not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
                quiet[0] += 1
                return
            seen.add(frame.f_code)
            name = os.path.relpath(path, os.path.dirname(PACKAGE))
            if stack and name != stack[-1] and name in stack:
                reentries.append(f"{' → '.join(stack[stack.index(name):])} → {name} ({frame.f_code.co_name})")
            stack.append(name)
            steps.append((name, in_checker[0] > 0))
        else:
            if quiet[0]:
                quiet[0] -= 1
                return
            stack.pop()
            if stack:
                steps.append((stack[-1], in_checker[0] > 0))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return steps, reentries


def stays(steps):
    """The steps with consecutive ones in one file merged: [(file, whether the C++ checker was running)]."""
    out = []
    for s in steps:
        if not out or out[-1][0] != s[0]:
            out.append(s)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="layernorm", help="a researcher's op (default: layernorm)")
    parser.add_argument("--slip", help="one of its slips, or 'right' (default: its first slip)")
    parser.add_argument("--list", action="store_true", help="print every stay")
    args = parser.parse_args()
    slip = args.slip or next(iter(researcher_ops.OPS[args.op].slips))
    fn = researcher_ops.make(args.op, slip).apply
    inputs = researcher_ops.inputs(args.op, "small")
    steps, reentries = walk(lambda: tapegrad.gradcheck(fn, inputs))
    walked = stays(steps)
    left, returns, from_checker = set(), 0, 0
    for i, (f, checker_running) in enumerate(walked):
        if f in left:
            returns += 1
            from_checker += checker_running
        if i + 1 < len(walked):
            left.add(f)
    if args.list:
        for f, checker_running in walked:
            print(" ", f, "(the C++ checker running)" if checker_running else "")
        for r in reentries:
            print("  back into a file in the middle of its work:", r)
    print(f"{args.op} ({slip}): {len(walked)} stays in {len({f for f, _ in walked})} files, {returns} returns into a "
          f"file already left ({from_checker} of them while the C++ checker calls the op's methods), "
          f"{len(reentries)} calls back into a file in the middle of its work")


if __name__ == "__main__":
    main()
