#!/usr/bin/env python3
"""Fails when a source file includes across a layer boundary the wrong way,
or when headers include each other in a cycle.

Layers, bottom up (README.md, Layout): include/ (public header) -> format/
(the storage format) -> runtime/ -> calib/ and backends/. A layer may include
only itself and the layers below it; format/ and runtime/ never include
backends/. engine/ sees only the public header. Nothing includes a tool's .c
file (tools link libraries instead).

Quoted includes are resolved as the compiler does here: relative to the
including file first, else by file name anywhere in the tree (every header
name is unique; the build's -I folders are the source folders). Names not in
the tree (generated headers) are skipped.

  python3 ci/check_layers.py [ROOT]       check the tree (default: this repo)
  python3 ci/check_layers.py --selftest   the checker finds planted faults
Run by ctest (tests/CMakeLists.txt: check_layers, check_layers_selftest).
"""
import os
import re
import sys
import tempfile

# layer -> layers it may include (itself always allowed)
ALLOWED = {
    "include": set(),
    "format": {"include"},
    "runtime": {"format", "include"},
    "calib": {"runtime", "format", "include"},
    "backends": {"runtime", "format", "include"},
    "engine": {"include"},  # the reference engine embeds liboscar through the public header only
}
SKIP_DIRS = {".git", "docs", "node_modules"}
SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".hip", ".cl", ".jinja")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def walk(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0]
        # build trees (build/, build-*/) hold generated copies, not sources
        dirnames[:] = [d for d in dirnames
                       if not (rel == "." and (d in SKIP_DIRS or d.startswith("build")))]
        if top.startswith("build"):
            continue
        for f in filenames:
            if f.endswith(SOURCE_EXT):
                yield os.path.normpath(os.path.join(rel, f))


def layer_of(path):
    top = path.split(os.sep)[0]
    return top if top in ALLOWED else None


def check(root):
    files = sorted(walk(root))
    by_name = {}
    for f in files:
        by_name.setdefault(os.path.basename(f), []).append(f)
    errors, graph = [], {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        deps = []
        for inc in INCLUDE_RE.findall(text):
            cand = os.path.normpath(os.path.join(os.path.dirname(f), inc))
            if cand in files:
                target = cand
            elif len(by_name.get(os.path.basename(inc), [])) == 1:
                target = by_name[os.path.basename(inc)][0]
            elif by_name.get(os.path.basename(inc)):
                errors.append(f"{f}: includes \"{inc}\", a name several files share "
                              f"({', '.join(by_name[os.path.basename(inc)])}); rename one")
                continue
            else:
                continue  # generated or system header
            deps.append(target)
            src, dst = layer_of(f), target.split(os.sep)[0]
            tool_dirs = (os.path.join("engine", "tools") + os.sep, os.path.join("engine", "gpu", "tools") + os.sep)
            if f.startswith(tool_dirs):
                src = None  # the engines' command-line tools are tools, not the engine library
            if src and dst != src and dst not in ALLOWED[src]:
                errors.append(f"{f}: includes {target}: layer {src}/ may include only "
                              f"{', '.join(sorted(ALLOWED[src] | {src}))}/ (move the code down a layer "
                              f"or declare what you need in the lower layer)")
            if target.startswith("tools" + os.sep) and target.endswith(".c"):
                errors.append(f"{f}: includes the tool source {target}; link the library the tool "
                              f"calls instead")
        graph[f] = deps
    # header cycles (a .c file included by another is a node too)
    state, stack = {}, []

    def dfs(n):
        state[n] = 1
        stack.append(n)
        for m in graph.get(n, []):
            if state.get(m) == 1:
                cyc = stack[stack.index(m):] + [m]
                errors.append("include cycle: " + " -> ".join(cyc))
            elif m not in state:
                dfs(m)
        stack.pop()
        state[n] = 2

    sys.setrecursionlimit(10000)
    for n in files:
        if n not in state:
            dfs(n)
    return errors


def selftest():
    """Plants each fault in a scratch tree; the checker must report it."""
    cases = {
        "runtime includes backends": {"runtime/a.c": '#include "cpu_x.h"\n', "backends/cpu/cpu_x.h": ""},
        "format includes runtime": {"format/f.c": '#include "rt.h"\n', "runtime/rt.h": ""},
        "header cycle": {"runtime/a.h": '#include "b.h"\n', "format/b.h": '#include "../runtime/a.h"\n'},
        "test includes tool source": {"tests/t.c": '#include "../tools/x_run.c"\n', "tools/x_run.c": ""},
    }
    clean = {"runtime/a.c": '#include "f.h"\n#include "oscar/oscar.h"\n', "format/f.h": '#include "oscar/oscar.h"\n',
             "include/oscar/oscar.h": "", "backends/cpu/c.c": '#include "f.h"\n#include "../../runtime/r.h"\n',
             "runtime/r.h": ""}
    bad = 0
    for name, tree in list(cases.items()) + [("clean tree", clean)]:
        with tempfile.TemporaryDirectory() as d:
            for p, text in tree.items():
                os.makedirs(os.path.join(d, os.path.dirname(p)), exist_ok=True)
                with open(os.path.join(d, p), "w") as fh:
                    fh.write(text)
            errs = check(d)
        want_fail = name != "clean tree"
        if bool(errs) != want_fail:
            print(f"selftest: {name}: expected {'a report' if want_fail else 'none'}, got {errs}")
            bad += 1
    print("selftest:", "ok" if not bad else f"{bad} case(s) wrong")
    return 1 if bad else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--selftest":
        return selftest()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    errs = check(os.path.abspath(root))
    for e in errs:
        print(e)
    if errs:
        print(f"check_layers: {len(errs)} problem(s)")
        return 1
    print("check_layers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
