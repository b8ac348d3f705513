"""A frozen recipe as data: a committed YAML file (orch.recipe/1, docs/RECIPES.md) naming each key, its value, the
trainer flag that carries it and how the probe observes it at run time. A protocol names the file and its SHA256.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from protocol.errors import RefusedError
from protocol.protocol_yaml import field_name, line_of, node_at, parse_yaml

RECIPE_SCHEMA: Final = "orch.recipe/1"
MAX_RECIPE_BYTES: Final = 1 << 16  # a recipe is a few kB
RUN_COPY: Final = "recipe.yaml"  # the recipe file's bytes in a run folder, beside protocol.json
ALLOWED_PRECISIONS: Final = ("fp32", "bf16")
FORBIDDEN_PRECISIONS: Final = ("fp16", "fp8", "int8")
# orch.protocol/1 documents name no recipe file: they were written under R3's, the first recipe file, pinned here
# (protocol/v1_recipe/ links to recipes/ in the repository; a wheel holds a copy, so an installed orch reads it too)
V1_RECIPE_PATH: Final = Path(__file__).resolve().parent / "v1_recipe" / "r3_tree_rl_bagel7b.yaml"
V1_RECIPE_SHA256: Final = "27ea00d8ce839a2cf57981cca87348d24d80e5eda3849bcfee9e591df511961e"

Value = bool | int | float | str


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObserveOptimizer(_Frozen):
    """A hyperparameter of the live optimizer's parameter group `group` (lr: the base lr, `initial_lr` under a
    scheduler); `index` picks one element of a tuple (betas: 0 is beta1, 1 is beta2)."""

    kind: Literal["optimizer"]
    field: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="param_group key: lr, betas, eps, ...")
    index: int | None = Field(None, ge=0)
    group: int = Field(0, ge=0)


class ObserveGradClip(_Frozen):
    """The max_norm the trainer passes to torch.nn.utils.clip_grad_norm_."""

    kind: Literal["grad_clip"]


class ObserveWarmup(_Frozen):
    """Warm-up steps of a linear or constant warm-up: the first step whose lr reaches the base lr."""

    kind: Literal["warmup"]


class ObserveFrozen(_Frozen):
    """While the key is true: every parameter whose name matches a pattern is frozen (requires_grad=False), and at
    least one frozen parameter matches. Patterns are Python regular expressions searched in the probe's names."""

    kind: Literal["frozen"]
    label: str = Field(min_length=1, description="what the patterns name, in messages (e.g. ViT)")
    patterns: list[str] = Field(min_length=1)

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for p in patterns:
            try:
                re.compile(p)
            except re.error as err:
                raise ValueError(f"pattern {p!r} is not a regular expression ({err})") from None
        return patterns

    def matches(self, name: str) -> bool:
        return any(re.search(p, name) for p in self.patterns)


Observation = Annotated[ObserveOptimizer | ObserveGradClip | ObserveWarmup | ObserveFrozen, Field(discriminator="kind")]
# the order in which the audit reports observed differences: optimizer, clipping, schedule, frozen parameters
OBSERVE_ORDER: Final = ("optimizer", "grad_clip", "warmup", "frozen")


class RecipeKey(_Frozen):
    value: Value
    flag: str | None = Field(None, pattern=r"^--[A-Za-z0-9][A-Za-z0-9_.-]*$",
                             description="the trainer flag that carries it (`--flag VALUE`); null: not a flag")
    observe: Observation | None = Field(None, description="how the probe observes it at run time; null: not observed")
    rehearsal: Literal["divides_ranks"] | None = Field(
        None, description="divides_ranks: a rehearsal on fewer ranks may lower it to a divisor of the ranks")
    note: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> RecipeKey:
        if isinstance(self.observe, ObserveFrozen) and not isinstance(self.value, bool):
            raise ValueError("observe kind frozen needs a true/false value")
        if self.rehearsal is not None and (isinstance(self.value, bool) or not isinstance(self.value, int)):
            raise ValueError("rehearsal divides_ranks needs an integer value")
        return self


class RecipeFile(_Frozen):
    """recipes/*.yaml: a frozen recipe of one trainer."""

    schema_: Literal["orch.recipe/1"] = Field(alias="schema")
    name: str = Field(min_length=1)
    trainer: str = Field(min_length=1, description="the trainer the recipe is frozen for")
    optimizer: str | None = Field(None, description="the optimizer class the probe must see (name contains it)")
    model_shrinking_flags: dict[str, str] = Field(
        default_factory=dict, description="flag -> why: refused when the protocol declares its model")
    keys: dict[str, RecipeKey] = Field(min_length=1)

    @field_validator("keys")
    @classmethod
    def _named(cls, keys: dict[str, RecipeKey]) -> dict[str, RecipeKey]:
        bad = [k for k in keys if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"key {bad[0]!r} is not a name (letters, digits, _)")
        flags = [k.flag for k in keys.values() if k.flag is not None]
        twice = sorted({f for f in flags if flags.count(f) > 1})
        if twice:
            raise ValueError(f"flag {twice[0]} carries two keys")
        return keys

    def values(self) -> dict[str, Value]:
        return {k: spec.value for k, spec in self.keys.items()}

    def flags(self) -> dict[str, str]:
        """Recipe key -> the flag that carries it."""
        return {k: spec.flag for k, spec in self.keys.items() if spec.flag is not None}

    def observed_keys(self) -> list[tuple[str, RecipeKey]]:
        """Keys the probe observes, in the audit's order (by kind, then the file's order)."""
        keyed = [(k, s) for k, s in self.keys.items() if s.observe is not None]
        return sorted(keyed, key=lambda ks: OBSERVE_ORDER.index(ks[1].observe.kind))  # type: ignore[union-attr]


