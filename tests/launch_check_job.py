"""Builds a WeightedSFTTrainer on the tiny model and prints the world size it got; run under `accelerate launch`."""

import os

from sft_helpers import weighted_data, weighted_trainer

from kinfolk.process_group import end_training
from kinfolk.testing import build_tokenizer

if __name__ == "__main__":
    trainer = weighted_trainer(build_tokenizer(), weighted_data(4), os.environ["JOB_OUTPUT_DIR"])
    print(f"world size {trainer.args.world_size}", flush=True)
    end_training(trainer)  # every rank waits, then gloo is torn down (kinfolk.process_group)
