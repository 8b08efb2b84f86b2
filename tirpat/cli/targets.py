"""``tirpat targets [NAME]``: the registered backends with their options, types and defaults;
with a NAME, one backend's or TVM target kind's options."""

from __future__ import annotations

import argparse
import json

from .command import Command, CommandError

_DESCRIPTION = """\
Lists what a composite target string (-t) can name: the registered backends, in priority
order before the host, each with its options (-name=value, --flag for a bool), and the TVM
target kind that is the host, the last target: it compiles what no backend takes and runs
the model on this machine's CPU. TVM's other kinds are listed with the reason they cannot
be the host here (a GPU runs kernels a host launches; 'c' emits C source)."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="a backend or TVM target kind: list its options only")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _backend_entry(backend) -> dict:
    doc = (type(backend).__doc__ or "").strip().splitlines()
    return {"name": backend.name, "kind": "backend", "summary": doc[0] if doc else "",
            "options": [{"name": k, "type": o.type_name, "default": o.default, "help": o.help}
                        for k, o in backend.options.items()]}


def _tvm_entry(kind: str, why_not: str | None) -> dict:
    from tirpat.model.target import host_options

    if why_not is not None:
        return {"name": kind, "kind": "tvm", "host": False, "options": [],
                "summary": f"TVM target kind {kind!r}: cannot be the host here: {why_not}"}
    return {"name": kind, "kind": "tvm", "host": True, "summary": f"TVM target kind {kind!r} (a host)",
            "options": [{"name": k, "type": t, "default": None, "help": ""} for k, t in host_options(kind).items()]}


# How an option is written in a target string, by type; a choice type writes its first choice.
_PLACEHOLDER = {"int": "=INT", "float": "=FLOAT", "str": "=TEXT", "list of str": "=A,B,..."}


def _format(entry: dict) -> str:
    lines = [f"{entry['name']}  {entry['summary']}".rstrip()]
    if entry.get("host") is False:
        return lines[0]
    if not entry["options"]:
        lines.append("  (no options)")
    rows = []
    for o in entry["options"]:
        kind = o["type"]
        if kind == "bool":
            flag = f"--{o['name']}"
        else:
            flag = f"-{o['name']}{_PLACEHOLDER.get(kind, '=VALUE')}"
        notes = [o["help"]] if o["help"] else []
        if kind not in ("bool",) and kind not in _PLACEHOLDER:
            notes.append(kind)                       # "one of 'wrap', 'saturate'", a TVM-only type
        if o["default"] is not None:
            notes.append(f"(default {o['default']!r})")
        rows.append((flag, " ".join(notes)))
    width = max((len(f) for f, _ in rows), default=0)
    lines += [f"  {flag:<{width}}  {text}".rstrip() for flag, text in rows]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    import tirpat as tp
    from tirpat.model.target import host_kinds

    registered = tp.backends()
    kinds = host_kinds()
    hosts = [kind for kind, why in kinds.items() if why is None]
    if args.name is not None:
        if args.name in registered:
            entry = _backend_entry(registered[args.name])
        elif args.name in kinds:
            entry = _tvm_entry(args.name, kinds[args.name])
        else:
            raise CommandError(f"no backend or TVM target kind named {args.name!r}; registered backends: "
                               f"{', '.join(sorted(registered)) or 'none'}; TVM target kinds: {', '.join(kinds)}")
        print(json.dumps(entry, indent=1) if args.json else _format(entry))
        return 0
    entries = [_backend_entry(b) for _, b in sorted(registered.items())]
    not_hosts = {kind: why for kind, why in kinds.items() if why is not None}
    if args.json:
        print(json.dumps({"backends": entries, "hosts": hosts, "not_hosts": not_hosts}, indent=1))
        return 0
    print("Backends (name them before the host, highest priority first):\n")
    for entry in entries:
        print(_format(entry) + "\n")
    if not entries:
        print("  (none registered: a backend package registers itself through the "
              "'tirpat.backends' entry point)\n")
    print(f"Host (the last target: compiles what no backend takes, runs the model here): {', '.join(hosts) or 'none'}")
    print(f"  'tirpat targets {hosts[0] if hosts else 'llvm'}' lists its options.")
    print("Other TVM target kinds, which cannot be the host here:")
    by_reason: dict[str, list[str]] = {}
    for kind, why in not_hosts.items():
        by_reason.setdefault(why, []).append(kind)
    for why, names in by_reason.items():
        print(f"  {', '.join(names)}: {why}")
    example = next(iter(sorted(registered)), None)
    print(f"\nExample: -t \"{example + ', ' if example else ''}llvm -mcpu=skylake -mattr=+avx2,+fma\"")
    return 0


COMMAND = Command(
    name="targets",
    help="list the registered backends (options, types, defaults) and the host",
    example='tirpat targets            # then: tirpat targets accel; tirpat targets llvm',
    arguments=_arguments,
    run=_run,
    description=_DESCRIPTION,
)
