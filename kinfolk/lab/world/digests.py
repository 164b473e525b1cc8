"""Whether a built family is the documented one: weight digests per cache key, recorded where the family was built.

A cache key fixes everything that determines a family's weights *in the arithmetic*: config, lab version, Python
version. The float kernels torch picks still depend on the CPU (its vector extensions: `AVX2`, `AVX512`, ...) and on
the torch build, so another kind of CPU trains a different family of the same design under the same key: its
numbers agree with the documented ones within the experiments' intervals, not to the bit. `digests.json` (next to
this module) holds, per documented key, each model's weight digest and the machine it was built on, and
`kinfolk lab build` says which case a build is in.

>>> check = DigestCheck(key="0123", documented=None, built={"small_base": "ab"}, machine=Machine("t", "AVX2", "x"))
>>> check.matches, check.line()[:47]
(None, 'family 0123: no documented digests for this key')
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

DIGESTS_FILE = Path(__file__).with_name("digests.json")
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class Machine:
    """What besides the key decides the bits: the torch build and the CPU's vector extensions (and, for people,
    the CPU's name)."""

    torch: str
    cpu_capability: str
    cpu: str

    @classmethod
    def here(cls) -> Machine:
        import torch

        return cls(torch.__version__, torch.backends.cpu.get_cpu_capability(), _cpu_name())

    def described(self) -> str:
        """The machine in words; the CPU's name counts too (an AMD EPYC with AVX512 trains other bits than an Intel
        Xeon with AVX512 under the same torch build)."""
        return f"torch {self.torch} on {self.cpu_capability}, {self.cpu}"


@dataclass(frozen=True)
class DocumentedFamily:
    """A documented family: what it is (`description`), each model's weight digest and where it was built."""

    description: str
    models: dict[str, str]
    machine: Machine


@dataclass(frozen=True)
class DigestCheck:
    """A build's digests against the documented ones for its key (`documented` None: that key is not documented)."""

    key: str
    documented: DocumentedFamily | None
    built: dict[str, str]
    machine: Machine

    @property
    def differing(self) -> list[str]:
        if self.documented is None:
            return []
        return [name for name, digest in self.built.items() if self.documented.models.get(name) != digest]

    @property
    def matches(self) -> bool | None:
        return None if self.documented is None else not self.differing

    def line(self) -> str:
        """One line for the user: same bits, a different family of the same design (and why), or nothing to say."""
        if self.documented is None:
            return f"family {self.key}: no documented digests for this key (docs/lab.md lists the documented ones)"
        if self.matches:
            return f"family {self.key}: every model's weights match the documented digests bit for bit"
        return (
            f"family {self.key}: {', '.join(self.differing)} differ from the documented digests (built with "
            f"{self.documented.machine.described()}; here {self.machine.described()}): a family of the same design "
            "whose numbers agree within the intervals, not the documented bits (docs/lab.md)"
        )


def weight_digest(model_dir: str | Path) -> str:
    """SHA-256 of a saved model's tensors (sorted by name: name, dtype, shape and bytes), so file metadata and
    tensor order in the file do not count."""
    import torch
    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(Path(model_dir) / WEIGHTS_FILE), framework="pt") as weights:
        for name in sorted(weights.keys()):
            tensor = weights.get_tensor(name).contiguous()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def family_digests(models: dict[str, Path]) -> dict[str, str]:
    """{model name: weight digest} of a family's model directories."""
    return {name: weight_digest(path) for name, path in models.items()}


def documented_families(path: Path | None = None) -> dict[str, DocumentedFamily]:
    """The documented families by cache key (from `path`, by default `DIGESTS_FILE`)."""
    path = path or DIGESTS_FILE  # read when called, so a test can document families in a file of its own
    if not path.exists():
        return {}
    return {
        key: DocumentedFamily(entry["description"], entry["models"], Machine(**entry["machine"]))
        for key, entry in json.loads(path.read_text()).items()
    }


def check_family(key: str, models: dict[str, Path], path: Path | None = None) -> DigestCheck:
    """A built family's digests against the documented ones for `key`."""
    return DigestCheck(key, documented_families(path).get(key), family_digests(models), Machine.here())


def record_family(key: str, models: dict[str, Path], description: str, path: Path | None = None) -> None:
    """Document a family built on this machine (a maintainer's step, in a checkout: `kinfolk lab build
    --record_digests`) in `path` (by default `DIGESTS_FILE`); other keys in the file are kept."""
    from kinfolk.atomic import write_json

    path = path or DIGESTS_FILE
    entries = json.loads(path.read_text()) if path.exists() else {}
    entries[key] = asdict(DocumentedFamily(description, family_digests(models), Machine.here()))
    write_json(path, dict(sorted(entries.items())))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
