"""The axolotl integration's tests (`make test-axolotl`, a Python 3.12 venv with axolotl 0.21.0; not in `make test`).

The repository's conftest.py (tiny-model kit, one OpenMP thread, offline Hub) applies here too; axolotl's telemetry
and W&B stay off.
"""

import os

os.environ["AXOLOTL_DO_NOT_TRACK"] = "1"
os.environ["WANDB_DISABLED"] = "true"
os.environ.setdefault("WANDB_MODE", "disabled")
