"""A run that asked for N processes and got fewer says so: `accelerate launch --num_processes 2` without
`--multi_gpu` starts one process on a machine without GPUs."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kinfolk import launch_check
from kinfolk.launch_check import requested_processes, warn_if_fewer_processes

JOB = Path(__file__).with_name("launch_check_job.py")


def test_the_request_is_read_from_world_size_the_launch_flags_or_its_config(tmp_path):
    config = tmp_path / "accelerate.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 3\n")
    assert requested_processes({"WORLD_SIZE": "2"}, ["--num_processes", "8", "x.py"]) == (2, "WORLD_SIZE")
    assert requested_processes({}, ["--num-processes=4", "x.py"]) == (4, "accelerate launch --num_processes")
    assert requested_processes({}, ["--config_file", str(config), "x.py"]) == (3, f"accelerate config {config}")
    assert requested_processes({}, ["--cpu", "x.py"]) is None  # --cpu ignores the default config file
    assert requested_processes({}, None) is None  # not launched by accelerate


@pytest.fixture
def fresh_warning_state(monkeypatch):
    monkeypatch.setattr(launch_check, "_warned", False)
    monkeypatch.setattr(launch_check, "launch_arguments", lambda: None)
    monkeypatch.delenv("RANK", raising=False)


def test_warns_once_from_rank_zero_when_fewer_processes_run(monkeypatch, caplog, fresh_warning_state):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with caplog.at_level(logging.WARNING, logger=launch_check.__name__):
        warn_if_fewer_processes(2)  # as asked: nothing
        assert caplog.records == []
        warn_if_fewer_processes(1)
        warn_if_fewer_processes(1)
    assert len(caplog.records) == 1
    assert "asked for 2 processes (WORLD_SIZE) but runs as 1" in caplog.text
    assert "accelerate launch --multi_gpu --num_processes N" in caplog.text


def test_other_ranks_stay_quiet(monkeypatch, caplog, fresh_warning_state):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with caplog.at_level(logging.WARNING, logger=launch_check.__name__):
        warn_if_fewer_processes(1)
    assert caplog.records == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "processes"), [(["--num_processes", "2"], 1), (["--multi_gpu", "--num_processes", "2"], 2)]
)
def test_accelerate_launch_on_cpu_warns_exactly_when_processes_are_missing(tmp_path, flags, processes):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "JOB_OUTPUT_DIR": str(tmp_path)}
    environment["PYTHONPATH"] = str(JOB.parent)
    command = [sys.executable, "-m", "accelerate.commands.launch", *flags, str(JOB)]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert finished.stdout.count(f"world size {processes}") == processes
    warnings = finished.stderr.count("this run asked for 2 processes")
    assert warnings == (1 if processes == 1 else 0), finished.stderr[-3000:]
