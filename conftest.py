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
