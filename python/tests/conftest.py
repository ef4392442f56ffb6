"""Shared fixtures: the CLI the module is checked against (LAZYPREFILL_CLI, set by ctest)."""
import json
import math
import os
import subprocess

import pytest


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("LAZYPREFILL_CLI")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("LAZYPREFILL_CLI must name the lazyprefill binary (ctest sets it)")

    # Without the sanitizer runtime a sanitized module's run preloads: a sanitized CLI links its own.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

    def run(*args, expect_ok=True):
        p = subprocess.run([path, *map(str, args)], capture_output=True, text=True, timeout=120, env=env)
        if expect_ok:
            assert p.returncode == 0, f"{' '.join(map(str, args))}: {p.stderr}"
            return json.loads(p.stdout)
        return p

    return run


def cli_error(p):
    """The one line the CLI printed for a refused command, without its 'lazyprefill: error: ' and
    ' (see --help)' frame."""
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    line = lines[0]
    prefix = "lazyprefill: error: "
    assert line.startswith(prefix), line
    line = line[len(prefix):]
    return line.removesuffix(" (see --help)")


def cli_args(subcommand, case, repeated=()):
    """The command line that asks `subcommand --json` what `case` (keyword arguments) asks the module:
    a flag per keyword (`prompt_tokens` -> `--prompt-tokens`), True as a bare flag,
    a list joined by commas (repeated flags for the keywords in `repeated`), infinity as inf."""
    args = [subcommand, "--json"]
    for k, v in case.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            args.append(flag)
        elif isinstance(v, list) and k in repeated:
            for x in v:
                args += [flag, x]
        elif isinstance(v, list):
            args += [flag, ",".join(map(str, v))]
        elif isinstance(v, float) and math.isinf(v):
            args += [flag, "inf"]
        else:
            args += [flag, v]
    return args
