"""Option syntax shared by several commands, parsed in one place so that it reads the same everywhere.

    --mixers NAME[,NAME...] | all | none

Before this module the commands disagreed: ``analyze cost`` and ``analyze norms`` took a comma list
or ``all``; ``analyze expressivity`` also took ``none``; ``compare`` took names separated by spaces
and/or commas (``nargs="+"``); each had its own message for an empty list. ``mixer_list`` is now the
one parser; ``MIXERS_HELP`` the one help text.
"""
from __future__ import annotations

from typing import Sequence

from tokenmix.core.errors import InputError
from tokenmix.mixers.registry import get_mixer_spec, mixer_names

MIXERS_HELP = "registered mixer names separated by commas (e.g. pow2,attention), or 'all'"


def mixers_help(default: str, allow_none: bool = False) -> str:
    """The help of a ``--mixers`` option: the shared syntax, then what the command does without it."""
    return MIXERS_HELP + (", or 'none'" if allow_none else "") + f" (default: {default}; `tokenmix list` names them)"


def mixer_list(text: str | None, flag: str = "--mixers", *, default: Sequence[str] | None = None,
               allow_none: bool = False) -> list[str]:
    """The mixers a ``--mixers`` value names, each checked against the registry, in the order given
    and without repeats. ``all``: every registered mixer; ``none``: no mixer (only where the command
    can do without, ``allow_none``); the option absent (None): ``default``, or every registered mixer."""
    if text is None:
        return list(default) if default is not None else mixer_names()
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
