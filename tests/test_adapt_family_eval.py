"""Sizes to routing in one path (issue 38): `kinfolk eval --family` runs held-out perplexity or an lm-eval task on
every size of a tiny patched family and writes the outcomes file, whose numbers match forward passes computed here,
and `kinfolk route` reads it; bad input is refused in one line naming it."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.commands import main
from kinfolk.errors import DatasetFormatError
from kinfolk.plugins.adapt.family_eval import Size, example_levels, sample_outcomes, split_examples

SIZES = ["k0", "k1", "k2"]
WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "far", "away", "from", "home", "and", "back")


@pytest.fixture(scope="module")
def family(tiny_kit, tmp_path_factory):
    from adapt_helpers import patched_family

    return patched_family(tiny_kit.model_dir("llama", "large"), tmp_path_factory.mktemp("family-eval"))


def _words(seed: int, count: int) -> str:
    return " ".join(WORDS[(seed * 7 + 3 * i) % len(WORDS)] for i in range(count))


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_layout(rows, examples, levels):
    """One row per (example, size); one split per example; every level in both splits."""
    assert sorted((row["id"], row["model"]) for row in rows) == sorted((e, s) for e in examples for s in SIZES)
    split_of = {}
    for row in rows:
        assert split_of.setdefault(row["id"], row["split"]) == row["split"]
    for level in set(levels.values()):
        assert {split_of[e] for e in examples if levels[e] == level} == {"calibration", "test"}
    assert split_of == split_examples(levels)  # the default share and seed


def _route(outcomes, family, out, rows):
    """`kinfolk route` on the file: each fixed size's test accuracy is the mean of its test rows' `correct`."""
    assert main(["route", "--outcomes", str(outcomes), "--models_dir", str(family), "--out", str(out)]) == 0
    written = json.loads((out / "routing.json").read_text())
    for size in SIZES:
        scores = [row["correct"] for row in rows if row["model"] == size and row["split"] == "test"]
        assert written["fixed"][size]["accuracy"] == pytest.approx(sum(scores) / len(scores))
    return written


def test_heldout_perplexity_over_every_size_feeds_route(family, tmp_path, capsys):
    data = tmp_path / "heldout.jsonl"
    texts = {str(i): _words(i, 3 + 4 * (i % 3)) for i in range(1, 13)}  # no `id` column: rows are numbered from 1
    levels = {str(i): 1 + i % 3 for i in range(1, 13)}
    data.write_text("".join(json.dumps({"text": texts[i], "level": levels[i]}) + "\n" for i in texts))
    outcomes = tmp_path / "outcomes.jsonl"
    argv = ["eval", "--family", family, "--outcomes", outcomes, "--heldout", data, "--device", "cpu", "-b", "5"]
    assert main([str(a) for a in argv]) == 0
    rows = _read(outcomes)
    _check_layout(rows, list(texts), levels)
    for size in SIZES:  # the NLL of the text and its EOS, from transformers' own loss
        tokenizer = AutoTokenizer.from_pretrained(family / size)
        model = AutoModelForCausalLM.from_pretrained(family / size).eval()
        for row in (row for row in rows if row["model"] == size):
            ids = tokenizer(texts[row["id"]] + tokenizer.eos_token, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                mean_nll = float(model(input_ids=ids, labels=ids).loss)
            scored = ids.shape[1] - 1
            assert (row["tokens"], row["scored_tokens"], row["level"]) == (ids.shape[1], scored, levels[row["id"]])
            assert row["nll"] == pytest.approx(mean_nll * scored, rel=1e-4)
            assert row["correct"] == pytest.approx(math.exp(-mean_nll), rel=1e-4)
            assert row["prompt"] == texts[row["id"]]
    eval_printed = capsys.readouterr()
    assert f"{data}: plain rows, scored as written without a chat template" in eval_printed.err
    (next_line,) = [line for line in eval_printed.err.splitlines() if "; next: kinfolk route" in line]
    assert next_line.endswith("--score loss")  # the next command routes on the loss
    _route(outcomes, family, tmp_path / "routing", rows)
    assert "--score loss" in capsys.readouterr().err  # route on `correct` suggests the loss

    # routed on the loss: each fixed size's point is its mean test loss per token, printed apart from the others
    argv = ["route", "--outcomes", str(outcomes), "--models_dir", str(family), "--out", str(tmp_path / "by-loss"),
            "--score", "loss"]  # fmt: skip
    assert main(argv) == 0
    written = json.loads((tmp_path / "by-loss" / "routing.json").read_text())
    printed = capsys.readouterr().out
    losses = {}
    for size in SIZES:
        test_rows = [row for row in rows if row["model"] == size and row["split"] == "test"]
        losses[size] = sum(row["nll"] / row["scored_tokens"] for row in test_rows) / len(test_rows)
        assert -written["fixed"][size]["accuracy"] == pytest.approx(losses[size])
    assert written["score"] == "loss" and len({round(v, 6) for v in losses.values()}) == len(SIZES)
    lines = {line.split(" | ")[2]: line.split(" | ")[3] for line in printed.splitlines() if "| fixed |" in line}
    assert len(set(lines.values())) == len(SIZES)  # three distinct printed losses
    for size, text in lines.items():
        assert float(text) == pytest.approx(losses[size], rel=1e-2)


def test_chat_rows_without_levels_carry_the_prompt_the_rater_reads(family, tmp_path, capsys):
    # the eval's next: line for rows without levels says --difficulty rating, which reads each row's `prompt`
    data, outcomes = tmp_path / "chat.jsonl", tmp_path / "outcomes.jsonl"
    asks = {str(i): f"say {_words(i, 2)}" for i in range(1, 9)}
    chats = [
        [{"role": "user", "content": ask}, {"role": "assistant", "content": _words(int(i), 4)}]
        for i, ask in asks.items()
    ]
    data.write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in chats))
    argv = ["eval", "--family", family, "--outcomes", outcomes, "--heldout", data, "--device", "cpu"]
    assert main([str(a) for a in argv]) == 0
    rows = _read(outcomes)
    assert {row["id"]: row["prompt"] for row in rows} == asks and all(row.get("level") is None for row in rows)
    (next_line,) = [line for line in capsys.readouterr().err.splitlines() if "; next: kinfolk route" in line]
    assert "--difficulty rating --rater MODEL" in next_line
    # routed by labels it has none of, route says which option rates the prompts instead
    assert (
        main([str(a) for a in ["route", "--outcomes", outcomes, "--models_dir", family, "--out", tmp_path / "x"]]) == 2
    )
    assert (
        "row 1 has no level (the difficulty label); to rate each prompt instead pass --difficulty rating --rater MODEL"
        in (capsys.readouterr().err)
    )
    argv = ["route", "--outcomes", outcomes, "--models_dir", family, "--out", tmp_path / "routing", "--score", "loss",
            "--difficulty", "rating", "--rater", family / "k0"]  # fmt: skip
    assert main([str(a) for a in argv]) == 0
    written = json.loads((tmp_path / "routing" / "routing.json").read_text())
    for size in SIZES:
        test_rows = [row for row in rows if row["model"] == size and row["split"] == "test"]
        loss = sum(row["nll"] / row["scored_tokens"] for row in test_rows) / len(test_rows)
        assert -written["fixed"][size]["accuracy"] == pytest.approx(loss)


TASK_YAML = """task: levelled_choice
dataset_path: json
dataset_kwargs:
  data_files: {data}
