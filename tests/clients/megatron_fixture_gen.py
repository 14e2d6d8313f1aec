#!/usr/bin/env python3
"""Writes the fixture megatron_fixture.py checks against: every option of Megatron-LM's
pretrain_gpt.py parser, taken from the parser itself.

Usage: PYTHON tests/clients/megatron_fixture_gen.py MEGATRON_LM COMMIT DATE > tests/clients/megatron_args_<commit>.json

MEGATRON_LM is a checkout of NVIDIA/Megatron-LM at COMMIT (committed on DATE); PYTHON needs
torch (scripts/clients.sh megatron). The parser is built as parse_args builds it
(argparse.ArgumentParser(allow_abbrev=False) through megatron/training/arguments.py's
add_megatron_arguments) and each action is written as facts: its option strings, dest, action
kind, type (a name: int, float, str, bool, or the name of Megatron's own converter such as
moe_freq_type; enum:NAME for an Enum, whose choices are its member names), choices, nargs,
const and default; a key left out is None. Help text is left out.
"""
import argparse
import enum
import json
import os
import sys

ACTIONS = {
    argparse._StoreAction: "store", argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false", argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append", argparse._CountAction: "count",
    argparse.BooleanOptionalAction: "boolean_optional",
}


def value(v):
    """A default, const or choice as JSON: enum members by name, the rest as they are."""
    if isinstance(v, enum.Enum):
        return v.name
    if isinstance(v, (list, tuple)):
        return [value(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return {"repr": repr(v)}


def type_name(t, choices):
    if t is None:
        return None
    if t in (int, float, str, bool):
        return t.__name__
    if choices and all(isinstance(c, enum.Enum) for c in choices):
        return "enum:" + type(choices[0]).__name__
    return t.__name__


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    root, commit, date = sys.argv[1:]
    import typing
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # Python < 3.12 (Megatron-LM imports it from typing)
    sys.path.insert(0, os.path.abspath(root))
    import warnings
    warnings.filterwarnings("ignore")
    from megatron.training import arguments
    parser = arguments.add_megatron_arguments(
        argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False))
    options = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        kind = ACTIONS.get(type(a))
        if kind is None:
            raise SystemExit(f"megatron_fixture_gen: {a.option_strings}: action {type(a).__name__} "
                             "has no name here; add it")
        choices = list(a.choices) if a.choices is not None else None
        o = {"flags": list(a.option_strings), "dest": a.dest, "action": kind,
             "type": type_name(a.type, choices),
             "choices": value(choices) if choices is not None else None,
             "nargs": a.nargs if kind == "store" else None,
             "const": value(a.const) if kind == "store_const" else None,
             "default": value(a.default), "required": a.required or None}
        # what a key leaves out is None (argparse's own default for it)
        options.append({k: v for k, v in o.items() if v is not None or k == "default"})
    fixture = {
        "source": {
            "repository": "NVIDIA/Megatron-LM", "commit": commit, "date": date,
            "path": "megatron/training/arguments.py",
            "parser": "argparse.ArgumentParser(allow_abbrev=False) + add_megatron_arguments "
                      "(as parse_args builds it)",
            "written_by": "tests/clients/megatron_fixture_gen.py",
        },
        "allow_abbrev": False,
        "options": options,
    }
    # one option per line: a new Megatron-LM version's fixture diffs option by option
    out = json.dumps({k: v for k, v in fixture.items() if k != "options"}, indent=1)[:-2]
    out += ',\n "options": [\n' + ",\n".join("  " + json.dumps(o) for o in options) + "\n ]\n}\n"
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
