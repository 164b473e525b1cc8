"""`make test-compat`: the compatibility subset in one environment per cell of the tested version window.

The cells and the subset live in `kinfolk/compat/cells.toml` (the window's one home; kinfolk.compat warns from the
same file). Each cell's virtual environment is built from the registries as `make test` builds `.venv` (its
Python, then its torch, then `pip install -e '.[dev]'` with the cell's pins) under `.compat/<cell>/venv`
(git-ignored), and brought up to date when the cell, pyproject.toml or setup.py changes. Then the subset runs in
it, and one table says per cell: the versions installed, tests passed and failed, seconds.

    python tools/compat.py [CELL ...] [--workers N]
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CELLS = REPO / "kinfolk" / "compat" / "cells.toml"
CACHE = REPO / ".compat"
SHOWN = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "lm-eval")


@dataclass(frozen=True)
class Outcome:
    cell: str
    python: str
    versions: dict[str, str]
    passed: int
    failed: int
    seconds: float


def find_python(version: str) -> str:
    """`pythonX.Y` on PATH where it runs, else pyenv's newest X.Y build (pyenv's shim for a version that no
    `pyenv global`/`local` selects is on PATH but exits 127)."""
    found = shutil.which(f"python{version}")
    if found is not None and subprocess.run([found, "-c", ""], capture_output=True).returncode != 0:
        found = None
    builds = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python")))
    if found is None and not builds:
        sys.exit(f"test-compat: error: no Python {version} (neither python{version} on PATH nor pyenv's {version}.*)")
    return found or builds[-1]


def stamp(cell: dict) -> str:
    """What the environment was built from: the cell and the files that say what kinfolk installs."""
    digest = hashlib.sha256(json.dumps(cell, sort_keys=True).encode())
    for name in ("pyproject.toml", "setup.py"):
        digest.update((REPO / name).read_bytes())
    return digest.hexdigest()


def run(command: list[str], log: Path) -> None:
    with log.open("a") as out:
        done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"test-compat: error: {' '.join(command[:6])} ... failed (exit {done.returncode}); see {log}")


def environment(name: str, cell: dict) -> Path:
    """The cell's virtual environment, built or brought up to date when its stamp changed."""
    home = CACHE / name
    venv, stamp_file, log = home / "venv", home / "stamp", home / "build.log"
    python = venv / "bin" / "python"
    wanted = stamp(cell)
    if stamp_file.is_file() and stamp_file.read_text() == wanted:
        return python
    home.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    print(f"test-compat: building {name} (Python {cell['python']}); log: {log}", flush=True)
    same_python = (
        python.exists()
        and subprocess.run(
            [python, "-c", f"import sys; sys.exit(sys.version.startswith('{cell['python']}.') is False)"]
        ).returncode
        == 0
    )
    if not same_python:
        shutil.rmtree(venv, ignore_errors=True)
        run([find_python(cell["python"]), "-m", "venv", str(venv)], log)
    pins = [f"{package}=={version}" for package, version in cell["pins"].items()]
    run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], log)
    run([str(python), "-m", "pip", "install", "-q", f"torch=={cell['pins']['torch']}"], log)
    run([str(python), "-m", "pip", "install", "-q", "-e", ".[dev]", *pins], log)
    stamp_file.write_text(wanted)
    return python


def installed(python: Path) -> dict[str, str]:
    script = f"import importlib.metadata as m, json; print(json.dumps({{p: m.version(p) for p in {list(SHOWN)!r}}}))"
    return json.loads(subprocess.run([python, "-c", script], capture_output=True, text=True, check=True).stdout)


def run_subset(name: str, cell: dict, subset: dict, python: Path, workers: int) -> Outcome:
    report = CACHE / name / "junit.xml"
    parallel = ["-p", "no:xdist"] if workers <= 1 else ["-n", str(workers), "--dist", "loadgroup"]
    # the cell's own temporary folder: the last run's files stay there to read, and cells never share one
    basetemp = f"--basetemp={CACHE / name / 'tmp'}"
    command = [str(python), "-m", "pytest", *parallel, "-q", "-m", subset["markers"], f"--junitxml={report}", basetemp]
    variables = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    variables.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    print(f"test-compat: {name}: pytest {' '.join(subset['tests'])}", flush=True)
    start = time.monotonic()
    subprocess.run([*command, *subset["tests"]], cwd=REPO, env=variables)
    seconds = time.monotonic() - start
    totals = ElementTree.parse(report).getroot()
    suite = totals if totals.tag == "testsuite" else totals.find("testsuite")
    tests, failures, errors, skipped = (int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped"))
    return Outcome(name, cell["python"], installed(python), tests - failures - errors - skipped, failures + errors,
                   seconds)  # fmt: skip


def table(outcomes: list[Outcome]) -> str:
    header = ["cell", "python", *SHOWN, "passed", "failed", "seconds"]
    rows = [[o.cell, o.python, *(o.versions[p] for p in SHOWN), str(o.passed), str(o.failed), f"{o.seconds:.0f}"]
            for o in outcomes]  # fmt: skip
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in [header, *rows]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    config = tomllib.loads(CELLS.read_text())
    parser = argparse.ArgumentParser(prog="test-compat", description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="*", default=list(config["cells"]), help="cells to run (default: all)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per cell (1: one process)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.cells) - set(config["cells"]))
    if unknown:
        parser.error(f"unknown cell {unknown[0]!r}; {CELLS.relative_to(REPO)} has {', '.join(config['cells'])}")
    outcomes = []
    for name in args.cells:
        python = environment(name, config["cells"][name])
        outcomes.append(run_subset(name, config["cells"][name], config["subset"], python, args.workers))
    print(table(outcomes))
    return 1 if any(outcome.failed or not outcome.passed for outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
