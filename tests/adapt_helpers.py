"""Shared by the ADAPT tests: an init-student merge and a stand-in for its distilled student."""

from transformers import AutoModelForCausalLM

from kinfolk.plugins.adapt import LayerMap, merge
from kinfolk.testing import perturbed_copy, save_model


def init_student(teacher, out, **layers):
    return merge({"op": "init-student", "teacher": str(teacher), "layers": layers}, out, progress=False)


def distilled_copy(student_dir, out, tokenizer, seed=7, dtype=None, scale=0.02):
    """A stand-in for a distilled student: the init with seeded noise on every weight, its layer map kept."""
    model = perturbed_copy(AutoModelForCausalLM.from_pretrained(student_dir), scale=scale, seed=seed)
    if dtype is not None:
        model = model.to(dtype)
    save_model(model, tokenizer, out)
    LayerMap.load(student_dir).save(out)
    return out
