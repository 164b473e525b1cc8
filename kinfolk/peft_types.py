"""Registering kinfolk's tuner types with PEFT, whose `PeftType` enum is closed.

`peft.utils.register_peft_method` refuses a name that is not already a `PeftType` member, and Python enums take
no new members after class creation. `register_tuner` adds the member first (once: importing twice, reloading a
module or registering the same classes again is a no-op) and then registers through PEFT's own function, so
PEFT's config, tuner and prefix mappings are filled exactly as for a built-in method.

>>> from peft.utils import PeftType
>>> import kinfolk
>>> PeftType("ATLAS").value
'ATLAS'
"""

from __future__ import annotations

from peft.utils import PeftType, register_peft_method


def extend_peft_type(name: str) -> PeftType:
    """The `PeftType` member `name` (upper case), added to the enum if PEFT does not define it."""
    if name in PeftType.__members__:
        return PeftType[name]
    member = str.__new__(PeftType, name)
    member._name_ = name
    member._value_ = name
    member.__objclass__ = PeftType
    member._sort_order_ = len(PeftType._member_names_)
    PeftType._member_names_.append(name)
    PeftType._member_map_[name] = member
    PeftType._value2member_map_[name] = member
    # EnumType.__setattr__ refuses to rebind members; the new name is not one yet, type.__setattr__ is plain.
    type.__setattr__(PeftType, name, member)
    return member


def register_tuner(name: str, config_cls: type, model_cls: type, prefix: str | None = None) -> PeftType:
    """Register a tuner type with PEFT, idempotently; `name` is lower case as PEFT requires.

    Registering a different config class under a name PEFT already maps raises, naming both classes.
    """
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING

    peft_type = extend_peft_type(name.upper())
    existing = PEFT_TYPE_TO_CONFIG_MAPPING.get(peft_type)
    if existing is not None:
        if _same_class(existing, config_cls):
            # Same import path: a reloaded module's classes replace the stale ones.
            PEFT_TYPE_TO_CONFIG_MAPPING[peft_type] = config_cls
            PEFT_TYPE_TO_TUNER_MAPPING[peft_type] = model_cls
            return peft_type
        raise KeyError(
            f"PEFT type {peft_type.value!r} is already registered to {existing.__module__}.{existing.__qualname__}; "
            f"cannot register {config_cls.__module__}.{config_cls.__qualname__} under the same name"
        )
    register_peft_method(name=name, config_cls=config_cls, model_cls=model_cls, prefix=prefix)
    return peft_type


def _same_class(a: type, b: type) -> bool:
    return a is b or (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)
