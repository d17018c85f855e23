"""The one config system: typed pydantic sections loaded from YAML and ``--set a.b=c`` overrides.

Retrieval training (``training/config.py``), captioning (``training/captioning/config.py``), the
experiment grids (``app/experiment.py``) and the service settings share it: the same loader and
the same one-line error that names the key and, for a choice,
the valid values (``loss.mode='dual_loss' is not valid; choose one of: none, dual, constraint,
replay``). Choices are ``Literal`` types on the fields; simple bounds are :func:`must` validators on
the fields; checks across fields are the sections' ``model_validator``s.

A section is a plain pydantic model, so sub-configs are passed around on their own (``cfg.loss`` to
the objective, ``cfg.model`` to the builder) and compare, copy and dump as values.
"""
from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, TypeAdapter, ValidationError, field_validator

from training.errors import UserError
from training.fsio import atomic_write_text

S = TypeVar("S", bound=BaseModel)
R = TypeVar("R", bound="Section")


class ConfigError(UserError, ValueError):
    """A configuration that cannot run; the message names the key (and the valid choices)."""


class Invalid(ValueError):
    """Raised by a section's validator about one of its keys: the loader prefixes the section's path,
    so ``Invalid("lambda_init", 200.0, "must be in [0, lambda_max]")`` in ``loss`` reads
    ``loss.lambda_init=200.0 must be in [0, lambda_max]``."""

    def __init__(self, key: str, value: Any, message: str):
        super().__init__(message)
        self.key, self.value, self.message = key, value, message


class Section(BaseModel):
    """A config section: unknown keys are errors, numbers are accepted where a string is expected
    (``--set train.name=2024``), and an empty YAML value (``path:``) means "" for a string."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, protected_namespaces=())

    @field_validator("*", mode="before")
    @classmethod
    def _empty_string(cls, value: Any, info: Any) -> Any:
        if value is None and cls.model_fields[info.field_name].annotation is str:
            return ""
        return value

    def to_dict(self) -> dict:
        """Plain nested dict (what config.yaml and checkpoints store)."""
        return self.model_dump()


def must(ok: Callable[[Any], bool], message: str) -> AfterValidator:
    """A field check: ``Annotated[float, must(lambda v: v > 0, "must be > 0")]``. The error reads
    ``KEY=VALUE message``."""
    def check(value: Any) -> Any:
        if not ok(value):
            raise ValueError(message)
        return value
    return AfterValidator(check)


Positive = Annotated[float, must(lambda v: v > 0, "must be > 0")]
NonNegative = Annotated[float, must(lambda v: v >= 0, "must be >= 0")]
PositiveInt = Annotated[int, must(lambda v: v >= 1, "must be >= 1")]
NonNegativeInt = Annotated[int, must(lambda v: v >= 0, "must be >= 0")]
DropoutRate = Annotated[float, must(lambda v: 0 <= v < 1, "must be in [0, 1)")]
Fraction = Annotated[float, must(lambda v: 0 < v <= 1, "must be in (0, 1]")]


# ---- the one-line error ---------------------------------------------------------------------------

def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """" (did you mean X?)" for the closest choice, or ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _dotted(loc: Iterable[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _walk(root: type[BaseModel], loc: tuple) -> tuple[type[BaseModel] | None, Any]:
    """(the model class that holds ``loc``'s last key, that field's annotation or None)."""
    cls: Any = root
    for i, part in enumerate(loc):
        if isinstance(part, int):  # a list item: the list's element type
            args = [a for a in get_args(cls) if isinstance(a, type) and issubclass(a, BaseModel)]
            cls = args[0] if args else None
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or part not in cls.model_fields:
            return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None, None
        ann = cls.model_fields[part].annotation
        if i == len(loc) - 1:
            return cls, ann
        cls = ann
    return cls if isinstance(cls, type) else None, None


def _is_section(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _base(ann: Any) -> Any:
    """The type under ``Annotated[...]``."""
    while get_origin(ann) is Annotated:
        ann = get_args(ann)[0]
    return ann


def _choices(ann: Any) -> tuple:
    """The values of a ``Literal`` field (also inside ``Optional``/unions)."""
    ann = _base(ann)
    if get_origin(ann) is Literal:
        return get_args(ann)
    return tuple(v for a in get_args(ann) if get_origin(_base(a)) is Literal for v in get_args(_base(a)))


def _shown(value: Any, ann: Any) -> str:
    """The value as the config holds it (``0`` for a float field reads ``0.0``)."""
    try:
        return repr(TypeAdapter(_base(ann)).validate_python(value))
    except Exception:
        return repr(value)


def error_line(e: ValidationError, root: type[BaseModel]) -> str:
    """A pydantic error as the one line a user reads: the first problem, by its dotted key."""
    err = e.errors(include_url=False)[0]
    loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
    key = _dotted(loc)
    owner, ann = _walk(root, loc)
    cause = (err.get("ctx") or {}).get("error")
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    if isinstance(cause, Invalid):
        full = _dotted((*loc, cause.key))
        return f"{full}={cause.value!r} {cause.message}{more}"
    if kind == "extra_forbidden":
        known = list(owner.model_fields) if owner else []
        return (f"unknown config key {key!r}{did_you_mean(str(loc[-1]), known)}; "
                f"valid keys here: {', '.join(known)}")
    if kind == "literal_error":
        return f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, _choices(ann)))}{more}"
    if kind == "value_error" and ann is not None and not _is_section(ann):
        return f"{key}={_shown(value, ann)} {cause}{more}"
    if kind in ("value_error", "assertion_error"):
        return f"{cause}{more}"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter((err.get("ctx") or {}).values()), "?")
        return f"{key}={_shown(value, ann)} must be {bounds[kind]} {limit}{more}"
    if kind == "missing":
        return f"{key}: required{more}"
    expected = {"int": "an integer", "bool": "true/false", "float": "a number", "string": "a string",
                "model": "a mapping", "dict": "a mapping", "list": "a list"}
    what = next((v for k, v in expected.items() if kind.startswith(k)), None)
    if what:
        return f"{key or 'config'}: expected {what}, got {value!r}{more}"
    return f"{key or 'config'}: {err['msg']}{more}"


