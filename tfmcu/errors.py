"""The one base class of the errors a user can fix.

Every error tfmcu raises for a user mistake or an unsupported model (a missing file, a malformed spec, an op the
patch stage cannot run, a budget no schedule fits, ...) is a ``TfmcuError``: a ``ValueError`` whose message is one
line naming the file, op or flag and what is supported. The absl shells (``pipelines/_cli.py``) print such an
error as ``<prog>: error: <message>`` and exit with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class TfmcuError(ValueError):
    """A problem the user can fix; one line."""


class UsageError(TfmcuError):
    """A bad flag, option combination or argument (found before any work starts)."""
