"""A calculator tool: exact arithmetic on + - * / and parentheses, never `eval`.

    calc = Calculator()
    calc("3*(5+7)")   -> "36"
    calc("7/2")       -> "7/2"          exact fractions, as the countdown task counts
    calc("1/0")       -> "error: division by zero"
    calc("__import__('os')") -> "error: expected a number or '(' but found '_' at 0"

It parses with the countdown task's own recursive-descent parser (minirl/tasks/countdown.py:
exact fractions, a length cap, a nesting cap), so a model under RL pressure can neither run code
nor hang the run through it: whatever it writes, the answer is a value or a one-line error.
"""

from __future__ import annotations

from minirl.tasks.countdown import _Malformed, _Parser  # the task's safe parser, shared


class Calculator:
    """The tool `calc`: an arithmetic expression in, its exact value (or an error) out."""

    name = "calc"

    def __init__(self, max_chars: int = 128, max_depth: int = 16):
        self.max_chars, self.max_depth = max_chars, max_depth

    def __call__(self, call: str) -> str:
        text = call.strip()
        if len(text) > self.max_chars:
            return f"error: longer than {self.max_chars} characters"
        parser = _Parser(text, self.max_depth)
        try:
            value = parser.parse()
        except _Malformed as e:
            return f"error: {e}"
        if parser.div_by_zero:
            return "error: division by zero"
        return str(value.numerator) if value.denominator == 1 else str(value)
