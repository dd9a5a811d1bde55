"""Exact JSON numbers (SPEC §16.1): a patch's ``test`` compares numbers by their exact decimal value, whatever their
spelling (``1`` = ``1.0`` = ``1e0`` = ``10e-1``, ``-0`` = ``0``), and never through a binary float
(``9007199254740993`` is not ``9007199254740992``, ``0.10000000000000001`` is not ``0.1``).

Python's ints are exact already; a float is not always: ``json.loads`` reads ``0.10000000000000001`` as ``0.1``. So
:func:`loads` keeps a number as a plain ``int`` or ``float`` when that is *faithful* (the float's shortest text,
``repr``, has the value the JSON text has: always so for up to 15 significant digits in the double's normal range,
and for every number a Python program writes), and as a :class:`JSONNumber` otherwise: a :class:`decimal.Decimal`
that keeps its JSON text and is written back as exactly that text by :func:`dumps` (and ``fluxbus.wire.dumps``).

- :func:`numbers_equal`: the one comparison patches use (``int``, ``float``, ``Decimal`` and :class:`JSONNumber`;
  a ``float`` stands for the decimal its ``repr`` names).
- :func:`decimal_key`: ``(negative, digits, exponent)``, equal for two numbers exactly when their values are;
  exponents stay text-sized (``1e999999999999999999999`` costs what its text costs).
"""
from __future__ import annotations

import decimal
import json
import re
import secrets
from typing import Any, List, Tuple, Union

__all__ = ["JSONNumber", "numbers_equal", "decimal_key", "is_number", "loads", "dumps", "parse_float"]

_GRAMMAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")  # RFC 8259
# Also what str(Decimal) and repr(float) write (leading zeros allowed, 'E+400', '1e+16', 'inf' is not matched).
_LOOSE = re.compile(r"(-?)([0-9]+)(?:\.([0-9]*))?(?:[eE]([+-]?)([0-9]+))?\Z")
_SMALL_EXPONENT = 4000  # exponent digits Python's int() takes without sys.set_int_max_str_digits
_LONG_EXPONENT = 10 ** (_SMALL_EXPONENT - 1)  # from here on an exponent is kept as text


