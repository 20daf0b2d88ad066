"""Finding the final answer in a model's text, and normalising answer strings.

Extraction (`extract_answer(text, mode)`): a model's solution is free text; the answer is in one
of a few conventional places. `mode="auto"` tries them in this documented order and returns the
first hit (the LAST occurrence within a method, since models revise themselves):

  1. "boxed"        `\\boxed{...}` or `\\fbox{...}`, nested braces matched (`\\boxed{\\frac{1}{2}}`)
  2. "hash"         a GSM8K-style line `#### 42`
  3. "phrase"       "the answer is 42" / "final answer: 42" (up to the end of the sentence/line)
  4. "last_number"  the last number in the text (`-1,234.5`, `3/4`)

`mode` may also name one method or a tuple of methods (tried in the given order).

Normalisation (`normalize_answer(s)`) maps surface variants of one answer to one string, so that
`"$1,000$"`, `"1000 dollars"` and `"\\boxed{1000}"`'s content compare equal as strings, and gives
`math_equal.py` a clean string to parse. It removes: `$`, `\\(..\\)`, thousands separators
(`1,234`, `1{,}234`), `%`, degree marks (`^\\circ`, `°`), `\\left`/`\\right`, spacing commands
(`\\!`, `\\,`, `\\;`), `\\text{...}`-style wrappers (keeping their content), a leading `x =`,
trailing unit words after a number (`12 cm`, `5 square units`; words of two letters or more,
and never "and"/"or"/"to"/..., so "5 or 7" stays "5or7"), trailing periods and all
whitespace; `\\dfrac`/`\\tfrac` become `\\frac` and `\\frac12` becomes `\\frac{1}{2}`.

Simplified on purpose: unspaced units (`5cm`) are not stripped (they read as a product of
symbols); `%` is dropped, so "50%" equals "50", not "0.5"; a mixed number `2\\frac{1}{2}` reads
as a product, as a parser would.
"""

from __future__ import annotations

import re

EXTRACT_ORDER = ("boxed", "hash", "phrase", "last_number")

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_HASH_RE = re.compile(r"####\s*([^\n]+)")
_PHRASE_RE = re.compile(
    r"(?:final answer|the answer)\s*(?:is|:|=)\s*:?\s*(.+?)(?:\.\s|\.?\s*$|\n)",
    re.IGNORECASE | re.MULTILINE,
)
_NUMBER_RE = re.compile(r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+)?")


def match_brace(s: str, start: int) -> int:
    """Index just past the `}` matching the `{` at `s[start]`, or -1 if unbalanced."""
    depth = 0
    for i in range(start, len(s)):
        if s[i] == "{":
            depth += 1
        elif s[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def find_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (nested braces allowed) or `\\boxed 5` (one token)."""
    answer = None
    for m in _BOXED_RE.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            end = match_brace(text, i)
            if end > 0:
                answer = text[i + 1 : end - 1]
        elif m.group(0).endswith(" ") or (i < len(text) and not text[i].isalpha()):
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                answer = token.group(0)
    return answer


def _find_hash(text: str) -> str | None:
    found = _HASH_RE.findall(text)
    return found[-1].strip() if found else None


def _find_phrase(text: str) -> str | None:
    found = _PHRASE_RE.findall(text)
    return found[-1].strip() if found else None


def _find_last_number(text: str) -> str | None:
    found = [m.rstrip(",") for m in _NUMBER_RE.findall(text)]
    found = [m for m in found if any(c.isdigit() for c in m)]
    return found[-1] if found else None


_METHODS = {
    "boxed": find_boxed,
    "hash": _find_hash,
    "phrase": _find_phrase,
    "last_number": _find_last_number,
}


def extract_answer(text: str, mode: str | tuple[str, ...] = "auto") -> str | None:
    """The model's final answer (un-normalised), or None if no method finds one."""
    methods = EXTRACT_ORDER if mode == "auto" else (mode,) if isinstance(mode, str) else mode
    for name in methods:
        if name not in _METHODS:
            raise ValueError(f"unknown extraction method {name!r}; use one of {EXTRACT_ORDER}")
        answer = _METHODS[name](text or "")
        if answer is not None and answer.strip():
            return answer.strip()
    return None


# ---------------------------------------------------------------------------- normalisation

_WRAPPERS_RE = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{")
_DROP = (
    "\\left",
    "\\right",
    "\\displaystyle",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\ ",
    "\\%",
    "\\$",
    "%",
    "$",
    "°",
    "~",
)
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree")
_FRAC_SHORT_RE = re.compile(r"\\frac\s*(\d|[a-zA-Z])\s*(\d|[a-zA-Z])")
_SQRT_SHORT_RE = re.compile(r"\\sqrt\s*(\d+|[a-zA-Z])")
_THOUSANDS_RE = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d+)?$")
_LEADING_VAR_RE = re.compile(r"^[a-zA-Z]\s*=(?!=)\s*")
_NUMBER_HEAD = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?"
_NOT_UNITS = r"(?!(?:and|or|to|plus|minus|times|over|not)\b)"
_UNIT_WORD = rf"{_NOT_UNITS}[a-zA-Z]{{2,}}"
_TRAILING_UNITS_RE = re.compile(rf"^({_NUMBER_HEAD})\s+{_UNIT_WORD}(?:\s+{_UNIT_WORD})*(?:\^\d)?$")


def _unwrap(s: str) -> str:
    """`\\text{ cm}` -> ` cm` (keep content, drop the command and its braces)."""
    while True:
        m = _WRAPPERS_RE.search(s)
        if not m:
            return s
        end = match_brace(s, m.end() - 1)
        if end < 0:
            return s[: m.start()] + s[m.end() :]
        s = s[: m.start()] + " " + s[m.end() : end - 1] + " " + s[end:]


def normalize_answer(s: str) -> str:
    """Canonical string form of an answer (see module docstring for the rules)."""
    s = (s or "").strip()
    for open_, close in (("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(open_) and s.endswith(close):
            s = s[2:-2]
    s = _unwrap(s)
    s = _DEGREE_RE.sub("", s)
    s = s.replace("{,}", "")
    for token in _DROP:
        s = s.replace(token, " " if token.startswith("\\") and len(token) > 2 else "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = " ".join(s.split()).strip().rstrip(".").strip()
    s = _LEADING_VAR_RE.sub("", s)
    units = _TRAILING_UNITS_RE.match(s)
    if units:
        s = units.group(1)
    s = s.replace(" ", "")
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    if len(s) == 3 and s[0] + s[2] in ("()", "[]") and s[1].isalpha():
        s = s[1]  # "(B)" -> "B": multiple-choice letters
    return s