test_split: train
output_type: multiple_choice
doc_to_text: "{{{{question}}}}:"
doc_to_target: label
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def _levelled_task(folder, docs):
    folder.mkdir()
    (folder / "docs.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    (folder / "levelled_choice.yaml").write_text(TASK_YAML.format(data=folder / "docs.jsonl"))
    return folder


def _choice_log_likelihood(model, tokenizer, context, continuation):
    """log p(continuation | context), tokenised as lm-eval's hf model does (the pair as one string, no BOS)."""
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    start = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=torch.tensor([whole])).logits[0].float(), dim=-1)
    return sum(float(log_probs[position - 1, whole[position]]) for position in range(start, len(whole)))


def test_an_lm_eval_task_over_every_size_feeds_route(family, tmp_path):
    docs = [
        {"question": _words(i, 4), "choices": [WORDS[i % 5], WORDS[5 + i % 7]], "label": i % 2, "level": 1 + i % 2}
        for i in range(12)
    ]
    task = _levelled_task(tmp_path / "task", docs)
    outcomes = tmp_path / "outcomes.jsonl"
    argv = ["eval", "--family", family, "--outcomes", outcomes, "--tasks", "levelled_choice", "--include_path", task,
            "--device", "cpu", "--skip_default_tasks"]  # fmt: skip
    assert main([str(a) for a in argv]) == 0
    rows = _read(outcomes)
    examples = {f"levelled_choice/{i}": doc for i, doc in enumerate(docs)}
    _check_layout(rows, list(examples), {e: doc["level"] for e, doc in examples.items()})
    for size in SIZES:  # acc: the option of the highest log-likelihood is the labelled one
        tokenizer = AutoTokenizer.from_pretrained(family / size)
        model = AutoModelForCausalLM.from_pretrained(family / size).eval()
        for row in (row for row in rows if row["model"] == size):
            doc = examples[row["id"]]
            context = f"{doc['question']}:"
            scores = [_choice_log_likelihood(model, tokenizer, context, f" {c}") for c in doc["choices"]]
            assert row["correct"] == float(max(range(2), key=scores.__getitem__) == doc["label"]), row
            ran = [tokenizer(f"{context} {c}", add_special_tokens=False)["input_ids"] for c in doc["choices"]]
            assert row["tokens"] == sum(map(len, ran))
            assert (row["prompt"], row["level"]) == (context, doc["level"])
    written = _route(outcomes, family, tmp_path / "routing", rows)
    assert all(p["hull_accuracy"] is not None or p["gain_over_hull"] is None for p in written["routed"]["average"])