class JSONNumber(decimal.Decimal):
    """A JSON number that no float represents faithfully (``0.10000000000000001``, ``9007199254740993.0``,
    ``1e400``), kept with its JSON text: a :class:`decimal.Decimal` of the same value (exponents beyond Decimal's
    range, ``1e9999999999999999999``, are ±Infinity or ±0 as Decimals; their text and comparisons stay exact),
    ``str()`` is the text, and :func:`dumps` / ``fluxbus.wire.dumps`` write the text back unchanged. The standard
    ``json.dumps`` does not know it (``default=str`` writes a string): use :func:`dumps`."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> "JSONNumber":
        if not isinstance(text, str) or not _GRAMMAR.match(text):
            raise ValueError(f"not a JSON number: {text!r}")
        try:
            self = super().__new__(cls, text)
        except decimal.InvalidOperation:  # an exponent beyond Decimal's range: the value it tends to
            negative = text.startswith("-")
            huge = not _exponent_negative(text)
            self = super().__new__(cls, ("-" if negative else "") + ("Infinity" if huge else "0"))
        self.text = text
        return self

    def __repr__(self) -> str:
        return f"JSONNumber({self.text!r})"

    def __str__(self) -> str:
        return self.text

    def __reduce__(self) -> Any:
        return (JSONNumber, (self.text,))

    def __copy__(self) -> "JSONNumber":
        return self

    def __deepcopy__(self, memo: Any) -> "JSONNumber":
        return self


def _exponent_negative(text: str) -> bool:
    m = re.search(r"[eE]([+-]?)", text)
    return bool(m and m.group(1) == "-")


def is_number(value: Any) -> bool:
    """Whether ``value`` is a JSON number here: ``int`` (not ``bool``), ``float``, or a ``Decimal``
    (:class:`JSONNumber` included)."""
    return isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool)


# -- exact decimal values --------------------------------------------------------------------------------------

def _add_digits(negative: bool, digits: str, n: int) -> Tuple[bool, str]:
    """``±digits + n`` in decimal text, for a long canonical magnitude ``digits`` (more than 4,000 digits) and an
    ``n`` far smaller (a text's length at most)."""
    head, tail = digits[:-20], int(digits[-20:])
    if (n < 0) == negative or n == 0:  # the magnitudes add
        total = tail + abs(n)
        if total >= 10 ** 20:
            total -= 10 ** 20
            nines = len(head) - len(head.rstrip("9"))
            rest = head[:len(head) - nines]
            head = (rest[:-1] + str(int(rest[-1]) + 1) if rest else "1") + "0" * nines
    else:  # |digits| - |n|, never below zero
        total = tail - abs(n)
        if total < 0:
            total += 10 ** 20
            zeros = len(head) - len(head.rstrip("0"))
            rest = head[:len(head) - zeros]
            head = rest[:-1] + str(int(rest[-1]) - 1) + "9" * zeros
    return negative, (head + str(total).rjust(20, "0")).lstrip("0")


def _key_of_text(text: str) -> Tuple[bool, str, Union[int, str]]:
    m = _LOOSE.match(text)
    if m is None:
        raise ValueError(f"not a number: {text!r}")
    sign, whole, fraction, exp_sign, exp_digits = m.groups()
    fraction = fraction or ""
    mantissa = (whole + fraction).lstrip("0")
    stripped = mantissa.rstrip("0")
    if not stripped:
        return (False, "", 0)  # zero, whatever its sign and exponent
    shift = len(mantissa) - len(stripped) - len(fraction)  # value = stripped × 10^(exponent + shift)
    exp_digits = (exp_digits or "0").lstrip("0")
    exp_negative = exp_sign == "-" and bool(exp_digits)
    exponent: Union[int, str]
    if len(exp_digits) <= _SMALL_EXPONENT:
        exponent = (-int(exp_digits) if exp_negative else int(exp_digits or "0")) + shift
        if not -_LONG_EXPONENT < exponent < _LONG_EXPONENT:  # the form long exponents take, so both compare
            exponent = str(exponent)
    else:
        negative, digits = _add_digits(exp_negative, exp_digits, shift)
        exponent = ("-" if negative and digits else "") + (digits or "0")
    return (sign == "-", stripped, exponent)


def decimal_key(value: Any) -> Tuple[bool, str, Union[int, str]]:
    """``(negative, significant digits, exponent of the last digit)``: equal for two numbers exactly when their
    decimal values are (zero is ``(False, "", 0)``). A ``float`` counts as the decimal its ``repr`` names, a
    :class:`JSONNumber` as its text. Raises ``ValueError`` for NaN and infinities (not JSON)."""
    if isinstance(value, JSONNumber):
        return _key_of_text(value.text)
    if isinstance(value, bool):
        raise ValueError("a bool is not a JSON number")
    if isinstance(value, int):
        if value == 0:
            return (False, "", 0)
        text = str(abs(value))
        digits = text.rstrip("0")
        return (value < 0, digits, len(text) - len(digits))
    if isinstance(value, float):
        if value != value or value in (_INF, _NEG_INF):
            raise ValueError(f"{value!r} is not a JSON number")
        return _key_of_text(repr(value))
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise ValueError(f"{value!r} is not a JSON number")
        return _key_of_text(str(value))
    raise ValueError(f"not a number: {value!r}")


_TWO_53 = float(2 ** 53)
_INF = float("inf")
_NEG_INF = float("-inf")


def numbers_equal(a: Any, b: Any) -> bool:
    """Whether two numbers (``int``, ``float``, ``Decimal``, :class:`JSONNumber`) have the same exact decimal
    value (SPEC §16.1): ``1 == 1.0 == JSONNumber('1e0')``, ``-0.0 == 0``, but ``2**53 + 1 != 2**53``,
    ``JSONNumber('0.10000000000000001') != 0.1`` and ``10**23 == 1e23`` (the float's text is ``1e+23``)."""
    ta, tb = type(a), type(b)
    if ta is tb and (ta is int or ta is float):
        return a == b  # ints exactly; two floats are equal doubles exactly when their repr texts are equal
    if (ta is int and tb is float) or (ta is float and tb is int):
        f, n = (a, b) if ta is float else (b, a)
        if f != f or f in (_INF, _NEG_INF):
            return False
        if -_TWO_53 < f < _TWO_53:  # there a float's repr value is the float itself
            return f == n
    try:
        return decimal_key(a) == decimal_key(b)
    except ValueError:
        return a == b


# -- parsing and writing ---------------------------------------------------------------------------------------

def parse_float(text: str) -> Any:
    """``json.loads``'s ``parse_float``: a ``float`` when faithful (its repr has the text's value), else a
    :class:`JSONNumber` keeping the text."""
    value = float(text)
    if len(text) <= 16 and "e" not in text and "E" not in text:
        return value  # at most 15 digits (the text has a '.'), between 1e-14 and 1e15: always faithful
    shortest = repr(value)
    if shortest == text:
        return value  # written by a shortest round-trip writer (Python, JavaScript, Swift): the common case
    if value not in (_INF, _NEG_INF) and _key_of_text(text) == _key_of_text(shortest):
        return value
    return JSONNumber(text)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_float=parse_float, parse_constant=_reject_constant)


def loads(text: Union[str, bytes]) -> Any:
    """``json.loads`` with exact numbers (:func:`parse_float`); NaN and Infinity are refused (not JSON)."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    return _DECODER.decode(text)


_MARK = "fluxbus-number-" + secrets.token_hex(16) + "-"
_MARKED = re.compile('"' + re.escape(_MARK) + r'([0-9]+)"')


def _number_text(value: decimal.Decimal) -> str:
    if isinstance(value, JSONNumber):
        return value.text
    if not value.is_finite():
        raise ValueError(f"{value!r} is not JSON")
    return str(value)  # '1E+400', '0.10', '-0': JSON numbers


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)`` that also writes a :class:`JSONNumber` as its text (and any finite
    ``Decimal`` as ``str()`` does). Values without one cost what ``json.dumps`` costs."""
    texts: List[str] = []

    def default(o: Any) -> Any:
        if isinstance(o, decimal.Decimal):
            texts.append(_number_text(o))
            return _MARK + str(len(texts) - 1)  # a placeholder string, replaced below
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

    text = json.dumps(value, default=default, **options)
    if texts:
        text = _MARKED.sub(lambda m: texts[int(m.group(1))], text)
    return text
