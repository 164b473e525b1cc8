"""kinfolk.compat: the tested window's warning, pyproject's bounds against the cells, and TRL 1.14's stand-ins
against hand-written float64 references (they run on every TRL, so every cell checks them)."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

import pytest
import torch

import kinfolk.compat as compat
from kinfolk.compat.trl import divergence_from_logits, label_log_probs_from_logits

REPO = Path(__file__).resolve().parents[1]


def test_pyproject_lower_bounds_are_the_oldest_cell_and_no_upper_bound_stands():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    bounds = {re.split(r"[<>=!~ ]", spec, maxsplit=1)[0]: spec for spec in dependencies}
    for package, version in compat.cells()["oldest"]["pins"].items():
        spec = bounds[package]
        assert "<" not in spec, f"{spec}: an upper bound needs a released version known to break (and its test)"
        lower = spec.split(">=", 1)[1]
        assert [int(part) for part in lower.split(".")] <= [int(part) for part in version.split(".")], spec
        assert version.startswith(lower), f"{spec}: the lower bound is not the oldest cell's {package} {version}"


def test_a_version_outside_the_window_gets_one_line_naming_package_version_and_window(monkeypatch, caplog):
    stack = {package: version for package, version in compat.cells()["newest"]["pins"].items()}
    stack |= {"trl": "1.13.0", "torch": "2.15.0+cpu", "peft": "0.21.3"}  # peft: a patch of the newest, inside
    monkeypatch.setattr(compat, "installed_version", stack.__getitem__)
    compat.warn_about_versions_outside_window.cache_clear()
    with caplog.at_level(logging.WARNING, logger="kinfolk.compat"):
        compat.warn_about_versions_outside_window()
        compat.warn_about_versions_outside_window()  # once per process
    compat.warn_about_versions_outside_window.cache_clear()
    assert sorted(record.getMessage() for record in caplog.records) == [
        "kinfolk: warning: torch 2.15.0+cpu is outside kinfolk's tested window (2.13.0 to 2.14.x); see "
        "docs/compatibility.md",
        "kinfolk: warning: trl 1.13.0 is outside kinfolk's tested window (1.14.1 to 1.16.x); see docs/compatibility.md",
    ]


def test_log_probs_from_logits_match_a_per_position_reference():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=generator)
    labels = torch.tensor([[-100, 3, 1, -100, 6], [2, 2, 0, 5, -100]])
    log_probs, mask = label_log_probs_from_logits(logits, labels)
    for row in range(2):
        for t in range(4):
            target = int(labels[row, t + 1])
            expected = 0.0 if target == -100 else float(torch.log_softmax(logits[row, t].double(), -1)[target])
            assert bool(mask[row, t]) == (target != -100)
            assert float(log_probs[row, t]) == pytest.approx(expected, abs=1e-6)


def reference_divergence(current, frozen, beta):
    """Per-token divergence from two (N, V) float64 distributions, written out term by term."""
    p, q = torch.softmax(frozen, -1), torch.softmax(current, -1)
    if beta == 0.0:
        return (p * (p.log() - q.log())).sum(-1)
    if beta == 1.0:
        return (q * (q.log() - p.log())).sum(-1)
    m = (1 - beta) * q + beta * p
    return beta * (p * (p.log() - m.log())).sum(-1) + (1 - beta) * (q * (q.log() - m.log())).sum(-1)


def transformed(hidden, weight, bias, scale, softcap, temperature):
    logits = (hidden @ weight.T + bias) * scale
    return (softcap * torch.tanh(logits / softcap) if softcap else logits) / temperature


@pytest.mark.parametrize("beta", [0.0, 1.0, 0.3])
def test_the_divergence_stand_in_and_its_gradient_match_a_float64_reference(beta):
    generator = torch.Generator().manual_seed(1)
    hidden, weight, bias = (torch.randn(*shape, generator=generator) for shape in [(6, 4), (9, 4), (9,)])
    frozen_hidden, frozen_weight = torch.randn(6, 3, generator=generator), torch.randn(9, 3, generator=generator)
    current = hidden.clone().requires_grad_()
    settings = {"temperature": 1.5, "current_scale": 0.8, "current_softcap": 3.0, "frozen_scale": 1.2}
    divergence, entropy = divergence_from_logits(
        current, weight, bias, frozen_hidden, frozen_weight, None, beta, **settings
    )
    divergence.sum().backward()

    current64 = hidden.double().requires_grad_()
    current_logits = transformed(current64, weight.double(), bias.double(), 0.8, 3.0, 1.5)
    frozen_logits = transformed(frozen_hidden.double(), frozen_weight.double(), 0.0, 1.2, None, 1.5)
    expected = reference_divergence(current_logits, frozen_logits, beta)
    expected.sum().backward()
    q = torch.softmax(current_logits.detach(), -1)
    torch.testing.assert_close(divergence.double(), expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(entropy.double(), -(q * q.log()).sum(-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(current.grad.double(), current64.grad, rtol=1e-4, atol=1e-6)


def test_a_python_on_path_that_does_not_run_gives_way_to_pyenvs_build(tmp_path, monkeypatch):
    # pyenv puts a shim for every version on PATH; for a version no `pyenv global` selects it exits 127
    from tools import compat as compat_tool

    shims, home = tmp_path / "shims", tmp_path / "home"
    shim = shims / "python3.99"
    build = home / ".pyenv" / "versions" / "3.99.1" / "bin" / "python"
    for path, code in ((shim, 127), (build, 0)):
        path.parent.mkdir(parents=True)
        path.write_text(f"#!/bin/sh\nexit {code}\n")
        path.chmod(0o755)
    monkeypatch.setenv("PATH", str(shims))
    monkeypatch.setenv("HOME", str(home))
    assert compat_tool.find_python("3.99") == str(build)
    shim.write_text("#!/bin/sh\nexit 0\n")  # a selected version: the one on PATH
    assert compat_tool.find_python("3.99") == str(shim)
