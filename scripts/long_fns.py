#!/usr/bin/env python3
"""Lists the Rust functions longer than N lines (default 80) below a folder.

Usage: scripts/long_fns.py [DIR] [N]. A function's length is from its `fn` line to its closing
brace. Strings, chars and comments are skipped so their braces do not count; good enough for
this crate's code, not a Rust parser.
"""
import os
import re
import sys

FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def strip(src):
    """The source with comments, strings and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and not (i and (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", src[i:j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x..'", src[i:i + 12]):
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\x..|\\.|[^\\'])'", src[i:])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    text = strip(open(path, encoding="utf-8").read())
    for m in FN.finditer(text):
        # The body starts at the first `{` after the signature; a `;` first means no body.
        j = m.end()
        depth_paren = 0
        while j < len(text):
            ch = text[j]
            if ch in "([<":
                depth_paren += 1
            elif ch in ")]>":
                depth_paren -= 1
            elif ch == ";" and depth_paren <= 0:
                j = -1
                break
            elif ch == "{" and depth_paren <= 0:
                break
            j += 1
        if j < 0 or j >= len(text):
            continue
        depth, k = 0, j
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        start = text.count("\n", 0, m.start()) + 1
        end = text.count("\n", 0, k) + 1
        yield m.group(1), start, end - start + 1


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "crates/dlock/src"
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 80
    rows = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".rs"):
                p = os.path.join(dirpath, f)
                for name, line, length in functions(p):
                    if length > limit:
                        rows.append((length, os.path.relpath(p, root), line, name))
    for length, p, line, name in sorted(rows, reverse=True):
        print(f"{length:5} {p}:{line} {name}")


if __name__ == "__main__":
    main()
