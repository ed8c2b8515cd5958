#!/usr/bin/env python3
"""Whether two object files hold the same code: every code section's
disassembly, with relocations, compared by section name (`objdump -d`
disassembles only code; data sections such as string literals are not
compared). Local label numbers (`.L.str.25` against `.L.str.26`) and
objdump's guesses at the symbol nearest an address are left out: they
number string literals in the order the compiler met them, which
precompiled headers change. Exit 0: the same; 1: not, with the first
differing sections named."""

import re
import subprocess
import sys


def sections(path):
    out = subprocess.run(
        ["objdump", "-d", "-r", "--no-show-raw-insn", path],
        capture_output=True, text=True, check=True,
    ).stdout
    found = {}
    for part in out.split("\nDisassembly of section ")[1:]:
        name, _, body = part.partition(":\n")
        body = re.sub(r"\.L[\w.]+", ".L", body)
        body = re.sub(r"<[^>\n]*>", "<>", body)
        found[name] = body
    return found


def main():
    a, b = sections(sys.argv[1]), sections(sys.argv[2])
    differ = sorted(set(a) ^ set(b)) + sorted(k for k in set(a) & set(b) if a[k] != b[k])
    if differ:
        print(f"{len(differ)} of {len(set(a) | set(b))} sections differ: {', '.join(differ[:3])}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
