"""Which engine of a cluster a caller sends to, and where a request that failed may be sent again.

A table cluster may be served by a leader engine and standbys over one database (docs/storage.md,
"Leadership and fencing"). A caller given every engine's URL - the typed client (``Client``,
``AsyncClient``), and an engine calling a peer cluster (``peers/directory.py``) - needs the same
rules, written once here:

* a request goes to the engine that led last, as far as the caller knows (:attr:`LeaderRoute.proxy_url`);
* it is sent again only if no engine acted on it: a refused connection (it never left), or an answer
  saying the engine is not the leader (``not_leader``: a standby, or a leader whose lease ran out or
  that was replaced; it did nothing). Such an answer names the leader (``leader_url``): the request
  goes there, else to the next URL;
* any other failure (a timeout, a reset: the engine may have acted) is the caller's to handle, and
  the *next* request goes to the next URL;
* an engine that got no answer through is not followed back to for a while (``suspect_seconds``),
  even if a standby still names it: a paused leader whose lease has not run out yet;
* at most twice around the URLs, then the last error is the caller's (a takeover in progress).

``follow_unlisted``: whether a leader named outside the URLs given is followed (and added to them).
The typed client follows it; an engine calling a peer does not: the peer's token belongs to the URLs
of its ``//sys/clusters`` entry, and an engine never sends a secret to an address it was not given
(the next URL of the entry leads there as well).

Threads share a route: the URLs and the current one change by reference assignments, and two
threads that move it at once both leave it at a URL of the list.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def normal_url(url: str) -> str:
    """``url`` without surrounding blanks or trailing slashes, ``http://`` added when it has no scheme."""
    url = url.strip()
    return (url if "://" in url else f"http://{url}").rstrip("/")


def split_urls(proxy_url: str | Sequence[str]) -> list[str]:
    """The URLs of one URL, several separated by commas, or a list of them (each may hold commas too):
    stripped, empty ones dropped, in order, without normalizing them."""
    given = [proxy_url] if isinstance(proxy_url, str) else list(proxy_url)
    return [u.strip() for g in given for u in str(g).split(",") if u.strip()]


class LeaderRoute:
    """The engines of one cluster a caller may send to, and the one it sends to now."""

    def __init__(self, urls: Sequence[str], suspect_seconds: float, follow_unlisted: bool = True) -> None:
        if not urls:
            raise ValueError("A route needs the URL of at least one engine")
        #: the engines' URLs: the ones given, and (``follow_unlisted``) leaders' addresses learned since
        self.urls: list[str] = list(dict.fromkeys(normal_url(u) for u in urls))
        self._current = 0
        #: when a request to an engine last got no answer through (a timeout, a reset, a refusal)
        self._unanswered: dict[str, float] = {}
        self.suspect_seconds = suspect_seconds
        self.follow_unlisted = follow_unlisted

    @property
    def proxy_url(self) -> str:
        """The URL requests go to now."""
        urls = self.urls
        return urls[self._current % len(urls)]

    def after_no_answer(self, sent_to: str, attempt: int, never_sent: bool) -> str | None:
        """A request to ``sent_to`` got no answer (its ``attempt``-th failure): the URL to send it to again
        if it ``never_sent`` (a refused connection), else None (raise). Either way the next request goes
        to the next URL that got answers lately."""
        self._unanswered[sent_to] = time.monotonic()
        self._move_on(sent_to, time.monotonic())
        if never_sent and self.proxy_url != sent_to and attempt <= 2 * len(self.urls):
            return self.proxy_url
        return None

    def after_not_leader(self, sent_to: str, attempt: int, leader_url: Any) -> str | None:
        """``sent_to`` answered that it is not the leader (it did nothing), naming ``leader_url`` (or not):
        the URL to send the request to, or None (raise the answer)."""
        if attempt > 2 * len(self.urls) + 1:
            return None
        now = time.monotonic()
        if isinstance(leader_url, str) and leader_url.strip():
            leader = normal_url(leader_url)
            if leader != sent_to and not self._suspect(leader, now) and (self.follow_unlisted or leader in self.urls):
                if leader not in self.urls:
                    self.urls = [*self.urls, leader]
                self._current = self.urls.index(leader)
                return leader
        self._move_on(sent_to, now)
        return self.proxy_url if self.proxy_url != sent_to else None

    def answered(self, url: str) -> None:
        """An engine answered (whatever it said): it is not suspected of being away any more."""
        if url in self._unanswered:
            self._unanswered.pop(url, None)

    def _suspect(self, url: str, now: float) -> bool:
        failed = self._unanswered.get(url)
        return failed is not None and now - failed < self.suspect_seconds

    def _move_on(self, sent_to: str, now: float) -> None:
        """The next URL after ``sent_to`` that got answers lately becomes the current one (unless another
        thread moved on already)."""
        urls = self.urls
        if len(urls) < 2 or self.proxy_url != sent_to or sent_to not in urls:
            return
        at = urls.index(sent_to)
        for step in range(1, len(urls)):
            candidate = (at + step) % len(urls)
            if not self._suspect(urls[candidate], now):
                self._current = candidate
                return
