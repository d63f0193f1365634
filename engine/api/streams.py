"""The wire form of a change stream's answer (``pull_changes``, ``pull_consumer``).

The stream service answers with a :class:`~reptables.engine.node.stream_service.PullAnswer`: the
events as maps, or - for a table whose log SQLite can describe - as the JSON text SQLite built for
each event (``tablets/changes.read_json``), so that a consumer keeping up with a busy table costs
the writers' process one string per change instead of a parse, a map and an encoding. Here, and
only here, either becomes the answer's wire form: ``{"events": [...], "event_token": ...,
"timestamp": ...}``, with each event's ``commit_end`` (whether the next event belongs to another
commit) added to the texts.
"""

from __future__ import annotations

from typing import Any

from ..node.stream_service import PullAnswer
from .results import Plain


def pull_answer(answer: PullAnswer) -> Plain:
    """The answer as a plain structured value (a map, or its JSON text already: ``formats.dump_plain_structured``)."""
    texts = answer.event_texts
    if texts is None:
        value: Any = {"events": answer.events, "event_token": answer.event_token, "timestamp": answer.timestamp}
        return Plain(value)
    last = len(texts) - 1
    events = ",".join(f'{text},"commit_end":{"true" if i == last or texts[i + 1][0] != ts else "false"}}}'
                      for i, (ts, text) in enumerate(texts))
    return Plain(f'{{"events":[{events}],"event_token":"{answer.event_token}","timestamp":{answer.timestamp}}}'
                 .encode())
