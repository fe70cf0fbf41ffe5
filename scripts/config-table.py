#!/usr/bin/env python3
"""Markdown tables of every setting, from `eni-operator --help` (for the README).

Usage: cargo run -q -p eni-operator --bin eni-operator -- --help | scripts/config-table.py
"""
import re
import sys

entries, section, cur = [], None, None
for line in sys.stdin.read().split("\n"):
    if re.match(r"^[A-Z][^:]*:$", line):
        section, cur = line[:-1], None
        continue
    if section in (None, "Options"):
        continue
    one_line = re.match(r"^\s+(--[a-z0-9-]+)(?: \[?<[A-Z0-9_]+>\]?)?\s{2,}(\S.*)$", line)
    flag_only = re.match(r"^\s+(--[a-z0-9-]+)(?: \[?<[A-Z0-9_]+>\]?)?$", line)
    if one_line or flag_only:
        m = one_line or flag_only
        cur = {"section": section, "flag": m.group(1), "text": m.group(2) if one_line else ""}
        entries.append(cur)
    elif cur and line.startswith("          "):
        cur["text"] = (cur["text"] + " " + line.strip()).strip()

out, last = [], None
for e in entries:
    t = e["text"]
    env = re.search(r"\[env: ([A-Z0-9_]+)=[^\]]*\]", t)
    default = re.search(r"\[default: ([^\]]*)\]", t)
    values = re.search(r"\[possible values: ([^\]]*)\]", t)
    desc = re.sub(r"\s*\[(env|default|possible values): [^\]]*\]", "", t).strip()
    if values and values.group(1) != "true, false":
        desc += f" (one of: {values.group(1)})"
    if e["section"] != last:
        last = e["section"]
        out.append(f"\n**{last}**\n\n| Flag | Environment variable | Default | Meaning |\n|---|---|---|---|")
    d = f"`{default.group(1)}`" if default else "—"
    desc = desc.replace("|", "\\|")
    out.append(f"| `{e['flag']}` | `{env.group(1) if env else ''}` | {d} | {desc} |")
print("\n".join(out).strip())