def validate_as(cls: type[S], data: Any, where: str = "") -> S:
    """``cls.model_validate(data)``, its errors raised as one-line :class:`ConfigError`s."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{where}{error_line(e, cls)}") from None


# ---- YAML, --set, presets ----------------------------------------------------------------------

def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=c`` → ("a.b", parsed YAML scalar c)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def nest(key: str, value: Any) -> dict:
    """``("a.b", 1)`` → ``{"a": {"b": 1}}``."""
    out: Any = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def merge(into: dict, new: Mapping) -> dict:
    """Deep-merge ``new`` into ``into`` (later layers win key by key)."""
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = merge({}, v) if isinstance(v, Mapping) else v
    return into


def read_yaml(path: Path) -> dict:
    """A YAML mapping from ``path`` (an empty file is {})."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections, got {type(data).__name__}")
    return data


CAPTION_PRESET_PREFIX = "caption_"  # captioner presets (training/captioning/config.py); the rest train dual encoders


def preset_path(name: str) -> Path | None:
    """A preset shipped in the ``configs`` package (``flickr8k_ltd`` → configs/flickr8k_ltd.yaml)."""
    stem = name[:-5] if name.endswith(".yaml") else name
    res = resources.files("configs") / f"{stem}.yaml"
    return Path(str(res)) if res.is_file() else None


def list_presets(kind: str = "train") -> list[str]:
    """Shipped presets: ``train`` (dual encoders) or ``caption`` (captioners)."""
    names = sorted(p.name[:-5] for p in resources.files("configs").iterdir() if p.name.endswith(".yaml"))
    return [n for n in names if n.startswith(CAPTION_PRESET_PREFIX) == (kind == "caption")]


def config_file(path: str | Path, kind: str = "train") -> Path:
    """A YAML path, or the shipped preset of that name; else a ConfigError listing the presets."""
    p = Path(path)
    if p.is_file():
        return p
    pre = preset_path(str(path))
    if pre is None:
        raise ConfigError(f"config file not found: {path}{did_you_mean(p.stem, list_presets(kind))}; "
                          f"presets: {', '.join(list_presets(kind))} (`--list-presets`)")
    return pre


def load_layers(cls: type[R], path: str | Path | None = None, overrides: Iterable[str] = (),
                base: Mapping | None = None, *, kind: str = "train") -> R:
    """Defaults ← ``base`` dict ← YAML file (path or preset name) ← ``--set`` overrides, validated as
    ``cls``."""
    data: dict = {}
    if base:
        merge(data, base)
    if path:
        merge(data, read_yaml(config_file(path, kind)))
    for ov in overrides:
        merge(data, nest(*parse_override(ov)))
    return validate_as(cls, data)


def load_saved(cls: type[R], source: str | Path | Mapping) -> R:
    """A config saved by an earlier run (a run folder, its config.yaml, or the dict a checkpoint
    holds) under today's models: keys added since take their defaults (a new option's default is, by
    rule, the old behaviour)."""
    if isinstance(source, Mapping):
        return validate_as(cls, dict(source))
    p = Path(source)
    if p.is_dir():
        p = p / "config.yaml"
    if not p.is_file():
        raise ConfigError(f"no saved config: {p} does not exist")
    return validate_as(cls, read_yaml(p), where=f"{p}: ")


def dump_config(cfg: BaseModel, path: str | Path) -> None:
    """A config → YAML (atomic), in field order."""
    atomic_write_text(path, yaml.safe_dump(cfg.model_dump(), sort_keys=False))
