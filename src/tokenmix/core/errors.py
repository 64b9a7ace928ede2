"""The project's exception for bad input, the one the command line turns into one line and exit 2.

Bad input is what a user can fix: an unknown mixer, task or preset name, an invalid pattern, a
shape or dtype mismatch, an impossible size, a missing or corrupt file, a config key that does not
exist. Raising ``InputError`` says "the caller asked for something impossible"; any other exception
is a bug in tokenmix and shows its traceback. It subclasses ``ValueError`` so that library callers
catching ``ValueError`` keep working.
"""

from __future__ import annotations


def shown(value: object) -> str:
    """A value as an error line quotes it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class InputError(ValueError):
    """Bad input: printed by the CLI as ``tokenmix <command>: error: <message>``, exit status 2."""


class MissingInput(InputError, FileNotFoundError):
    """A file or folder the caller named does not exist or is not what it should be."""


class WrongInputType(InputError, TypeError):
    """A tensor of the wrong dtype or device for the module or operator it is given to."""


class MissingDependency(InputError):
    """An optional package a feature needs is not installed; the message names the extra to install."""

    def __init__(self, package: str, feature: str, extra: str):
        super().__init__(f"{feature} needs the optional package '{package}': pip install 'tokenmix[{extra}]'")
        self.package, self.feature, self.extra = package, feature, extra
