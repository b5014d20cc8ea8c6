"""The one check behind every typed config's "unknown key" error (model, training, position schemes)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


def reject_unknown_keys(keys: Iterable[str], allowed: Sequence[str], what: str, *, prefix: str = "",
                        where: str = "") -> None:
    """Raise ``ValueError`` for the first key not in ``allowed``, suggesting the closest allowed one.

    Args:
        keys: the keys a user gave.
        allowed: the config's field names.
        what: what a key is called in the message (``"training key"``).
        prefix: written before every key in the message (``"model."`` for nested configs).
        where: appended after the key (``" for position scheme 'rope'"``).

    Raises:
        ValueError: ``unknown {what} '{prefix}{key}'{where} (did you mean '{prefix}{close}'?); allowed: ...``.
    """
    for key in keys:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
            raise ValueError(f"unknown {what} {prefix + str(key)!r}{where}{hint}; allowed: {', '.join(allowed)}")
