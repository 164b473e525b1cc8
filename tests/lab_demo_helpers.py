"""Shared by the demo tests: the parts of a demo's results.json that the headline reads."""


def demo_results() -> dict:
    """One family, one run of each method, with round numbers (the headline's per-run part)."""
    scores = {"reverse": {"accuracy": 0.9, "answer_accuracy": 0.9}, "copy": {"accuracy": 1.0, "answer_accuracy": 1.0},
              "flip": {"accuracy": 0.1, "answer_accuracy": 0.2}}  # fmt: skip
    run = {"test": {"mean": 0.62}, "validation": {"mean": 0.6}, "ess_fraction": 1.0}
    training = {"uniform": run, "oracle": {**run, "test": {"mean": 0.9}}, "ratio": {**run, "test": {"mean": 0.95}},
                "ratio-permuted": {**run, "test": {"mean": 0.66}}}  # fmt: skip
    size = {"test": {"mean": 0.8}}
    curves = {m: {"chosen": [size, size]} for m in ("distilled", "weight-delta", "cross-patch")}
    routed = {"average": [{"gain_over_hull": 0.1}, {"gain_over_hull": -0.05}, {"gain_over_hull": None}]}
    return {
        "skills": {"retained": "copy", "target": "reverse", "held_out": "flip"},
        "atlantis": {
            "cell": "pr",
            "settings": {"formulas": ["ratio"]},
            "run": {"cells": {"pr": {"training": training}}},
        },
        "atlas": {
            "scores": {"lora": scores, "atlas": scores},
            "retained_kl": {"lora": [[0, 0.0], [10, 0.02]], "atlas": [[0, 0.0], [10, 0.001]]},
            "analysis": {"undefined": "LoRA did not rise"},
        },
        "adapt": {
            "transfer": {"large_instruct": {"curves": curves}, "large_bracket": {"curves": curves}},
            "routing": {"distilled": {"routed": routed}, "weight-delta": {"routed": routed}},
        },
    }
