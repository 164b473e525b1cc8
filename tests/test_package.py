"""The installed artefact: the wheel carries the design-card folders as `kinfolk.*` and the task files."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import kinfolk
from kinfolk.commands import main

REPO = Path(__file__).resolve().parents[1]


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"kinfolk {kinfolk.__version__}"
    assert main([]) == 2
    assert "env" in capsys.readouterr().out


def test_unknown_verb_is_an_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_env_reports_the_stack(capsys):
    import peft
    import torch
    import trl

    assert main(["env", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert env["versions"]["trl"] == trl.__version__
    assert env["versions"]["peft"] == peft.__version__
    assert env["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert isinstance(env["peft_plugins"], dict)
    assert main(["env"]) == 0
    table = capsys.readouterr().out
    assert "transformers" in table and "peft plugins" in table


def test_console_script_runs():
    script = Path(sys.executable).parent / "kinfolk"
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"kinfolk {kinfolk.__version__}"


def _package_files(root: Path) -> set[str]:
    return {
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def test_wheel_installs_outside_the_repo(tmp_path):
    """Build the wheel, install it into a fresh venv (deps borrowed from this one), import from elsewhere."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(REPO),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("kinfolk-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # The fresh venv sees this venv's dependencies but not its editable kinfolk (plain paths skip .pth files).
    (purelib / "borrowed-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)], check=True
    )
    probe = (
        "import json, kinfolk, kinfolk.plugins, kinfolk.trainers, kinfolk.callbacks, kinfolk.eval_tasks as t\n"
        "print(json.dumps({'init': kinfolk.__file__, 'plugins': kinfolk.plugins.__file__, 'tasks': str(t.task_dir())}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path, env=env)
    located = json.loads(out.stdout)
    for path in (located["init"], located["plugins"], located["tasks"]):
        assert Path(path).is_relative_to(purelib), path
    installed_tasks = _package_files(Path(located["tasks"]))
    source_tasks = _package_files(REPO / "eval_tasks")
    assert source_tasks <= installed_tasks, f"missing from the wheel: {sorted(source_tasks - installed_tasks)}"
    installed_plugins = _package_files(purelib / "kinfolk" / "plugins")
    assert {p for p in _package_files(REPO / "plugins") if p.endswith(".py")} <= installed_plugins


def _fresh_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_import_kinfolk_registers_atlas_whichever_comes_first():
    lookup = "from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING as M; print(M[peft.PeftType('ATLAS')].__name__)"
    assert _fresh_python(f"import kinfolk, peft; {lookup}") == "AtlasConfig"
    assert _fresh_python(f"import peft, kinfolk; {lookup}") == "AtlasConfig"
    # transformers asks `importlib.util.find_spec("peft")` long before it imports PEFT
    probe_first = "import importlib.util, kinfolk; importlib.util.find_spec('peft'); import peft"
    assert _fresh_python(f"{probe_first}; {lookup}") == "AtlasConfig"


def test_the_command_line_starts_without_the_heavy_stack():
    loaded = _fresh_python(
        "import sys; from kinfolk.commands import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'peft', 'transformers') if m in sys.modules))"
    )
    assert loaded == "[]"
