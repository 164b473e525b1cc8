"""ATLAS adapters load in Python processes that never import kinfolk.

kinfolk installs a `.pth` startup line that imports the (tiny) `kinfolk` package, which registers the ATLAS type
with PEFT when PEFT is imported. Every check here runs a fresh interpreter whose code does not mention kinfolk,
as a user's PEFT, transformers or lm-eval script would; the outputs are compared with the adapter in this process.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lm_eval_helpers import TASK, cli_samples, in_process, log_likelihoods
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

import kinfolk
from kinfolk.eval_tasks import task_dir

HEAVY = ("torch", "peft", "transformers", "numpy", "typing", "importlib.abc")
INPUT_IDS = [[5, 9, 17, 33, 2, 41, 7]]


def fresh_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """A new interpreter of this environment, started away from the repository (no `kinfolk/` folder in sight)."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    finished = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=environment, capture_output=True, text=True, timeout=600
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return finished


@pytest.fixture(scope="module")
def adapter(atlas_adapter):
    """The saved ATLAS adapter, with its logits on INPUT_IDS computed in this process."""
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(atlas_adapter["base"]), atlas_adapter["adapter"]
    )
    ids = torch.tensor(INPUT_IDS)
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
    assert not torch.allclose(adapted, base)  # the adapter changes the output, so loading it is visible
    return {**atlas_adapter, "logits": adapted}


def test_interpreter_start_installs_the_hook_and_imports_nothing_heavy(tmp_path):
    loaded = fresh_python(f"import sys; print([m for m in {HEAVY!r} + ('kinfolk',) if m in sys.modules])", tmp_path)
    assert loaded.stdout.strip() == "['kinfolk']"
    # What the startup line costs is what `import kinfolk` imports: nothing but kinfolk's own two small modules.
    timed = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], cwd=tmp_path, capture_output=True)
    lines = [re.match(r"import time:\s+\d+ \|\s+\d+ \|( +)(\S+)", line) for line in timed.stderr.decode().splitlines()]
    entries = [(len(match.group(1)), match.group(2)) for match in lines if match]
    top = next(index for index, (_, name) in enumerate(entries) if name == "kinfolk")
    inside = []
    for depth, name in reversed(entries[:top]):  # children are printed before their parent, more indented
        if depth <= entries[top][0]:
            break
        inside.append(name)
    assert inside == ["kinfolk._after_import"]


def test_peft_and_auto_peft_load_an_atlas_adapter_without_importing_kinfolk(adapter, tmp_path):
    out = tmp_path / "logits.pt"
    fresh_python(
        "import torch\n"
        "from peft import AutoPeftModelForCausalLM, PeftModel\n"
        "from transformers import AutoModelForCausalLM\n"
        f"ids = torch.tensor({INPUT_IDS})\n"
        f"loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(adapter['base'])!r}), "
        f"{str(adapter['adapter'])!r})\n"
        f"auto = AutoPeftModelForCausalLM.from_pretrained({str(adapter['adapter'])!r})\n"
        "with torch.no_grad():\n"
        f"    torch.save({{'peft': loaded(input_ids=ids).logits, 'auto': auto(input_ids=ids).logits}}, {str(out)!r})\n",
        tmp_path,
    )
    logits = torch.load(out)
    torch.testing.assert_close(logits["peft"], adapter["logits"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(logits["auto"], adapter["logits"], rtol=1e-6, atol=1e-6)


def test_the_model_card_names_kinfolk_its_version_and_how_to_load(adapter):
    card = (adapter["adapter"] / "README.md").read_text()
    metadata = card.split("---")[1]
    assert "library_name: peft" in metadata and "- kinfolk" in metadata and "- atlas" in metadata
    assert f"saved with kinfolk {kinfolk.__version__}" in card
    assert "AutoPeftModelForCausalLM.from_pretrained(" in card and "peft=" in card
    assert "### Framework versions" in card  # PEFT's own card is kept


@pytest.mark.slow
def test_plain_lm_eval_loads_an_atlas_adapter(adapter, tmp_path):
    """`lm_eval` itself (not `kinfolk eval`): it builds the model, adapter included, before importing any task."""
    command = [str(Path(sys.executable).parent / "lm_eval"), "--model", "hf"]
    command += ["--model_args", f"pretrained={adapter['base']},peft={adapter['adapter']}", "--tasks", TASK]
    command += ["--include_path", str(task_dir()), "--device", "cpu", "--batch_size", "2", "--limit", "4"]
    command += ["--log_samples", "--output_path", str(tmp_path / "results")]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    environment.pop("PYTHONPATH", None)
    finished = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    ours = log_likelihoods(cli_samples(tmp_path / "results"))
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(adapter["base"]), adapter["adapter"])
    expected = log_likelihoods(in_process(adapted, AutoTokenizer.from_pretrained(adapter["base"]))[:4])
    assert ours == pytest.approx(expected, rel=1e-5)


def test_a_failing_registration_warns_and_leaves_peft_working(tmp_path):
    """The hook runs inside every `import peft` of the environment: kinfolk's failure must not become PEFT's."""
    finished = fresh_python(
        "import sys, warnings\n"
        "sys.modules['kinfolk.plugins.atlas'] = None  # makes importing the tuner package fail\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import peft\n"
        "print(peft.PeftType.LORA.value, *[w.message for w in caught if 'kinfolk' in str(w.message)], sep='\\n')",
        tmp_path,
    )
    lora, warning = finished.stdout.splitlines()
    assert lora == "LORA" and warning.startswith("kinfolk could not register its ATLAS PEFT type (ModuleNotFound")
