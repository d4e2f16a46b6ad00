#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks that the manager's files import each other without a cycle.

File A imports file B when A's object refers to a symbol that B's object defines. The objects
are read from the library's static archive with nm (usage: check_dag.py NM ARCHIVE). Prints
the imports of each manager/*.c file, and exits 1 when they form a cycle (naming it), or when
the archive holds too few manager objects for the check to mean anything.
"""

import re
import subprocess
import sys

MEMBER = re.compile(r"manager_(\w+)\.c\.o$")
DEFINED = set("TDBRGSVWiu")  # global definitions nm reports (weak ones too)


def read_symbols(nm, archive):
    # POSIX format, one symbol a line: "ARCHIVE[MEMBER]: NAME TYPE [VALUE SIZE]"
    out = subprocess.run([nm, "-A", "-g", "-P", archive], check=True, capture_output=True,
                         text=True)
    defs, uses = {}, {}
    for line in out.stdout.splitlines():
        where, sep, rest = line.partition("]: ")
        fields = rest.split()
        m = MEMBER.search(where.rsplit("/", 1)[-1])
        if not sep or len(fields) < 2 or not m:
            continue
        f, name, kind = m.group(1), fields[0], fields[1]
        defs.setdefault(f, set())
        uses.setdefault(f, set())
        if kind == "U":
            uses[f].add(name)
        elif kind in DEFINED:
            defs[f].add(name)
    return defs, uses


def find_cycle(graph):
    """A cycle of graph as a list of nodes (first repeated at the end), or None."""
    state = {}  # 1: on the stack, 2: done
    stack = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for d in sorted(graph[n]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                c = visit(d)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            c = visit(n)
            if c:
                return c
    return None


def main():
    if len(sys.argv) != 3:
        print("usage: check_dag.py NM ARCHIVE", file=sys.stderr)
        return 2
    defs, uses = read_symbols(sys.argv[1], sys.argv[2])
    if len(defs) < 4:
        print("found %d manager objects in %s: too few to check" % (len(defs), sys.argv[2]))
        return 1
    owner = {}
    for f, names in defs.items():
        for n in names:
            owner[n] = f
    graph = {f: {owner[u] for u in uses[f] if u in owner and owner[u] != f} for f in defs}
    for f in sorted(graph, key=lambda f: (len(graph[f]), f)):
        print("manager/%s.c -> %s" % (f, ", ".join(sorted(graph[f])) or "(nothing)"))
    cycle = find_cycle(graph)
    if cycle:
        print("import cycle: " + " -> ".join("manager/%s.c" % f for f in cycle))
        return 1
    print("no import cycle among %d manager objects" % len(graph))
    return 0


if __name__ == "__main__":
    sys.exit(main())
