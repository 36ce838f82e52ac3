"""XML documents (NCCL topology dumps): no DTD or entity (an entity bomb or an external entity is refused before
parsing), nesting at most `MAX_DEPTH` deep, and attributes read as numbers with one-line errors."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from optlayout.errors import InputError
from optlayout.inputs.limits import MAX_DEPTH
from optlayout.inputs.numbers import int_from_text, number_from_text


def parse_xml(text: str, where: str) -> ET.Element:
    """The root element of an XML text; `where` ("nccl-xml") starts every error."""
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise InputError(f"{where}: a DTD or entity declaration is not accepted (NCCL writes none)")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise InputError(f"{where}: not valid XML ({exc})") from None
    stack = [(root, 1)]
    while stack:
        elem, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"{where}: elements nested deeper than {MAX_DEPTH} levels")
        stack.extend((child, depth + 1) for child in elem)
    return root


def int_attribute(elem: ET.Element, name: str, default: int, where: str) -> int:
    """An integer attribute (decimal or 0x hexadecimal), or `default` when it is absent or empty."""
    text = (elem.get(name) or "").strip()
    if not text:
        return default
    what = f"{where}: <{elem.tag} {name}>"
    if text.lower().startswith("0x"):
        try:
            if len(text) <= 20:
                return int(text, 16)
        except ValueError:
            pass
        raise InputError(f"{what}: expected an integer, got {text[:40]!r}")
    return int_from_text(text, what)


def number_attribute(elem: ET.Element, name: str, default: float, where: str) -> float:
    """A finite number attribute, or `default` when it is absent or empty."""
    text = (elem.get(name) or "").strip()
    return number_from_text(text, f"{where}: <{elem.tag} {name}>") if text else default
