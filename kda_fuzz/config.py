"""Project configuration: the ``[tool.kda-fuzz]`` table of a project's ``pyproject.toml``.

::

    [tool.kda-fuzz]
    corpus = ["corpus"]                 # corpus folders, relative to pyproject.toml
    hypothesis_profile = "ci"           # optional: profile the pytest plugin loads
    example_db = "redis://ci-redis:6379/0"  # optional: shared example database (a URL or
                                        # a folder; see kda_fuzz/campaign/exampledb.py)
    families = ["mypkg.contract:CONTRACT"]  # optional: the project's own contract families
    family = "mine"                     # optional: the family plain `kda-fuzz fuzz` fuzzes
                                        # (default: the one family targets are configured
                                        # for; see choose_campaign)
    family_options = {mine = "mypkg.knobs:KNOBS"}  # optional: their own `kda-fuzz fuzz`
                                        # options (a kda_fuzz.engine.knobs.Knobs in a
                                        # module that imports nothing heavy), by family
                                        # (a list of them: --help cannot say whose)

    [tool.kda-fuzz.layouts]             # optional: named pins for `kda-fuzz fuzz --layout NAME`
    served = {H = 16, HV = 32, K = 128, V = 128, state = "bfloat16"}

    [tool.kda-fuzz.unsupported]         # optional: what a target does not support
    "mypkg.decode:my_kernel" = ["lower_bound", "state=float16"]

    [tool.kda-fuzz.targets.kda]         # per contract family, per variant
    helion = ["mypkg.decode:my_kernel"]
    triton = ["mypkg.decode:my_triton_kernel"]

    [tool.kda-fuzz.targets]             # a family that declares no variants: a list
    softmax = ["mypkg.softmax:kernel"]

The table is found by walking up from a folder to the first ``pyproject.toml`` (that
file is the project's, table or not). Its presence opts the project in to the pytest
plugin. Unknown keys are errors (a typo must not silently turn a setting off).

Python 3.10 has no ``tomllib``: there the ``tomli`` package is used when installed;
without it a ``pyproject.toml`` that mentions ``tool.kda-fuzz`` raises
:class:`ConfigError` saying so (one without it reads as "no configuration").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kda_fuzz.engine.targets import SOURCES, TargetChoice, recorded_targets
from kda_fuzz.names import FAMILIES as BUILTIN_FAMILIES
from kda_fuzz.names import SOLE_VARIANT

TABLE = "kda-fuzz"
DEFAULT_CORPUS = ("corpus",)
KEYS = ("corpus", "targets", "hypothesis_profile", "example_db", "families", "family",
        "family_options", "layouts", "unsupported")


class ConfigError(Exception):
    """A ``[tool.kda-fuzz]`` table that cannot be read or has a wrong key or value."""


def _toml_loads(text: str, path: Path) -> dict[str, Any]:
    try:
        import tomllib as toml
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as toml  # type: ignore[no-redef]
        except ModuleNotFoundError:
            if re.search(r"^\s*\[\s*tool\s*\.\s*\"?kda-fuzz", text, re.MULTILINE):
                raise ConfigError(
                    f"{path}: reading [tool.{TABLE}] needs Python >= 3.11 or the tomli "
                    "package (pip install tomli)") from None
            return {}
    try:
        return toml.loads(text)
    except toml.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


@dataclass(frozen=True)
class Config:
    """The project's kda-fuzz settings.

    ``path``: the ``pyproject.toml`` read (``None``: none found); ``root``: the folder
    relative paths are resolved against; ``present``: the file has a ``[tool.kda-fuzz]``
    table (the project opted in)."""

    root: Path
    path: Path | None = None
    present: bool = False
    corpus: tuple[str, ...] = DEFAULT_CORPUS
    targets: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    hypothesis_profile: str | None = None
    example_db: str | None = None
    families: tuple[str, ...] = ()  # MODULE:ATTRIBUTE of the project's own Contracts
    family: str | None = None  # the family a campaign fuzzes when none is named
    family_options: tuple[str, ...] = ()  # MODULE:ATTRIBUTE of their Knobs (light modules)
    options_of: Mapping[str, str] = field(default_factory=dict)  # family -> its Knobs' spec
    layouts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # named pins
    unsupported: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # per target

    @property
    def corpus_dirs(self) -> list[Path]:
        """The corpus folders, absolute."""
        return [(self.root / c).resolve() for c in self.corpus]

    def targets_for(self, family: str, variant: str) -> list[str] | None:
        """The configured ``MODULE:CALLABLE`` targets of a variant; ``None``: not configured."""
        specs = self.targets.get(family, {}).get(variant)
        return None if specs is None else list(specs)


def find_pyproject(start: Path) -> Path | None:
    """The first ``pyproject.toml`` in ``start`` or a folder above it."""
    start = start.resolve()
    for folder in (start, *start.parents) if start.is_dir() else start.parents:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
        raise ConfigError(f"{where} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def parse(table: Mapping[str, Any], root: Path, path: Path | None = None) -> Config:
    """A :class:`Config` from a ``[tool.kda-fuzz]`` table (already parsed)."""
    where = f"{path or 'pyproject.toml'}: [tool.{TABLE}]"
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {', '.join(unknown)} "
                          f"(known: {', '.join(KEYS)})")
    corpus = _strings(table.get("corpus", list(DEFAULT_CORPUS)), f"{where} corpus")
    profile = table.get("hypothesis_profile")
    if profile is not None and not isinstance(profile, str):
        raise ConfigError(f"{where} hypothesis_profile must be a string, got {profile!r}")
    example_db = table.get("example_db")
    if example_db is not None and not (isinstance(example_db, str) and example_db):
        raise ConfigError(f"{where} example_db must be a non-empty string (a redis:// URL "
                          f"or a folder), got {example_db!r}")
    families = _strings(table.get("families", []), f"{where} families")
    default_family = table.get("family")
    if default_family is not None and not (isinstance(default_family, str) and default_family):
        raise ConfigError(f"{where} family must be a family's name, got {default_family!r}")
    raw_options = table.get("family_options", [])
    options_of: dict[str, str] = {}
    if isinstance(raw_options, dict):  # family -> its Knobs: --help says whose a flag is
        options_of = {k: _strings([v], f"{where} family_options.{k}")[0]
                      for k, v in raw_options.items()}
        raw_options = list(options_of.values())
    family_options = _strings(raw_options, f"{where} family_options")
    for key, specs in (("families", families), ("family_options", family_options)):
        bad = [s for s in specs if s.count(":") != 1 or s.startswith(":") or s.endswith(":")]
        if bad:
            raise ConfigError(f"{where} {key}: {bad[0]!r} is not of the form "
                              "MODULE:ATTRIBUTE")
    layouts = table.get("layouts", {})
    if not isinstance(layouts, dict) or not all(isinstance(v, dict) and v
                                                 for v in layouts.values()):
        raise ConfigError(f"{where} layouts must be a table of named pin tables "
                          f"(e.g. served = {{H = 16, K = 128}}), got {layouts!r}")
    raw_un = table.get("unsupported", {})
    if not isinstance(raw_un, dict):
        raise ConfigError(f"{where} unsupported must be a table of target = [features], "
                          f"got {raw_un!r}")
    unsupported = {k: _strings(v, f"{where} unsupported.{k}") for k, v in raw_un.items()}
    raw = table.get("targets", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} targets must be a table of families, got {raw!r}")
    targets: dict[str, dict[str, tuple[str, ...]]] = {}
    for family, variants in raw.items():
        if isinstance(variants, list) and family not in BUILTIN_FAMILIES:
            variants = {SOLE_VARIANT: variants}  # a family that declares no variants
        if not isinstance(variants, dict):
            raise ConfigError(f"{where} targets.{family} must be a table of variants "
                              f'(e.g. triton = ["mypkg.decode:kernel"]), or a list of '
                              f"targets for a family without variants, got {variants!r}")
        targets[family] = {}
        for variant, specs in variants.items():
            specs = _strings(specs, f"{where} targets.{family}.{variant}")
            bad = [s for s in specs if s.count(":") != 1 or s.startswith(":")
                   or s.endswith(":")]
            if bad:
                raise ConfigError(f"{where} targets.{family}.{variant}: {bad[0]!r} is not "
                                  "of the form MODULE:CALLABLE")
            targets[family][variant] = specs
    return Config(root=root, path=path, present=True, corpus=corpus, targets=targets,
                  hypothesis_profile=profile, example_db=example_db, families=families,
                  family=default_family, family_options=family_options,
                  options_of=options_of,
                  layouts=layouts, unsupported=unsupported)


def load_config(start: Path) -> Config:
    """The configuration of the project containing ``start`` (searching upward for
    ``pyproject.toml``); an empty, not-present one when there is no table."""
    path = find_pyproject(Path(start))
    if path is None:
        return Config(root=Path(start).resolve())
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    tool = _toml_loads(text, path).get("tool", {})
    table = tool.get(TABLE) if isinstance(tool, dict) else None
    if table is None:
        return Config(root=path.parent, path=path)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: tool.{TABLE} must be a table")
    return parse(table, path.parent, path)


def project_families(start: Path | None = None) -> list[str]:
    """The ``families`` (``MODULE:ATTRIBUTE``) of the project containing ``start`` (default:
    the current directory); raises ``ValueError`` for a configuration that cannot be read."""
    try:
        return list(load_config(Path.cwd() if start is None else start).families)
    except ConfigError as e:
        raise ValueError(str(e)) from None


# ------------------------------------------------------------------ replay targets





def choose_targets(config: Config, family: str, variant: str,
                   override: Sequence[str] = (),
                   defaults: Sequence[str] | Callable[[], Sequence[str]] = ()) -> TargetChoice:
    """Replay targets of a ``family``/``variant``: ``override`` (e.g. ``--target``), else
    the configured ones, else ``defaults`` (pass none to refuse a silent fallback; a
    callable is asked only then: asking a contract for its own kernels imports it, torch
    and all, seconds before the command has chosen anything)."""
    if override:
        return TargetChoice(tuple(override), "option")
    configured = config.targets_for(family, variant)
    if configured is not None:
        return TargetChoice(tuple(configured), "config")
    if callable(defaults):
        defaults = defaults()
    if defaults:
        return TargetChoice(tuple(defaults), "default")
    return TargetChoice((), "none")


class AmbiguousTargets(ConfigError):
    """The configuration names targets for several families or variants and the command
    line does not say which to use."""


@dataclass(frozen=True)
class CampaignChoice:
    """The family, variant and targets of a campaign, and why those (``why``: a phrase
    for the start line)."""

    family: str
    variant: str
    targets: TargetChoice
    why: str


def choose_campaign(config: Config, family: str | None, variant: str | None,
                    override: Sequence[str], variants: Mapping[str, Sequence[str]],
                    defaults: Callable[[str, str], Sequence[str]]) -> CampaignChoice:
    """The one place a campaign's targets are chosen. ``family``/``variant``: as given on
    the command line (``None``: not given); ``override``: ``--target``; ``variants``: every
    family's variants, the first its default; ``defaults(family, variant)``: the
    contract's own kernels.

    An unnamed family is the configuration's ``family``; else the one family the project
    configures targets for; else, when it configures several, the first of ``variants``
    (``kda``) if that is one of them and all are built-in ones, else
    :class:`AmbiguousTargets` naming the choices; with none configured, the first of
    ``variants``. An unnamed variant is the one the project configures targets for
    (several: :class:`AmbiguousTargets`), else the family's first; with ``override``, the
    family's first."""
    configured = {f: v for f, v in config.targets.items() if v and f in variants}
    where = config.path or "pyproject.toml"
    for f, v in configured.items():
        if SOLE_VARIANT in v and SOLE_VARIANT not in variants[f]:
            raise ConfigError(f"{where}: [tool.{TABLE}.targets] {f} is a list, but family "
                              f"{f!r} declares variants ({', '.join(variants[f])}): give "
                              f"[tool.{TABLE}.targets.{f}] a table of them")
    default = next(iter(variants))
    if family is None and config.family is not None:
        if config.family not in variants:
            raise ConfigError(f"{where}: [tool.{TABLE}] family = {config.family!r} is no "
                              f"known family (known: {', '.join(variants)})")
        family = config.family
    if family is None:
        if not configured:
            family = default
        elif len(configured) == 1:
            family = next(iter(configured))
        elif default in configured and set(configured) <= set(BUILTIN_FAMILIES):
            family = default
        else:
            raise AmbiguousTargets(
                f"{where} configures targets for several families "
                f"({', '.join(sorted(configured))}): choose one with "
                + " or ".join(f"--family {f}" for f in sorted(configured))
                + f", or name it in [tool.{TABLE}] family = \"...\"")
    why = "the family's default variant"
    if variant is None:
        mine = [v for v in variants[family] if v in configured.get(family, {})]
        if override or not mine:
            variant = variants[family][0]
        elif len(mine) == 1:
            variant, why = mine[0], "the variant configured"
        else:
            raise AmbiguousTargets(
                f"{where} configures {family} targets for several variants "
                f"({', '.join(mine)}): choose one with "
                + " or ".join(f"--contract {v}" for v in mine))
    else:
        why = "--contract"
    choice = choose_targets(config, family, variant, override,
                            lambda: defaults(family, variant))
    return CampaignChoice(family, variant, choice, why)



