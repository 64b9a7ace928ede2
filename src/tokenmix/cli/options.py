"""Option syntax shared by several commands, defined in one place so that it reads the same everywhere.

    --mixers NAME[,NAME...] [NAME ...] | all | none      (commas, spaces, or both)

Before this module the commands disagreed: ``analyze cost`` and ``analyze norms`` took a comma list
or ``all``; ``analyze expressivity`` also took ``none``; ``compare`` took names separated by spaces
and/or commas; ``bench decode`` and ``bench mixers`` spaces only; ``bench lm`` a comma list that
skipped unknown names; each had its own message for an empty list. Every ``--mixers`` is now
``add_mixers_option`` (``nargs="+"``) read by ``validate.mixer_list`` when the command runs, so
commas and spaces both work everywhere (the commands documented with either keep working).

Light on purpose: the parser imports this module on every call, ``tokenmix --help`` included, so
it imports no registry (the names are checked against the registry when the command runs).
"""

from __future__ import annotations

MIXERS_HELP = "registered mixer names separated by commas or spaces (e.g. pow2,attention), or 'all'"


def mixers_help(default: str, allow_none: bool = False) -> str:
    """The help of a ``--mixers`` option: the shared syntax, then what the command does without it."""
    return MIXERS_HELP + (", or 'none'" if allow_none else "") + f" (default: {default}; `tokenmix list` names them)"


def add_mixers_option(parser, default_text: str, allow_none: bool = False, prefix: str = "") -> None:
    """The one ``--mixers`` option (read it with ``validate.mixer_list``)."""
    parser.add_argument(
        "--mixers", nargs="+", default=None, metavar="NAME", help=prefix + mixers_help(default_text, allow_none)
    )
