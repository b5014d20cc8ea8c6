"""Developer tool: rebuild the shipped CJK font subset ``assets/PoslabCJK-Regular.otf``.

Run once at development time (not at install or run time)::

    apt-get install -y fonts-noto-cjk
    .venv/bin/python -m poslab.display.make_font

Source: Noto Sans CJK SC Regular (Adobe/Google, SIL Open Font License 1.1, no Reserved Font Name;
Debian package ``fonts-noto-cjk``). The subset covers every character of the shipped Tang corpora,
all 6,763 GB2312 hanzi, ASCII, CJK punctuation and full-width forms. It is renamed "Poslab CJK" so
it is never confused with the full font; the OFL (``assets/OFL.txt``) travels with it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from poslab.fileio import atomic_write

SOURCE = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
SOURCE_FACE = "Noto Sans CJK SC"
ASSETS = Path(__file__).resolve().parent / "assets"
FAMILY = "Poslab CJK"
EXTRA = "·—–‘’“”…×÷→←↑↓≈≠≤≥√θαβγπΔΣ∞±°²³½¼"
#: traditional characters the pages print: the title of the lesson written in traditional characters
#: (「多頭注意力和位置編碼」) and its exercise and self-test headings (練習, 自測)
TRADITIONAL = "頭編碼練習測"


def charset() -> set[str]:
    """The characters the subset must cover."""
    from poslab.data import load_corpus

    chars: set[str] = set()
    for name in ("tang5", "tang"):
        chars |= set(load_corpus(name))
    for high in range(0xB0, 0xF8):  # GB2312 level 1 + 2 hanzi rows
        for low in range(0xA1, 0xFF):
            try:
                chars.add(bytes([high, low]).decode("gb2312"))
            except UnicodeDecodeError:
                pass
    chars |= {chr(c) for c in range(0x20, 0x7F)}
    chars |= {chr(c) for c in range(0x3000, 0x3040)}  # CJK symbols and punctuation
    chars |= {chr(c) for c in range(0xFF01, 0xFF66)}  # full-width forms
    chars |= set(EXTRA) | set(TRADITIONAL)
    return {c for c in chars if c.isprintable()}


def build(source: Path = SOURCE, out: Path = ASSETS / "PoslabCJK-Regular.otf") -> Path:
    """Subset ``source`` to :func:`charset`, rename it, write ``out`` atomically."""
    from fontTools import subset
    from fontTools.ttLib import TTCollection

    if not source.is_file():
        raise SystemExit(f"{source} not found: apt-get install -y fonts-noto-cjk")
    faces = {f["name"].getDebugName(1): f for f in TTCollection(str(source)).fonts}
    font = faces[SOURCE_FACE]
    options = subset.Options()
    options.layout_features = ["vert", "vrt2"]  # nothing else is needed for horizontal hanzi
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13, 14]
    options.hinting = False
    options.notdef_outline = True
    options.drop_tables += ["VORG", "vhea", "vmtx", "BASE"]
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=sorted(ord(c) for c in charset()))
    subsetter.subset(font)
    names = font["name"]
    for record in list(names.names):
        if record.nameID in (1, 3, 4, 6, 16, 17):
            names.removeNames(nameID=record.nameID)
    names.setName(FAMILY, 1, 3, 1, 0x409)
    names.setName("Poslab CJK Regular; subset of Noto Sans CJK SC", 3, 3, 1, 0x409)
    names.setName("Poslab CJK Regular", 4, 3, 1, 0x409)
    names.setName("PoslabCJK-Regular", 6, 3, 1, 0x409)
    font["CFF "].cff.fontNames = ["PoslabCJK-Regular"]
    return atomic_write(out, lambda tmp: font.save(str(tmp)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE)
    args = parser.parse_args()
    path = build(args.source)
    print(f"wrote {path} ({path.stat().st_size:,} bytes, {len(charset()):,} characters)")


if __name__ == "__main__":
    main()