def config_snippet(family: str, variant: str, specs: Sequence[str]) -> str:
    """The ``pyproject.toml`` lines that make ``specs`` a variant's replay targets."""
    listed = ", ".join(f'"{s}"' for s in specs) or '"mypkg.module:kernel"'
    if variant == SOLE_VARIANT:
        return f"[tool.{TABLE}.targets]\n{family} = [{listed}]"
    return f"[tool.{TABLE}.targets.{family}]\n{variant} = [{listed}]"


def missing_targets_message(family: str, variant: str, origin: Mapping[str, Any] | None,
                            pyproject: Path | str, option: str = "--target") -> str:
    """Why a corpus file cannot be replayed (no target for its variant) and how to fix it:
    the target it was recorded against, the lines to add to ``pyproject``, ``option``."""
    recorded = recorded_targets(origin)
    snippet = "\n".join("    " + line for line in
                        config_snippet(family, variant, recorded[:1]).splitlines())
    what = (f"the {family} family" if variant == SOLE_VARIANT
            else f"the {family}/{variant} variant")
    return (f"no replay target is configured for {what}"
            + (f"; the file was recorded against {' vs '.join(recorded)}" if recorded else "")
            + f".\n  Add to {pyproject}:\n\n{snippet}\n\n"
            f"  or pass {option} MODULE:CALLABLE.")


def origin_mismatch(origin: Mapping[str, Any] | None, choice: TargetChoice) -> str | None:
    """A sentence saying that a file was recorded against a target it is not replayed
    against (``None`` when it is, or when the file records no target)."""
    recorded = recorded_targets(origin)
    if not recorded or any(r in choice.specs for r in recorded):
        return None
    against = ", ".join(choice.specs) or "nothing"
    return (f"recorded against {' vs '.join(recorded)}, replayed against {against} "
            f"({SOURCES[choice.source]})")
