"""The one pattern for every choice made by name in a config field: a `Registry` of the named things (functions,
classes, specs), each registered once beside its code, that the config check, the error messages and --help read.

    ENGINES = Registry("rollout.engine", "decoding engine")

    @ENGINES.register("lean", "a Python loop over the model's one-token forwards")
    def decode(...): ...

    ENGINES.get(name)      # the registered thing, or a ValueError naming the field and listing the valid names
    name in ENGINES        # a Mapping: sorted(ENGINES), ENGINES.items(), ENGINES[name]
    ENGINES.help()         # one line per name with its doc, for --help

Adding a choice edits one file: its registration, beside its code. Standard library only.
"""

from __future__ import annotations

from typing import Any, Generic, Iterator, Mapping, TypeVar

T = TypeVar("T")
_DECORATE = object()
"""`register`'s value when none is given: it returns a decorator (None is a value one can register)."""


class Registry(Mapping[str, T], Generic[T]):
    """Named choices of one kind: the valid values of the config field `field`, each with a one-line doc."""

    def __init__(self, field: str, what: str) -> None:
        self.field, self.what = field, what
        self._entries: dict[str, T] = {}
        self.docs: dict[str, str] = {}

    def register(self, name: str, doc: str = "", value: Any = _DECORATE) -> Any:
        """Register `value` under `name`, or, without a value, return a decorator that registers what it decorates.
        The doc defaults to the first paragraph of the value's docstring. A name registered twice is an error."""
        def add(thing: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.field}: a {self.what} named {name!r} is registered already")
            self._entries[name] = thing
            text = doc or (getattr(thing, "__doc__", None) or "").strip().split("\n\n")[0]
            self.docs[name] = " ".join(text.split())
            return thing

        return add if value is _DECORATE else add(value)

    def unregister(self, name: str) -> T:
        """Remove `name` and return what it held (a test or a plugin that registered something for a while)."""
        self.docs.pop(name, None)
        return self._entries.pop(name)

    def get(self, name: str) -> T:
        """The thing registered under `name`; an unknown name is a ValueError naming the field and the valid names."""
        if name not in self._entries:
            raise ValueError(f"{self.field}: unknown {self.what} {name!r}; use one of {sorted(self._entries)}")
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def help(self) -> str:
        """`field`: one line per registered name with its doc."""
        width = max((len(n) for n in self._entries), default=0)
        return "\n".join([f"{self.field} ({self.what}):"] + [f"  {n:<{width}}  {self.docs[n]}".rstrip()
                                                             for n in self._entries])

