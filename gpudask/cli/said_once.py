"""Saying a thing once for several processes: the same reason in every worker but for its
own GPU's number, UUID, CPUs or port (``gpudask info --reasons``: one templated line, ``N``
for the worker's number, ``…`` for its own value), or in the scheduler and the client but
for naming themselves."""

from __future__ import annotations

import re
from collections.abc import Callable

_UUID = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


def shape(text: str) -> str:
    """``text`` with its numbers and UUIDs blanked: two workers' reasons of the same shape are
    one rule applied to each worker's own GPU, CPUs or port."""
    return re.sub(r"[0-9a-f]*\d[0-9a-f]*", "#", _UUID.sub("#", text))


def _by_word(texts: list[str], merged: Callable[[list[str], str, list[str], str], None]) -> str:
    """``texts`` word by word: a word they share as it is; where they differ,
    ``merged(out, head, middles, tail)`` adds what stands for them (``head`` and ``tail``:
    what they share of that word, :func:`common_edge`)."""
    split = [t.split(" ") for t in texts]
    out: list[str] = []
    for k, word in enumerate(split[0]):
        words = [s[k] for s in split]
        if len(set(words)) == 1:
            out.append(word)
            continue
        head = common_edge(words, front=True)
        tail = common_edge([w[len(head):] for w in words], front=False)
        merged(out, head, [w[len(head):len(w) - len(tail)] for w in words], tail)
    return " ".join(out)


def template(texts: list[str], numbers: list[str]) -> str:
    """One text for several of the same shape (:func:`shape`): a word where they differ is
    ``N`` when each has its own worker number there, else ``…`` inside what they share of it
    (``GPU-…),``); a run of such words (a list of peers) is one ``…``."""
    def merged(out: list[str], head: str, middles: list[str], tail: str) -> None:
        placeholder = head + ("N" if middles == numbers else "…") + tail
        if placeholder.strip(",;") == "…" and out and out[-1].strip(",;") == "…":
            out[-1] = placeholder  # "peers 1, 2, 3" -> "peers …"
        else:
            out.append(placeholder)

    return _by_word(texts, merged)


def common_edge(texts: list[str], front: bool) -> str:
    """What ``texts`` share at their start (``front``) or end, cut after (before) a character
    that is not a letter or digit, so no word is split: ``GPU-`` of two UUIDs, ``),`` at an end."""
    shared = ""
    for chars in zip(*(t if front else t[::-1] for t in texts)):
        if len(set(chars)) > 1:
            break
        shared += chars[0]
    while shared and shared[-1].isalnum():
        shared = shared[:-1]
    return shared if front else shared[::-1]


def template_roles(texts: list[str], roles: list[str]) -> str:
    """One text for the same reason in several processes that differ only by naming their own
    role (``the scheduler mapped`` / ``the client mapped``): ``the scheduler/client mapped``."""
    return _by_word(texts, lambda out, head, middles, tail: out.append(head + "/".join(middles) + tail))
