"""The bad-input matrix of the commands that read lm-eval's tasks and outputs: `kinfolk eval` refuses bad models,
adapters, tasks and paths before lm-eval builds a model, and `kinfolk churn` refuses bad samples files naming them.
Each case asserts exit 2, one line on stderr naming the culprit, no traceback, nothing at the destination and the
inputs untouched (`refusal_helpers.assert_command_refused`); the other commands' cases are in
`test_bad_inputs_commands.py`.
"""

import json
import shutil

import pytest
import torch
from refusal_helpers import assert_command_refused, write_lines

# --- eval ----------------------------------------------------------------------------------------------------------

EVAL_TASK = "kinfolk_csqa_sample"


@pytest.fixture(scope="module")
def eval_inputs(tiny_kit, tmp_path_factory):
    """The tiny Llama, a saved ATLAS adapter and a LoRA adapter on it, copies of the ATLAS adapter with an edited `r`
    and a broken adapter_config.json, a model directory with a broken config.json, and a wider Llama (whose modules
    the adapters do not fit)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from kinfolk.plugins.atlas import AtlasConfig

    root = tmp_path_factory.mktemp("eval-cli")
    base = tiny_kit.model_dir("llama")
    torch.manual_seed(0)
    config = AtlasConfig(r=4, residual="plain", target_modules=["o_proj"], init_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), config).save_pretrained(root / "atlas")
    lora = LoraConfig(r=4, target_modules=["o_proj", "gate_proj"])
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora).save_pretrained(root / "lora")
    edited = shutil.copytree(root / "atlas", root / "atlas-r-edited")
    values = json.loads((edited / "adapter_config.json").read_text())
    (edited / "adapter_config.json").write_text(json.dumps({**values, "r": 8}))
    broken = shutil.copytree(root / "atlas", root / "atlas-broken-config")
    (broken / "adapter_config.json").write_text('{"peft_type": ')
    broken_model = shutil.copytree(base, root / "model-broken-config")
    (broken_model / "config.json").write_text("{")
    (root / "a-file").write_text("")
    return {"base": base, "root": root, "wider": tiny_kit.model_dir("llama", "large")}


EVAL_CASES = {
    "model missing": (
        "pretrained={root}/no-such-model",
        [],
        ["pretrained= model", "no-such-model", "no such directory"],
    ),
    "model is a file": ("pretrained={root}/a-file", [], ["a-file is a file"]),
    "model's config.json broken": ("pretrained={root}/model-broken-config", [], ["config.json", "not valid JSON"]),
    "adapter missing": ("pretrained={base},peft={root}/no-such-adapter", [], ["peft=", "no such adapter directory"]),
    "adapter is a file": ("pretrained={base},peft={root}/a-file", [], ["a-file is a file"]),
    "adapter's r edited": ("pretrained={base},peft={root}/atlas-r-edited", [], ["r=8", "r=4", "edited after saving"]),
    "adapter config broken": (
        "pretrained={base},peft={root}/atlas-broken-config",
        [],
        ["atlas-broken-config/adapter_config.json", "not valid JSON"],
    ),
    # the small Llama's o_proj is 32 × 32 and its gate_proj 64 × 32; the wider one's 64 × 64 and 128 × 64
    "ATLAS adapter made on another model": (
        "pretrained={wider},peft={root}/atlas",
        [],
        [
            "the peft= adapter",
            "/atlas was made for another model than",
            "atlas_A is (4, 32)",
            "o_proj.weight is (64, 64)",
        ],
    ),
    "LoRA adapter made on another model": (
        "pretrained={wider},peft={root}/lora",
        [],
        ["/lora was made for another model", "gate_proj.lora_A.weight is (4, 32)", "gate_proj.weight is (128, 64)"],
    ),
    "task not found": ("pretrained={base}", ["--tasks", "kinfolk_no_such_task"], ["Tasks not found: kinfolk_no_such"]),
    "no tasks": ("pretrained={base}", ["--tasks", ""], ["no --tasks given"]),
    "samples without an output path": ("pretrained={base}", ["--log_samples"], ["Specify --output_path"]),
    "output path under a file": (
        "pretrained={base}",
        ["--output_path", "{root}/a-file/results"],
        ["a-file is a file"],
    ),
    "include path missing": ("pretrained={base}", ["--include_path", "{root}/no-tasks"], ["no-tasks: no such folder"]),
}


@pytest.mark.parametrize("case", list(EVAL_CASES))
def test_eval_refuses_bad_models_adapters_tasks_and_paths_before_loading(eval_inputs, monkeypatch, case):
    """Every refusal comes before lm-eval builds the model (which would fail the test here)."""
    import lm_eval.evaluator

    def refuse(*args, **kwargs):
        raise AssertionError("lm-eval started evaluating before the bad input was found")

    # `lm_eval.simple_evaluate` is loaded lazily from `lm_eval.evaluator`: patched second, monkeypatch would keep
    # `refuse` as the value to restore, and later tests of this worker would call it.
    monkeypatch.setattr("lm_eval.simple_evaluate", refuse)
    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", refuse)
    model_args, options, named = EVAL_CASES[case]
    paths = {"root": eval_inputs["root"], "base": eval_inputs["base"], "wider": eval_inputs["wider"]}
    options = [option.format(**paths) for option in options]
    if "--tasks" not in options:
        options += ["--tasks", EVAL_TASK]
    model_args = model_args.format(**paths)
    assert_command_refused(
        ["eval", "--model", "hf", "--model_args", model_args, "--device", "cpu", "--skip_default_tasks", *options],
        *named,
        inputs=[eval_inputs["root"]],
    )


# --- churn ---------------------------------------------------------------------------------------------------------


def sample(doc_id, answer, correct, **fields):
    return {"doc_id": doc_id, "doc_hash": f"h{doc_id}", "filtered_resps": [answer], "filter": "none",
            "metrics": ["exact_match"], "exact_match": float(correct), **fields}  # fmt: skip


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    """lm-eval samples files: a frozen and an adapted run of four questions, and broken variants."""
    root = tmp_path_factory.mktemp("churn-cli")

    def lines(name, records):
        return write_lines(root / name, [json.dumps(record) + "\n" for record in records])

    frozen = [sample(i, str(i), i < 2) for i in range(4)]
    lines("frozen.jsonl", frozen)
    lines("adapted.jsonl", [sample(i, "x", i == 3) for i in range(4)])
    lines("other-questions.jsonl", [sample(i + 10, "x", True) for i in range(4)])
    lines("two-filters.jsonl", frozen + [{**record, "filter": "strict"} for record in frozen])
    lines(
        "no-metric.jsonl", [{key: value for key, value in record.items() if key != "exact_match"} for record in frozen]
    )
    lines("text-metric.jsonl", [{**record, "exact_match": "yes"} for record in frozen])
    lines("not-samples.jsonl", [{"question": "q", "answer": "a"}])
    (root / "empty.jsonl").write_text("")
    write_lines(root / "broken.jsonl", [json.dumps(frozen[0]) + "\n", '{"doc_id": 1,\n'])
    write_lines(root / "a-list.jsonl", [json.dumps(frozen[0]) + "\n", "[1, 2]\n"])
    (root / "a-file").write_text("")
    (root / "results_2026.json").write_text(json.dumps({"results": {"gsm8k": {"acc": 0.5}}, "configs": {}}, indent=2))
    (root / "pretty.json").write_text(json.dumps(frozen[0], indent=2))
    return root


CHURN_CASES = {
    "frozen file missing": (["missing.jsonl", "adapted.jsonl"], [], ["missing.jsonl: no such samples file"]),
    "empty file": (["frozen.jsonl", "empty.jsonl"], [], ["empty.jsonl holds no sample records"]),
    "broken JSON line": (["frozen.jsonl", "broken.jsonl"], [], ["broken.jsonl:2 is not JSON"]),
    "an lm-eval results file": (
        ["results_2026.json", "adapted.jsonl"],
        [],
        ["results_2026.json is an lm-eval results file", "not a samples log", "samples_<task>_*.jsonl"],
    ),
    "one pretty-printed JSON record": (
        ["pretty.json", "adapted.jsonl"],
        [],
        ["pretty.json is one JSON document, not a samples file of JSON lines (a samples record"],
    ),
    "a line that is not a record": (["a-list.jsonl", "adapted.jsonl"], [], ["a-list.jsonl:2 is not a samples record"]),
    "not lm-eval samples": (["frozen.jsonl", "not-samples.jsonl"], [], ["not-samples.jsonl", "'filtered_resps'"]),
    "metric missing": (["frozen.jsonl", "no-metric.jsonl"], [], ["no-metric.jsonl", "has no metric 'exact_match'"]),
    "metric not a number": (["frozen.jsonl", "text-metric.jsonl"], [], ["text-metric.jsonl", "'yes', not a number"]),
    "unknown metric": (["frozen.jsonl", "adapted.jsonl"], ["--metric", "acc"], ["frozen.jsonl", "no metric 'acc'"]),
    "several filters": (
        ["two-filters.jsonl", "adapted.jsonl"],
        [],
        ["two-filters.jsonl", "several filters", "with --filter"],
    ),
    "unknown filter": (["frozen.jsonl", "adapted.jsonl"], ["--filter", "strict"], ["filter 'strict' not in"]),
    "other questions": (
        ["frozen.jsonl", "adapted.jsonl", "other-questions.jsonl"],
        [],
        ["other-questions.jsonl does not cover the same questions as", "frozen.jsonl"],
    ),
    "no resamples": (["frozen.jsonl", "adapted.jsonl"], ["--bootstrap", "0"], ["--bootstrap must be at least 1"]),
    "out under a file": (["frozen.jsonl", "adapted.jsonl"], ["--out", "a-file/churn.json"], ["a-file is a file"]),
    "out exists": (["frozen.jsonl", "adapted.jsonl"], ["--out", "frozen.jsonl"], ["frozen.jsonl already exists"]),
}


@pytest.mark.parametrize("case", list(CHURN_CASES))
def test_churn_refuses_bad_sample_files_naming_them(samples, tmp_path, case):
    files, options, named = CHURN_CASES[case]
    options = [str(samples / option) if option.endswith((".json", ".jsonl")) else option for option in options]
    out = tmp_path / "churn.json"
    assert_command_refused(
        ["churn", *(samples / name for name in files), *options, *([] if "--out" in options else ["--out", out])],
        *named,
        destination=out,
        inputs=[samples],
    )
