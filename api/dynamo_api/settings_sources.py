"""Settings models read from command-line flags and environment variables, on pydantic-settings.

Shared by ``dynamo_operator`` and ``dynamo_worker`` (the one settings mechanism of both). A settings
model derives from :class:`Settings`; building one directly reads nothing (tests and callers pass every
value). Each field names the environment variable it reads, and those it falls back to, itself::

    advertise_host: str = Field(
        "127.0.0.1",
        description="...",
        json_schema_extra={"env": "DYN_ADVERTISE_HOST", "env_fallbacks": ["POD_IP"]},
    )

or, where the model config sets ``env_prefix``, every field reads ``<env_prefix><FIELD_NAME>`` (the
operator's ``DYN_OPERATOR_WORKERS``); :class:`FieldEnvSource` reads them (upper case as written, an empty
value counts as unset). The flags are made by pydantic-settings' CLI source on the caller's argparse
parser: ``--field-name``, more names from the model config's ``cli_shortcuts``, none for a field typed
``CliSuppress[...]``. Their help line, metavar and switch style are ours (:func:`add_model_arguments`).

Precedence: explicit overrides > flag > environment variable > field default. :func:`settings_from_args`
raises :class:`SettingsError` naming the flag and the variable of every invalid value.
"""

from __future__ import annotations

import argparse
import inspect
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from dynamo_api.errors import DynamoError

__all__ = [
    "FieldEnvSource",
    "Settings",
    "SettingsError",
    "add_model_arguments",
    "env_value",
    "settings_from_args",
]

S = TypeVar("S", bound="Settings")
# help text of a field from its name, FieldInfo and environment variables
HelpText = Callable[[str, FieldInfo, list[str]], str]


class SettingsError(DynamoError, ValueError):
    """A flag or environment variable has a value the process cannot run with."""


class Settings(BaseSettings):
    """Base of every settings model: frozen, no unknown fields, flags in kebab case. Constructing one
    reads only the values given (no environment): :func:`settings_from_args` layers the sources."""

    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", cli_kebab_case=True, cli_implicit_flags="dual", cli_hide_none_type=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def _extra(info: FieldInfo | None) -> dict[str, Any]:
    return info.json_schema_extra if info and isinstance(info.json_schema_extra, dict) else {}


def env_names(model: type[BaseSettings], name: str) -> list[str]:
    """The environment variables field ``name`` reads, in order (the first set one wins)."""
    extra = _extra(model.model_fields.get(name))
    prefix = model.model_config.get("env_prefix") or ""
    first = extra.get("env") or (prefix + name.upper() if prefix else None)
    return [*([first] if first else []), *extra.get("env_fallbacks", ())]


def flag_names(model: type[BaseSettings], name: str) -> list[str]:
    """The flags of field ``name``: ``--field-name``, then its ``cli_shortcuts``."""
    flag = name.replace("_", "-")
    more = (model.model_config.get("cli_shortcuts") or {}).get(flag, [])
    return ["--" + f for f in [flag, *([more] if isinstance(more, str) else more)]]


def env_value(environ: Mapping[str, str | None], names: Sequence[str]) -> str | None:
    """The value of the first of the variables ``names`` that is set and not empty, else None: how every
    setting reads the environment (also where the operator reads a pod's env for a setting)."""
    for env in names:
        value = environ.get(env)
        if value:
            return value
    return None


class FieldEnvSource(PydanticBaseSettingsSource):
    """Each field's own environment variable(s) (``env_names``) from ``environ``, as raw strings."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """The value of the first of the field's variables that is set and not empty, else None."""
        for env in env_names(self.settings_cls, field_name):
            value = env_value(self.environ, [env])
            if value is not None:
                return value, env, False
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        fields = self.settings_cls.model_fields.items()
        values = {name: self.get_field_value(info, name)[0] for name, info in fields}
        return {name: value for name, value in values.items() if value is not None}