def _record(doc_id, arguments, resps, filter_name="none", **metrics):
    """A sample record as lm-eval saves it with --log_samples."""
    saved = {f"gen_args_{i}": {f"arg_{j}": a for j, a in enumerate(args)} for i, args in enumerate(arguments)}
    return {"doc_id": doc_id, "doc": {"level": doc_id % 2}, "arguments": saved, "resps": resps,
            "filter": filter_name, "metrics": list(metrics), **metrics}  # fmt: skip


def test_sample_records_count_what_each_request_ran(family):
    generation = _record(0, [("rev ab=", {"until": ["\n"]})], [["ba"]], exact_match=1.0)
    choice = _record(1, [("Q: sky?", " blue"), ("Q: sky?", " green")], [[["-1.5", "False"]], [["-2.5", "False"]]],
                     acc=0.0, acc_norm=1.0)  # fmt: skip
    rolling = _record(2, [("a whole text",)], [[["-9.0"]]], score=0.25)
    outcomes = sample_outcomes(Size("k0", family / "k0"), {"mixed": [generation, choice, rolling]})
    tokenizer = AutoTokenizer.from_pretrained(family / "k0")

    def count(*texts):
        return sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts)

    # context + generated answer; context + continuation of every option; the text alone. Each task's first metric.
    assert [(o.id, o.correct, o.tokens, o.prompt, o.level) for o in outcomes] == [
        ("mixed/0", 1.0, count("rev ab=ba"), "rev ab=", 0),
        ("mixed/1", 0.0, count("Q: sky? blue", "Q: sky? green"), "Q: sky?", 1),
        ("mixed/2", 0.25, count("a whole text"), "a whole text", 0),
    ]
    chosen = sample_outcomes(Size("k0", family / "k0"), {"mixed": [choice]}, metric="acc_norm")
    assert chosen[0].correct == 1.0
    filtered = [_record(0, [("x", {})], [["y"]], "strict", exact_match=0.0),
                _record(0, [("x", {})], [["y"]], "flexible", exact_match=1.0)]  # fmt: skip
    with pytest.raises(ValueError, match=r"filters \['flexible', 'strict'\]; choose one with --outcome_filter"):
        sample_outcomes(Size("k0", family / "k0"), {"gsm": filtered})
    assert sample_outcomes(Size("k0", family / "k0"), {"gsm": filtered}, filter_name="flexible")[0].correct == 1.0
    with pytest.raises(ValueError, match="metric 'score' is 'nan-ish', not a number"):
        sample_outcomes(Size("k0", family / "k0"), {"t": [_record(0, [("x",)], [[]], score="nan-ish")]})


