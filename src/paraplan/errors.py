"""Exceptions raised by paraplan.

    PlannerError(Exception)                 base of everything paraplan raises on purpose
    ├── SpecError(PlannerError, ValueError)  bad user input or preset: names the field and allowed values
    │   └── LayoutError(SpecError)           a layout breaks a Megatron rule (message mirrors Megatron's)
    ├── NoFeasiblePlanError                  the search found no layout that fits (carries the rejections)
    └── IngestError                          a log could not be read at all

The CLI maps SpecError -> exit 1, NoFeasiblePlanError -> exit 3; it prints one line, no traceback
unless ``--debug``.
"""

from __future__ import annotations

from collections.abc import Mapping


class PlannerError(Exception):
    """Base class for errors paraplan raises deliberately."""


class Field(str):
    """An input field's name inside a ``SpecError.naming`` message (``str``: the library's wording of it)."""

    __slots__ = ()


class SpecError(PlannerError, ValueError):
    """Invalid input: a model, cluster, training or layout field has a value we cannot accept."""

    parts: tuple[str, ...] = ()
    """The message in pieces, the input fields it names as ``Field``s (``naming``); empty for a plain message."""

    @classmethod
    def naming(cls, *parts: str) -> SpecError:
        """The error whose message is ``parts`` joined, each ``Field`` among them worded as its field name; a
        caller words the fields in its own terms with ``worded`` (the CLI: as its flags)."""
        err = cls("".join(parts))
        err.parts = parts
        return err

    def worded(self, words: Mapping[str, str]) -> str:
        """The message with each field it names worded as ``words[field]`` (others as their field name)."""
        if not self.parts:
            return str(self)
        return "".join(words.get(p, p) if isinstance(p, Field) else p for p in self.parts)


class LayoutError(SpecError):
    """A parallel layout violates one of Megatron-LM's validation rules.

    ``reason`` is the rejection code (see ``paraplan.layout.Reason``).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class NoFeasiblePlanError(PlannerError):
    """No candidate layout satisfies the constraints; ``rejections`` counts them per reason."""

    def __init__(self, message: str, *, rejections: Mapping[str, int], summary: str | None = None,
                 advice: tuple[object, ...] = (), examples: Mapping[str, str] | None = None,
                 num_evaluated: int = 0, smallest: tuple[str, float] | None = None) -> None:
        super().__init__(message)
        self.smallest = smallest
        """The smallest-footprint layout that broke no rule (its short text) and its peak bytes; None: none."""
        self.rejections = dict(rejections)
        self.summary = message if summary is None else summary
        """The message without its advice (what was searched and rejected)."""
        self.advice = advice
        """What would make a layout fit, as data (``paraplan.search.FitTip``s); the message words them in the
        library's terms, the CLI in its flags."""
        self.examples = dict(examples or {})
        self.num_evaluated = num_evaluated

    def to_dict(self) -> dict[str, object]:
        """JSON for ``plan --format json`` when nothing fits: the message and the rejection summary."""
        return {"error": str(self), "num_evaluated": self.num_evaluated, "num_feasible": 0, "candidates": [],
                "rejections": dict(sorted(self.rejections.items(), key=lambda kv: -kv[1])),
                "rejection_examples": self.examples}


class IngestError(PlannerError):
    """A run log could not be read (missing file, unknown format)."""
