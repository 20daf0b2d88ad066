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

Characters a model plausibly types are mapped to what LaTeX writes first: the minus sign
U+2212, en and figure dashes -> `-`; non-breaking, thin and other Unicode spaces -> ` `
(zero-width ones are dropped); `×`, `·`, `⋅`, `÷` -> `\\times`, `\\cdot`, `\\div`; `π` -> `\\pi`,
`√` -> `\\sqrt`; full-width ASCII (`１２`, `＋`) -> ASCII. Superscript digits are not mapped
(`x²` stays unparsed rather than becoming `x2`).

Work is linear in the input, whatever its length (the text and the answer are model-written,
the reference is dataset-written; none is trusted to be short): braces are matched in one pass
over the whole text (`brace_pairs`), the last occurrence is found by scanning matches from the
end, and no regex can backtrack over a long run (the phrase's end is found with a plain
search, not a lazy `.+?` before `\\s*$`).

Simplified on purpose: unspaced units (`5cm`) are not stripped (they read as a product of
symbols); `%` is dropped, so "50%" equals "50", not "0.5"; a mixed number `2\\frac{1}{2}` reads
as a product, as a parser would.
"""

from __future__ import annotations

import re

EXTRACT_ORDER = ("boxed", "hash", "phrase", "last_number")

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_BOXED_TOKEN_RE = re.compile(r"[^\s$]+")
_HASH_RE = re.compile(r"####\s*([^\n]+)")
_PHRASE_RE = re.compile(r"(?:final answer|the answer)\s*(?:is|:|=)\s*:?\s*", re.IGNORECASE)
_PHRASE_END_RE = re.compile(r"\.\s|\n")  # the sentence or the line ends
# minus sign, en dash, figure dash, small and full-width hyphen-minus: a model's "−3" is -3,
# in raw text too (the last number of "x = −3" must not read as 3)
_MINUS_SIGNS = "\u2212\u2013\u2012\ufe63\uff0d"
_NUMBER_RE = re.compile(rf"[-{_MINUS_SIGNS}]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+)?")


def match_brace(s: str, start: int) -> int:
    """Index just past the `}` matching the `{` at `s[start]`, or -1 if unbalanced. One scan of
    the rest of `s`: for many lookups in one string use `brace_pairs`."""
    depth = 0
    for i in range(start, len(s)):
        if s[i] == "{":
            depth += 1
        elif s[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def brace_pairs(s: str) -> dict[int, int]:
    """{index of `{`: index just past its matching `}`} for every balanced pair in `s`, in one
    pass over a stack of open braces (so `pairs[i]` == `match_brace(s, i)` where it is > 0)."""
    pairs, open_ = {}, []
    for i, ch in enumerate(s):
        if ch == "{":
            open_.append(i)
        elif ch == "}" and open_:
            pairs[open_.pop()] = i + 1
    return pairs


def find_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (nested braces allowed) or `\\boxed 5` (one token).
    An unbalanced `\\boxed{` is skipped in favour of the one before it."""
    pairs = brace_pairs(text)
    for m in reversed(list(_BOXED_RE.finditer(text))):
        i = m.end()
        if i < len(text) and text[i] == "{":
            if i in pairs:
                return text[i + 1 : pairs[i] - 1]
        elif m.group(0).endswith(" ") or (i < len(text) and not text[i].isalpha()):
            token = _BOXED_TOKEN_RE.match(text, i)
            if token:
                return token.group(0)
    return None


def _find_hash(text: str) -> str | None:
    found = _HASH_RE.findall(text)
    return found[-1].strip() if found else None


def _find_phrase(text: str) -> str | None:
    """What follows the last "the answer is" / "final answer:" that is followed by something,
    up to the end of its sentence (". ") or line, without a final period."""
    for m in reversed(list(_PHRASE_RE.finditer(text))):
        end = _PHRASE_END_RE.search(text, m.end())
        answer = text[m.end() : end.start() if end else len(text)].strip()
        if end is None or end.group() == "\n":
            answer = answer.removesuffix(".").strip()
        if answer:
            return answer
    return None


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
_UNICODE = str.maketrans(
    {
        **{c: "-" for c in _MINUS_SIGNS},
        **{c: " " for c in "\u00a0\u2002\u2003\u2007\u2009\u200a\u202f\u205f\u3000"},
        **{c: None for c in "\u200b\u200c\u200d\u2060\ufeff"},  # zero-width
        **{chr(c): chr(c - 0xFEE0) for c in range(0xFF01, 0xFF5F)},  # full-width ASCII
        "×": "\\times ",
        "·": "\\cdot ",
        "⋅": "\\cdot ",
        "÷": "\\div ",
        "π": "\\pi ",
        "√": "\\sqrt",
        "\u2044": "/",  # fraction slash
        "\u2215": "/",  # division slash
    }
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
    """`\\text{ cm}` -> ` cm ` (keep content, drop the command and its braces); an unclosed
    wrapper loses only its command and `{`. One pass, nested wrappers included."""
    pairs = brace_pairs(s)
    cuts: list[tuple[int, int, str]] = []  # (start, end, replacement), not overlapping
    for m in _WRAPPERS_RE.finditer(s):
        brace = m.end() - 1
        if brace in pairs:
            cuts += [(m.start(), m.end(), " "), (pairs[brace] - 1, pairs[brace], " ")]
        else:
            cuts.append((m.start(), m.end(), ""))
    out, last = [], 0
    for start, end, replacement in sorted(cuts):
        out += [s[last:start], replacement]
        last = end
    out.append(s[last:])
    return "".join(out)


def normalize_answer(s: str) -> str:
    """Canonical string form of an answer (see module docstring for the rules)."""
    s = (s or "").translate(_UNICODE).strip()
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