def test_levels_are_all_or_nothing():
    docs = [{"level": 1}, {"level": 2}]
    assert example_levels(docs, None, ["a", "b"]) == [1, 2]
    assert example_levels([{}, {}], None, ["a", "b"]) == [None, None]  # route rates the prompts instead
    with pytest.raises(DatasetFormatError, match=r"^b has no 'level'"):
        example_levels([{"level": 1}, {}], None, ["a", "b"])
    with pytest.raises(DatasetFormatError, match=r"^a has no 'difficulty'"):
        example_levels(docs, "difficulty", ["a", "b"])


def _broken_family(family, tmp_path):
    """k0 and k1 of the family, and a size folder without config.json (no family.json: every folder is a size)."""
    folder = tmp_path / "broken-family"
    folder.mkdir()
    for size in ("k0", "k1"):
        (folder / size).symlink_to(family / size)
    (folder / "k9").mkdir()
    (folder / "k9" / "model.safetensors").write_bytes(b"")
    return folder


def test_bad_input_is_refused_in_one_line_naming_it(family, tmp_path):
    from refusal_helpers import assert_command_refused

    data = tmp_path / "heldout.jsonl"
    data.write_text(json.dumps({"prompt": "a b", "completion": "c"}) + "\n" + json.dumps({"prompt": "d e"}) + "\n")
    columns = tmp_path / "columns.jsonl"
    columns.write_text(json.dumps({"question": "a b"}) + "\n")
    levels = tmp_path / "levels.jsonl"
    levels.write_text(json.dumps({"text": "a b", "difficulty": 1}) + "\n" + json.dumps({"text": "c d"}) + "\n")
    out = tmp_path / "outcomes.jsonl"
    common = ["eval", "--family", family, "--outcomes", out]
    cases = [
        (["eval", "--family", _broken_family(family, tmp_path), "--outcomes", out, "--heldout", data],
         ["k9", "has no config.json"]),
        ([*common, "--heldout", data], [data, "row 2 has no 'completion'"]),
        ([*common, "--heldout", columns], [columns, "'text'", "columns present: ['question']"]),
        ([*common, "--heldout", levels, "--level_field", "difficulty"], [levels, "row 2 has no 'difficulty'"]),
        ([*common, "--heldout", data, "--tasks", "levelled_choice"], ["--tasks levelled_choice", "--heldout"]),
        (["eval", "--family", family, "--heldout", data], ["--family needs --outcomes"]),
        ([*common, "--heldout", data, "--calibration_share", "1"], ["--calibration_share", "between 0 and 1"]),
        ([*common, "--heldout", data, "--outcome_metric", "acc"], ["--outcome_metric", "--heldout has none"]),
        (["eval", "--outcomes", out, "--tasks", "x"], ["--outcomes: only with --family"]),
        ([*common, "--tasks", "kinfolk_csqa_sample", "--output_path", tmp_path / "r", "--skip_default_tasks"],
         ["--output_path", "--outcomes"]),
        ([*common, "--tasks", "kinfolk_csqa_sample", "--model_args", "pretrained=x", "--skip_default_tasks"],
         ["pretrained="]),
    ]  # fmt: skip
    for argv, named in cases:
        assert_command_refused(argv, *named, destination=out, inputs=[data, columns, levels])
