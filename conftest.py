"""Test-session settings: offline Hub, one quiet OpenMP thread per worker, and the shared tiny-model kit."""

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
    """One lab cache per test session, so the slow tests build the quick family once (per worker)."""
    return tmp_path_factory.mktemp("lab-cache")
