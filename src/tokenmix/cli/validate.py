"""Values the parser cannot check without loading the registries (mixer names, presets, devices):
checked here when the command runs, with the same one line and exit status 2 that argparse gives a
bad ``choices`` value. Keeping the registries out of the parser keeps ``tokenmix --help`` and every
``tokenmix <command> --help`` free of torch (cli/main.py)."""

from __future__ import annotations

from typing import Sequence

from tokenmix.cli.options import MIXERS_HELP
from tokenmix.core.errors import InputError
from tokenmix.mixers.registry import get_mixer_spec, mixer_names


def check_choice(flag: str, value: str | None, allowed: Sequence[str]) -> None:
    """Refuse ``value`` outside ``allowed`` in argparse's own words (None: the option was not given)."""
    if value is not None and value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise InputError(f"argument {flag}: invalid choice: {value!r} (choose from {choices})")


def mixer_list(
    text: str | Sequence[str] | None,
    flag: str = "--mixers",
    *,
    default: Sequence[str] | None = None,
    allow_none: bool = False,
) -> list[str]:
    """The mixers a ``--mixers`` value names, each checked against the registry, in the order given
    and without repeats. ``all``: every registered mixer; ``none``: no mixer (only where the command
    can do without, ``allow_none``); the option absent (None): ``default``, or every registered mixer."""
    if text is None:
        return list(default) if default is not None else mixer_names()
    if not isinstance(text, str):  # nargs="+": the words given, each possibly a comma list
        text = ",".join(text)
    word = text.strip()
    if word == "all":
        return mixer_names()
    if word == "none":
        if not allow_none:
            raise InputError(f"{flag} none: this command needs at least one mixer; give {MIXERS_HELP}")
        return []
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise InputError(f"{flag} is empty; give {MIXERS_HELP}" + (", or 'none'" if allow_none else ""))
    for name in names:
        get_mixer_spec(name)  # an unknown name: the registry's one line, listing the known mixers
    return list(dict.fromkeys(names))
