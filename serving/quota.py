"""Bounds on the sequences one request and one client may ask of the engine.

`n` alone does not bound a request: a completion with a list of prompts makes one
engine request per prompt, each with `n` sequences, so 600 prompts x n=8 in a 3.6 KB
body asked for 4800 sequences and starved everyone else for half a minute. A request
may ask for at most `max_sequences` (prompts x n, 400 beyond), and one client may have
at most `max_client_sequences` in flight across its requests (429 with Retry-After
beyond; 0 turns the per-client bound off). A client is its API key's name, or its peer
address on a server without keys.
"""

from __future__ import annotations

from serving.errors import ApiError

CLIENT_RETRY_AFTER_S = 1


def sequences(request) -> int:
    """Sequences the engine will run for `request`: prompts x n (chat: one prompt)."""
    n = getattr(request, "n", 1) or 1
    prompt = getattr(request, "prompt", None)
    prompts = 1
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompts = len(prompt)  # a list of texts or of token-id lists
    embeds = getattr(request, "prompt_embeds", None)
    if isinstance(embeds, list) and embeds:
        prompts = max(prompts, len(embeds))
    return prompts * n


class SequenceQuota:
    """Sequences in flight per client; a request holds its share from admission until
    its record is finished (`release`, an observer listener)."""

    __slots__ = ("max_sequences", "max_client_sequences", "_held", "_by_client")

    def __init__(self, max_sequences: int, max_client_sequences: int):
        self.max_sequences = max_sequences
        self.max_client_sequences = max_client_sequences
        self._held: dict[str, tuple[str, int]] = {}  # request id -> (client, sequences)
        self._by_client: dict[str, int] = {}

    def take(self, rec, client: str, request) -> None:
        """Hold `request`'s sequences for `client`, or raise the 400/429 to answer."""
        count = sequences(request)
        if count > self.max_sequences:
            raise ApiError(400, "too_many_sequences",
                           f"this request asks for {count} sequences (prompts x n); this "
                           f"server allows {self.max_sequences} per request", "prompt")
        in_flight = self._by_client.get(client, 0)
        if self.max_client_sequences and in_flight + count > self.max_client_sequences:
            raise ApiError(429, "client_sequence_limit",
                           f"this client has {in_flight} sequences in flight; at most "
                           f"{self.max_client_sequences} are allowed at once",
                           headers={"Retry-After": str(CLIENT_RETRY_AFTER_S)})
        self._by_client[client] = in_flight + count
        self._held[rec.request_id] = (client, count)

    def release(self, rec) -> None:
        held = self._held.pop(rec.request_id, None)
        if held is None:
            return
        client, count = held
        left = self._by_client[client] - count
        if left:
            self._by_client[client] = left
        else:
            del self._by_client[client]

    def in_flight(self, client: str) -> int:
        return self._by_client.get(client, 0)
