"""Shared by the ADAPT tests: an init-student merge, a stand-in for its distilled student and a patched family."""

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


def patched_family(teacher, root):
    """Every size of `teacher`'s patched family under root/family: a student of every second layer patched back to
    front (a 4-layer teacher gives k0 = 2 layers, k1 = 3, k2 = the teacher), with family.json."""
    student = init_student(teacher, root / "student", every=2)
    config = {"op": "patch", "teacher": str(teacher), "student": str(student), "order": "back-to-front"}
    return merge(config, root / "family", all_sizes=True, progress=False)
