"""adapt-controls: the base student's corpus shares no prompt with any variant's post-training rows (while version
1's was large_instruct's own), one micro family through the protocol's runner (choices and endpoints recomputed by
hand from the record)."""

from pathlib import Path

import numpy as np
import pytest
from lab_helpers import MICRO_ADAPT, run_micro

from kinfolk.lab.experiments.adapt_controls.experiment import AdaptControls
from kinfolk.lab.experiments.adapt_controls.settings import ControlsSettings
from kinfolk.lab.methods.adapt.base_corpus import (
    BASE_CORPUS_OFFSET,
    base_sft_corpus,
    variant_post_training_prompts,
)
from kinfolk.lab.methods.adapt.settings import adapt_family_config
from kinfolk.lab.protocol.views import SelectionView
from kinfolk.lab.world import corpus
from kinfolk.lab.world.family import Family


def _unbuilt_family(seed: int) -> Family:
    """A family's data streams without its models (they depend on the config alone)."""
    return Family(Path("unbuilt"), adapt_family_config(seed), {}, [], {})


def test_base_corpus_shares_no_prompt_with_any_variants_post_training_rows():
    family = _unbuilt_family(0)
    rows = family.config.batch_size * family.config.post_train_steps
    variant_rows = {fmt: family.instruct_data(rows, fmt)["prompt"] for fmt in (0, 2)}  # large_instruct, bracket
    taken = set(variant_rows[0]) | set(variant_rows[2])
    assert variant_post_training_prompts(family) == taken
    n = 2400  # the 150-step base student's SFT rows (half the steps on SFT, 32 rows each)
    chosen = base_sft_corpus(family, n)
    assert len(chosen) == n and not set(chosen["prompt"]) & taken
    # the raw stream does collide (so the filter is what keeps them apart), and the corpus is that stream without
    # the colliding rows, in order
    raw = corpus.ideal_dataset(family.config.post_trained_skills, 2 * n, BASE_CORPUS_OFFSET, 0)
    colliding = [p in taken for p in raw["prompt"]]
    assert sum(colliding) > 0
    assert chosen["prompt"] == [p for p, hit in zip(raw["prompt"], colliding) if not hit][:n]
    # version 1's base corpus was large_instruct's own rows
    assert family.instruct_data(n)["prompt"] == variant_rows[0][:n]


def micro_settings(tmp_path: Path) -> ControlsSettings:
    return ControlsSettings(
        families=[0], runs=1, layers="{every: 2, last: 1}", steps=2, batch_size=4, eval_problems=4, validation_problems=4, kl_examples=8,
        routing_problems=3, work=str(tmp_path / "work"), records=str(tmp_path / "records"),
        family_overrides=MICRO_ADAPT,
    )  # fmt: skip


@pytest.fixture(scope="module")
def micro_run(lab_cache_dir, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("adapt-controls")
    experiment = AdaptControls(micro_settings(tmp_path))
    record, results = run_micro(experiment, lab_cache_dir, tmp_path)
    return experiment, record, results


def test_micro_run_measures_every_method_and_keeps_the_corpora_apart(micro_run):
    _, record, _ = micro_run
    assert set(record["curves"]["large_instruct"]) == {"distilled", "weight-delta", "cross-patch",
                                                       "weight-delta-circular"}  # fmt: skip
    for variant, methods in record["curves"].items():
        for method, orders in methods.items():
            for order, sizes in orders.items():
                assert [s["k"] for s in sizes] == [0, 1, 2, 3], (variant, method, order)  # 4-layer teacher: 0, 2, 3
                assert sizes[-1]["test"]["kl"] == pytest.approx(0.0, abs=1e-6)  # k = M is the variant itself
                for size in sizes:
                    skills = size["test"]["skills"]
                    assert size["test"]["accuracy"] == pytest.approx(np.mean([skills[s] for s in skills]))
    shares = record["corpus"]["shared_prompts"]
    assert shares["large_instruct"]["disjoint"] == shares["large_bracket"]["disjoint"] == 0.0
    assert shares["large_instruct"]["circular"] == 1.0  # version 1's corpus: large_instruct's own rows


def test_micro_run_choices_and_endpoints_recomputed_by_hand(micro_run):
    experiment, record, results = micro_run
    selection = experiment.select(SelectionView(record))
    for variant, methods in record["curves"].items():
        for method, curve in methods.items():
            for k, order in enumerate(selection["orders"][variant][method]):
                other = "front-to-back" if order == "back-to-front" else "back-to-front"
                mine, theirs = curve[order][k]["validation"], curve[other][k]["validation"]
                assert mine > theirs or (mine == theirs and order == "back-to-front")
    values = experiment.analyse(record, selection)

    def chosen(variant, method):
        orders = selection["orders"][variant][method]
        return [record["curves"][variant][method][o][k] for k, o in enumerate(orders)][:-1]

    for variant in ("large_instruct", "large_bracket"):
        ours = np.mean([s["test"]["accuracy"] for s in chosen(variant, "weight-delta")])
        theirs = np.mean([s["test"]["accuracy"] for s in chosen(variant, "cross-patch")])
        assert values[f"transfer/{variant}: weight-delta - cross-patch"].value == pytest.approx(ours - theirs)

    def concordance_by_hand(sizes):
        pairs = [(a, b) for i, a in enumerate(sizes) for b in sizes[i + 1 :] if a["layers"] != b["layers"]]
        scores = []
        for a, b in pairs:
            deep, shallow = (a, b) if a["layers"] > b["layers"] else (b, a)
            d, s = deep["test"]["accuracy"], shallow["test"]["accuracy"]
            scores.append(1.0 if d > s else 0.5 if d == s else 0.0)
        return np.mean(scores) if scores else None

    by_hand = [concordance_by_hand(chosen(v, "distilled")) for v in ("large_instruct", "large_bracket")]
    value = values["interpolation: accuracy concordance with depth"].value
    assert (value is None) if None in by_hand else value == pytest.approx(np.mean(by_hand))
    for method in ("distilled", "weight-delta"):
        routing = record["routing"][method]
        index = selection["routing"][method]
        routed = routing["test"]["routed"][index]
        affordable = [f["accuracy"] for f in routing["test"]["fixed"].values() if f["cost"] <= routed["cost"] + 1e-9]
        got = values[f"routing/{method}: routed - best fixed at no more cost"].value
        assert got == (pytest.approx(routed["accuracy"] - max(affordable)) if affordable else None)
    primaries = {name for name, e in results["endpoints"].items() if e["primary"]}
    assert primaries == {p.name for p in experiment.primaries()} and len(primaries) == 6
