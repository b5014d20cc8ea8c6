"""The CJK font poslab ships, for matplotlib figures and for HTML pages.

``assets/PoslabCJK-Regular.otf`` is a subset of Noto Sans CJK SC (SIL Open Font License 1.1, see
``assets/OFL.txt``) covering every character of the shipped Tang corpora, GB2312, ASCII and CJK
punctuation, so poem characters render as glyphs, not boxes, on a machine with no CJK font
installed. Rebuild it with ``python -m poslab.display.make_font`` (see that module).
"""

from __future__ import annotations

import base64
import io
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

FAMILY = "Poslab CJK"
LATIN_FAMILY = "DejaVu Sans"  # matplotlib's bundled default; CJK glyphs fall back to FAMILY


def font_path() -> Path:
    """Path of the shipped OpenType file."""
    path = Path(str(resources.files("poslab.display").joinpath("assets", "PoslabCJK-Regular.otf")))
    if not path.is_file():
        raise FileNotFoundError(f"the shipped CJK font is missing: {path} (reinstall poslab)")
    return path


@lru_cache(maxsize=1)
def covered_chars() -> frozenset[str]:
    """Characters the shipped font has glyphs for."""
    from fontTools.ttLib import TTFont

    return frozenset(chr(c) for c in TTFont(str(font_path()), lazy=True).getBestCmap())


def use_in_matplotlib() -> dict[str, Any]:
    """Register the font with matplotlib; return rc settings (for ``plt.rc_context``) that use it.

    Latin text stays in DejaVu Sans; characters it lacks fall back glyph by glyph to Poslab CJK
    (matplotlib >= 3.6 font fallback).
    """
    _register_matplotlib()
    return {"font.family": [LATIN_FAMILY, FAMILY], "axes.unicode_minus": False}


@lru_cache(maxsize=1)
def _register_matplotlib() -> None:
    from matplotlib import font_manager

    font_manager.fontManager.addfont(str(font_path()))


@lru_cache(maxsize=32)
def _subset_bytes(chars: str) -> bytes:
    from fontTools import subset
    from fontTools.ttLib import TTFont

    font = TTFont(str(font_path()))
    options = subset.Options()
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13, 14]
    options.layout_features = []
    options.notdef_outline = True
    options.hinting = False
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=[ord(c) for c in chars])
    subsetter.subset(font)
    buffer = io.BytesIO()
    font.save(buffer)
    return buffer.getvalue()


def font_face_css(text: str) -> str:
    """A CSS ``@font-face`` rule embedding the font subset to the CJK characters of ``text``.

    The font is inlined as a base64 data URL, so a page using it needs no network and no system
    font. Returns ``""`` when ``text`` has no character beyond ASCII that the font covers.

    Args:
        text: every string the page will display (only non-ASCII characters are kept).
    """
    wanted = sorted({c for c in text if ord(c) > 0x7F} & covered_chars())
    if not wanted:
        return ""
    data = base64.b64encode(_subset_bytes("".join(wanted))).decode("ascii")
    return (
        f"@font-face {{ font-family: '{FAMILY}'; font-style: normal; font-weight: 400;"
        f" src: url(data:font/otf;base64,{data}) format('opentype'); }}"
    )