def _literal_choices(annotation: Any) -> list[str] | None:
    """The allowed values of a Literal (possibly inside Optional / Annotated), else None."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _literal_choices(typing.get_args(annotation)[0])
    if origin is Literal:
        return [str(a) for a in typing.get_args(annotation)]
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _literal_choices(arg)
            if found:
                return found
    return None


def worker_help(name: str, info: FieldInfo, envs: list[str]) -> str:
    """``<description> [env VAR] (default: 'x')``, or ``(required)``; no default for a factory."""
    text = info.description or ""
    if envs:
        text += f" [env {envs[0]}]"
    if info.is_required():
        text += " (required)"
    elif info.default_factory is None:
        text += f" (default: {info.get_default()!r})"
    return text


def add_model_arguments(
    parser: argparse.ArgumentParser,
    model: type[Settings],
    title: str | None = "",
    help_text: HelpText = worker_help,
    switches: Literal["dual", "store_true"] = "store_true",
    sections: Mapping[type, str] | None = None,
) -> None:
    """Add the flags of ``model``'s fields to ``parser`` with pydantic-settings' CLI source, in a group
    titled ``title`` (None: none). Absent flags stay unset (env and defaults apply later). Help is
    ``help_text(name, info, env_names)``; a field typed Literal gets its values as choices; a bool field
    is ``--x/--no-x``, or with ``switches="store_true"`` a plain ``--x`` switch when its default is False.
    ``sections`` (a class of ``model``'s bases -> title) puts the fields each class declares in a group of
    their own, in that order, instead of inherited fields first."""
    group = parser if title is None else parser.add_argument_group(title or model.__name__)
    groups = {cls: parser.add_argument_group(t) for cls, t in (sections or {}).items()}

    def add_argument(_parser: Any, *names: str, **kwargs: Any) -> Any:
        name = kwargs["dest"]
        info = model.model_fields[name]
        if kwargs.get("help") == argparse.SUPPRESS:  # CliSuppress: no flag at all
            return None
        kwargs["help"] = help_text(name, info, env_names(model, name)).replace("%", "%%")
        choices = _literal_choices(info.annotation)
        if kwargs.get("action") is argparse.BooleanOptionalAction:
            if switches == "store_true" and info.default is False:
                kwargs["action"] = "store_true"
        elif choices:
            kwargs.pop("metavar", None)
            kwargs["choices"] = choices  # argparse shows them as the metavar
        else:
            kwargs["metavar"] = _extra(info).get("metavar") or name.upper()
        return groups.get(_declared_in(model, name), group).add_argument(*names, **kwargs)

    CliSettingsSource(model, root_parser=parser, add_argument_method=add_argument)


def _declared_in(model: type, name: str) -> type:
    """The class of ``model``'s bases (itself included) that declares field ``name``."""
    return next((c for c in model.__mro__ if name in inspect.get_annotations(c)), model)


def _where(model: type[BaseSettings], name: str) -> str:
    if name not in model.model_fields:
        return name
    return " / ".join([*flag_names(model, name), *env_names(model, name)[:1]])


def settings_from_args(
    model: type[S],
    args: argparse.Namespace | Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> S:
    """Build ``model`` from parsed flags (``args``: argparse's namespace, or a mapping of field names,
    possibly with other models' flags too), then env vars, then defaults; ``overrides`` win over all.
    Raises ``SettingsError`` naming the flag and env var of every invalid value."""
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    flags = {k: v for k, v in given.items() if k in model.model_fields}
    values = {**FieldEnvSource(model, os.environ if env is None else env)(), **flags, **overrides}
    try:
        return model.model_validate(values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            msg = str(err["msg"]).removeprefix("Value error, ")
            if not field:
                problems.append(msg)
            elif err["type"] == "missing":
                problems.append(f"{_where(model, field)} is required")
            elif err["type"] == "bool_parsing":
                problems.append(
                    f"{_where(model, field)}={err['input']!r} is not a boolean: use true or false"
                )
            else:
                problems.append(f"{_where(model, field)}: {msg} (got {err.get('input')!r})")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
