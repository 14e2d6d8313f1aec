"""The plans of tests/clients/plans.txt, planned and exported by parallax, for the client checks.

    for name, plan, text in plan_exports.each(parallax, "megatron", tmp):
        ...   # plan: the plan JSON as a dict; text: what `parallax export PLAN --format F` wrote

Each line of plans.txt is NAME then `parallax plan` arguments; $CLIENTS stands for
tests/clients. The plan is written with -o and --top 1 under PARALLAX_UNCALIBRATED=1, so that
the same layout comes out on every machine.
"""
import json
import os
import shlex
import subprocess

CLIENTS = os.path.dirname(os.path.abspath(__file__))


def plans(path=None):
    """[(name, [plan args])] in the file's order."""
    out = []
    with open(path or os.path.join(CLIENTS, "plans.txt")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line.replace("$CLIENTS", CLIENTS))
            out.append((words[0], words[1:]))
    return out


def run_plan(parallax, name, args, tmp):
    """Plans args into tmp/NAME.json; returns (path, plan as a dict)."""
    path = os.path.join(tmp, name + ".json")
    env = dict(os.environ, PARALLAX_UNCALIBRATED="1")
    subprocess.run([parallax, "plan", *args, "-o", path, "--top", "1"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    with open(path) as f:
        return path, json.load(f)


def export(parallax, path, fmt):
    env = dict(os.environ, PARALLAX_UNCALIBRATED="1")
    return subprocess.run([parallax, "export", path, "--format", fmt], check=True, env=env,
                          capture_output=True, text=True).stdout


def each(parallax, fmt, tmp, only=None):
    """(name, plan, export text) for every plan of plans.txt (or those named in only)."""
    for name, args in plans():
        if only and name not in only:
            continue
        path, plan = run_plan(parallax, name, args, tmp)
        yield name, plan, export(parallax, path, fmt)
