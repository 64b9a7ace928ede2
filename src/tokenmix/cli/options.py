"""Option syntax shared by several commands, parsed in one place so that it reads the same everywhere.

    --mixers NAME[,NAME...] [NAME ...] | all | none      (commas, spaces, or both)

Before this module the commands disagreed: ``analyze cost`` and ``analyze norms`` took a comma list
or ``all``; ``analyze expressivity`` also took ``none``; ``compare`` took names separated by spaces
and/or commas; ``bench decode`` and ``bench mixers`` spaces only; ``bench lm`` a comma list that
skipped unknown names; each had its own message for an empty list. Every ``--mixers`` is now
``add_mixers_option`` (``nargs="+"``) read by ``mixer_list``, so commas and spaces both work
everywhere (the commands documented with either keep working).
"""

from __future__ import annotations

from typing import Sequence

from tokenmix.core.errors import InputError
from tokenmix.mixers.registry import get_mixer_spec, mixer_names

MIXERS_HELP = "registered mixer names separated by commas or spaces (e.g. pow2,attention), or 'all'"


def mixers_help(default: str, allow_none: bool = False) -> str:
    """The help of a ``--mixers`` option: the shared syntax, then what the command does without it."""
    return MIXERS_HELP + (", or 'none'" if allow_none else "") + f" (default: {default}; `tokenmix list` names them)"


def add_mixers_option(parser, default_text: str, allow_none: bool = False, prefix: str = "") -> None:
    """The one ``--mixers`` option (read it with ``mixer_list``)."""
    parser.add_argument(
        "--mixers", nargs="+", default=None, metavar="NAME", help=prefix + mixers_help(default_text, allow_none)
    )


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