@dataclass(frozen=True)
class LoadedRecipe:
    """A recipe file as read: its model, where it is, how the protocol names it, and the SHA256 of its bytes."""

    recipe: RecipeFile
    path: Path
    named: str
    sha256: str
    raw: bytes


def parse_recipe(path: Path, raw: bytes, named: str) -> LoadedRecipe:
    """Validate a recipe file's bytes; RefusedError (exit 3) names file, line and field."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RefusedError(f"{path}: recipe file is not UTF-8 text; save it as UTF-8") from None
    root_node, data = parse_yaml(path, text)
    if not isinstance(data, dict):
        raise RefusedError(f"{path}:1: a recipe file is a YAML mapping (schema, name, trainer, keys); "
                           "see docs/RECIPES.md")
    try:
        recipe = RecipeFile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = tuple(first["loc"])
        line = line_of(node_at(root_node, loc))
        if "observe" in loc[:-1] and loc[loc.index("observe") + 1] in OBSERVE_ORDER:  # the union's tag, not a field
            loc = loc[: loc.index("observe") + 1] + loc[loc.index("observe") + 2:]
        more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
        msg = first["msg"].removeprefix("Value error, ")
        raise RefusedError(f"{path}:{line}: {field_name(loc)}: {msg}{more}; see docs/RECIPES.md") from None
    return LoadedRecipe(recipe, path, named, hashlib.sha256(raw).hexdigest(), raw)


def load_recipe(path: Path, named: str, expect_sha256: str | None,
                reinit: Callable[[bytes], str] | None = None) -> LoadedRecipe:
    """Read a recipe file; refuse it when its SHA256 is not the one the protocol commits to (`reinit`: the command
    that writes the protocol again against the file's bytes, named in that refusal)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_RECIPE_BYTES + 1)
    except OSError as err:
        raise RefusedError(f"{named}: cannot read the recipe file ({err.strerror}); check recipe_file.path") from None
    if len(raw) > MAX_RECIPE_BYTES:
        raise RefusedError(f"{named}: larger than {MAX_RECIPE_BYTES} bytes; a recipe file is a small YAML file")
    digest = hashlib.sha256(raw).hexdigest()
    if expect_sha256 is not None and digest != expect_sha256:
        again = f"`{reinit(raw)}`, or " if reinit is not None else ""
        raise RefusedError(f"{named}: sha256 {digest} is not the protocol's recipe_file.sha256 {expect_sha256}; "
                           "the frozen recipe changed: restore it, or, if its owner approved the change, write the "
                           f"protocol again against it ({again}set recipe_file.sha256 to the new digest)")
    return parse_recipe(path, raw, named)


def v1_recipe() -> LoadedRecipe:
    """The recipe of every orch.protocol/1 document (R3's), checked against its pinned digest."""
    return load_recipe(V1_RECIPE_PATH, "recipes/" + V1_RECIPE_PATH.name, V1_RECIPE_SHA256)


def recipe_flags(recipe: RecipeFile | None = None) -> list[str]:
    """The recipe as trainer flags (`--lr 5e-06 ...`; default: the orch.protocol/1 recipe): one source for benches
    and tests."""
    keys = (recipe or v1_recipe().recipe).keys
    return [x for spec in keys.values() if spec.flag is not None for x in (spec.flag, str(spec.value))]


def same_value(expected: Value, given: object) -> bool:
    """Whether a protocol's recipe value is the frozen one: equal and of the same kind (a bool is not an int)."""
    if isinstance(expected, bool) or isinstance(given, bool):
        return type(given) is type(expected) and given == expected
    if isinstance(expected, (int, float)) and isinstance(given, (int, float)):
        return given == expected
    return type(given) is type(expected) and given == expected


def normalized(expected: Value, given: Value) -> Value:
    """A number written as the frozen value's kind (YAML `0` for a float key is 0.0), as a typed model read it."""
    if isinstance(given, bool) or isinstance(expected, bool):
        return given
    if isinstance(expected, float) and isinstance(given, int):
        return float(given)
    if isinstance(expected, int) and isinstance(given, float) and given.is_integer():
        return int(given)
    return given


def flag_value_equal(expected: object, given: str) -> bool:
    """Whether a command-line flag value `given` denotes the recipe value `expected`."""
    if isinstance(expected, bool):
        return given.strip().lower() in (("true", "1") if expected else ("false", "0"))
    if isinstance(expected, int):
        try:
            return int(given) == expected
        except ValueError:
            try:
                return float(given) == float(expected)
            except ValueError:
                return False
    if isinstance(expected, float):
        try:
            return float(given) == expected
        except ValueError:
            return False
    return str(expected) == given


def __getattr__(name: str) -> object:
    """UPSTREAM_RECIPE: the orch.protocol/1 recipe's values, read from its file when asked (never at import)."""
    if name == "UPSTREAM_RECIPE":
        return v1_recipe().recipe.values()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
