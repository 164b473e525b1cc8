"""Test-session settings: offline Hub, one quiet OpenMP thread per worker, and the shared tiny-model kit."""

import gc
import os

# Set before torch is imported anywhere: spinning OpenMP threads stall badly when workers share two cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("WANDB_DISABLED", "true")

import pytest
import torch

from kinfolk.testing import TinyKit

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_kit(tmp_path_factory) -> TinyKit:
    """One kit for the whole run, shared by parallel workers (they race safely to build each model)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    return TinyKit(root / "tiny-kit")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_kit):
    return tiny_kit.tokenizer()


@pytest.fixture(scope="session")
def real_model_dir():
    """`real_model_dir(name)`: a converted real checkpoint's directory; the test is skipped when it is missing."""
    from tools.real_models import default_cache_dir, find_real_model

    def locate(name: str):
        path = find_real_model(name)
        if path is None:
            pytest.skip(f"the real model {name!r} is not in {default_cache_dir()}: run `make real-models`")
        return path

    return locate


@pytest.fixture(scope="session")
def lab_cache_dir(tmp_path_factory):
    """One lab cache for the whole run, shared by parallel workers: families are keyed by their config hash and a
    build holds a lock per key (`build_family`), so each family is built once per run."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    return root / "lab-cache"


@pytest.fixture(scope="session")
def quick_lab_family(lab_cache_dir):
    """The quick family, seed 0 (what `kinfolk demo --quick` and `kinfolk lab build --quick` use), built once per
    run in `lab_cache_dir`."""
    from kinfolk.lab.world.family import LabConfig, build_family

    return build_family(LabConfig.quick_config(seed=0), cache_dir=lab_cache_dir, progress=False)


@pytest.fixture(scope="session")
def atlas_adapter(tiny_kit, tmp_path_factory):
    """A saved ATLAS adapter on the kit's tiny Llama: random A and B (so it changes the output) and a fitted atlas."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
    from kinfolk.testing import prompt_completion_dataset

    base_dir = tiny_kit.model_dir("llama")
    folder = tmp_path_factory.mktemp("atlas-adapter")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), AtlasConfig(r=4, init_weights=False))
    fit_atlas(model, prompt_completion_dataset(16, seed=4), tiny_kit.tokenizer(), batch_size=8, progress=False)
    model.save_pretrained(folder)
    return {"base": base_dir, "adapter": folder}


@pytest.fixture(scope="session")
def distil_pair(tiny_kit, tmp_path_factory):
    """A 4-layer teacher and its 2-layer student (layers 0 and 2), perturbed so that the KL and cosine terms are far
    from zero: (teacher, student, a folder for the test's own outputs)."""
    from adapt_helpers import distilled_copy, init_student

    root = tmp_path_factory.mktemp("distil-pair")
    teacher = tiny_kit.model_dir("llama", "large")
    init = init_student(teacher, root / "init", layers=[0, 2])
    student = distilled_copy(init, root / "student", tiny_kit.tokenizer(), seed=3, scale=0.05)
    return str(teacher), str(student), root


# The crash-safety tests' set-ups, built once for the SIGKILL (test_kill_and_resume) and signal (test_interrupts) files.
@pytest.fixture(scope="session")
def patch_setup(tiny_kit, tmp_path_factory):
    """`merge patch --all` on a 4-layer teacher, its uninterrupted output, and an older output an overwrite replaces."""
    from adapt_helpers import init_student

    from kinfolk.plugins.adapt import merge

    root = tmp_path_factory.mktemp("kill-merge")
    teacher = tiny_kit.model_dir("qwen3", "large")
    student = init_student(teacher, root / "s", every=2)
    config = {"op": "patch", "teacher": str(teacher), "student": str(student), "max_shard_size": "30KB"}
    reference = merge(config, root / "reference", all_sizes=True, progress=False)
    old = merge({**config, "num_patched": 1}, root / "old", progress=False)  # what an overwrite replaces
    return {"config": config, "reference": reference, "old": old}


@pytest.fixture(scope="session")
def score_setup(tiny_kit, tmp_path_factory):
    """`score` of 40 rows with two models in chunks of 4 rows, and its uninterrupted result."""
    from datasets import Dataset

    from kinfolk.plugins.atlantis import score_dataset
    from kinfolk.testing import prompt_completion_dataset

    root = tmp_path_factory.mktemp("kill-score")
    family = tiny_kit.family("qwen2")
    data = root / "data"
    prompt_completion_dataset(40, seed=5).save_to_disk(str(data))
    models = {"large_base": str(family["large_base"]), "small_base": str(family["small_base"])}
    options = {"chunk_rows": 4}  # 10 chunks per model, so kills land inside a model's pass
    reference = score_dataset(Dataset.load_from_disk(str(data)), **models, use_cache=False, **options)
    return {"data": str(data), "models": models, "options": options, "reference": reference}


@pytest.fixture(scope="session")
def micro_family(lab_cache_dir):
    """The lab's micro family (`tests.lab_helpers.MICRO`), built once per session in the session's lab cache."""
    from lab_helpers import MICRO

    from kinfolk.lab.world.family import LabConfig, build_family

    return build_family(LabConfig(**MICRO), cache_dir=lab_cache_dir, progress=False)


LONGEST_GROUP = "quick-lab-family"  # the quick family's build, then the demo and digest tests: minutes on one worker


def pytest_collection_finish(session):
    """Exempt what collection imported (torch, transformers, TRL, lm-eval, every test module: ~500,000 objects) from
    the garbage collector's full passes. Every `Trainer.train()` asks for one (accelerate's `free_memory`), and each
    walked all of them: 0.3-0.4 s of CPU a time, half the run time of the SFT tests. Nothing collection made is
    garbage a later test needs collected."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """The longest chain of one worker goes first, so the other worker's tests overlap it rather than wait for it at
    the end of the run (xdist's loadgroup hands out groups in collection order)."""
    chain = [item for item in items if any(m.args[:1] == (LONGEST_GROUP,) for m in item.iter_markers("xdist_group"))]
    items[:] = chain + [item for item in items if item not in chain]
