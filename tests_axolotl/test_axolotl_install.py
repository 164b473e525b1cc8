"""kinfolk installs beside axolotl 0.21.0 without moving any version axolotl pins (issue 45, item 5)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution, version

from packaging.requirements import Requirement


def pinned(package: str) -> dict[str, str]:
    """`name -> version` of each exact pin of `package` that applies to this environment."""
    pins = {}
    for line in distribution(package).requires or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        exact = [spec.version for spec in requirement.specifier if spec.operator == "=="]
        if exact:
            pins[requirement.name] = exact[0]
    return pins


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def test_every_pin_of_axolotl_holds_with_kinfolk_installed():
    assert version("axolotl") == "0.21.0" and installed("kinfolk") is not None
    pins = pinned("axolotl")
    assert {"trl", "transformers", "peft", "accelerate", "datasets", "lm_eval"} <= set(pins)
    moved = {name: (pin, installed(name)) for name, pin in pins.items() if installed(name) != pin}
    assert moved == {}
    assert (pins["trl"], pins["transformers"], pins["accelerate"], pins["lm_eval"]) == (
        "1.14.1",
        "5.20.1",
        "1.15.0",
        "0.4.11",
    )
