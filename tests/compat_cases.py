"""The requests `test_compat` sends to vLLM's server and to tailguard, and how two
answers are compared: equal shape (keys and value types, recursively) and equal values,
except ids and clocks (`VOLATILE`, compared by type) and the deliberate differences."""

from __future__ import annotations

from dataclasses import dataclass

NAME = "tailguard-tiny-llama"
# Differ between any two calls of the same server: compared by type only.
VOLATILE = frozenset({"id", "created", "created_at", "completed_at", "item_id"})


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: dict | None = None


def _completion(name: str, **body) -> Case:
    return Case(name, "POST", "/v1/completions", {"model": NAME, "temperature": 0, **body})


def _chat(name: str, **body) -> Case:
    messages = body.pop("messages", [{"role": "user", "content": "Tell me about rivers."}])
    return Case(name, "POST", "/v1/chat/completions",
                {"model": NAME, "temperature": 0, "messages": messages, **body})


def _responses(name: str, **body) -> Case:
    return Case(name, "POST", "/v1/responses",
                {"model": NAME, "temperature": 0, "input": "Tell me about rivers.", **body})


USAGE = {"include_usage": True}
SCHEMA = {"type": "object", "properties": {"river": {"type": "string"}},
          "required": ["river"]}

CASES = [
    _completion("completion", prompt="The quick brown fox", max_tokens=8),
    _completion("completion_stop", prompt="One, two, three,", max_tokens=16, stop=[","]),
    _completion("completion_echo_logprobs", prompt="Hello there", max_tokens=4, echo=True,
                logprobs=2),
    _completion("completion_seeded_n2", prompt="Once upon", max_tokens=6, n=2,
                temperature=0.8, seed=7),
    _completion("completion_token_ids", prompt=[1, 200, 300, 400], max_tokens=5),
    _completion("completion_two_prompts", prompt=["A cat", "A dog"], max_tokens=4),
    _completion("completion_stream", prompt="Streams of", max_tokens=6, stream=True,
                stream_options=USAGE),
    _completion("completion_vllm_params", prompt="Rivers", max_tokens=6, top_k=5,
                min_tokens=3, ignore_eos=True, repetition_penalty=1.2, min_p=0.05),
    _chat("chat", max_tokens=8),
    _chat("chat_system_stop", max_completion_tokens=12, stop=["."],
          messages=[{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hello"}]),
    _chat("chat_logprobs", max_tokens=4, logprobs=True, top_logprobs=2),
    _chat("chat_stream", max_tokens=6, stream=True, stream_options=USAGE),
    _chat("chat_json_schema", max_tokens=16, response_format={
        "type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}),
    _responses("responses", max_output_tokens=8),
    _responses("responses_stream", max_output_tokens=6, stream=True),
    _responses("responses_messages", max_output_tokens=6, instructions="Be brief.",
               input=[{"role": "user", "content": "Hi"}]),
    Case("tokenize", "POST", "/tokenize", {"model": NAME, "prompt": "Hello world"}),
    Case("tokenize_token_strs", "POST", "/tokenize",
         {"model": NAME, "prompt": "Hello world", "add_special_tokens": False,
          "return_token_strs": True}),
    Case("tokenize_chat", "POST", "/tokenize",
         {"model": NAME, "messages": [{"role": "user", "content": "Hi"}],
          "add_generation_prompt": True}),
    Case("detokenize", "POST", "/detokenize", {"model": NAME, "tokens": [1, 200, 300, 400]}),
    Case("models", "GET", "/v1/models"),
    Case("health", "GET", "/health"),
    Case("ping_get", "GET", "/ping"),
    Case("ping_post", "POST", "/ping"),
    Case("version", "GET", "/version"),
    Case("load_idle", "GET", "/load"),
    # refusals: equal status, and the OpenAI error object (see `error_view`)
    _completion("error_negative_max_tokens", prompt="x", max_tokens=-1),
    _completion("error_unknown_model_completion", prompt="x", model="no-such-model"),
    _chat("error_unknown_model_chat", model="no-such-model"),
    _responses("error_unknown_model_responses", model="no-such-model"),
    _responses("error_responses_stream_too_long", stream=True, input="river " * 5000),
    _chat("error_chat_stream_too_long", stream=True,
          messages=[{"role": "user", "content": "river " * 5000}]),
    Case("error_unknown_model_tokenize", "POST", "/tokenize",
         {"model": "no-such-model", "prompt": "x"}),
    # stored responses are off on both (vLLM keeps them only with
    # VLLM_ENABLE_RESPONSES_API_STORE=1): an id is not found either way
    Case("error_retrieve_a_response", "GET", "/v1/responses/resp_0123456789abcdef"),
    Case("error_cancel_a_response", "POST", "/v1/responses/resp_0123456789abcdef/cancel"),
    Case("error_tokenize_no_prompt", "POST", "/tokenize", {"model": NAME}),
    Case("error_detokenize_not_ids", "POST", "/detokenize", {"model": NAME, "tokens": "x"}),
]


@dataclass(frozen=True)
class Deliberate:
    why: str
    adjust: object  # body -> the part both servers must agree on


def error_view(body):
    """Of an error answer, what both must agree on: an `error` object with the same
    fields. Deliberately different: `type` is OpenAI's per-status name (vLLM sends its
    exception's class name, e.g. "BadRequestError"), `code` a stable short string that
    the trace log and metrics also carry (vLLM sends the HTTP status as an int), and
    the message is tailguard's."""
    if not isinstance(body, dict) or "error" not in body:
        return body
    return {"error": sorted(body["error"])}


ERROR_CASE = Deliberate("error type/code/message are OpenAI's and tailguard's", error_view)
DELIBERATE = {case.name: ERROR_CASE for case in CASES if case.name.startswith("error_")}


def stream_view(events: list) -> list:
    """A stream as both servers must agree on it whatever the timing: vLLM merges a
    request's token deltas while its reader lags (on its own server as on ours), so
    consecutive text deltas are joined and sequence numbers follow the joined events."""
    merged: list = []
    for name, data in events:
        if merged and _joinable(*merged[-1]) and _joinable(name, data):
            merged[-1] = (name, _joined(merged[-1][1], data))
        else:
            merged.append((name, data))
    for number, (_, data) in enumerate(merged):
        if isinstance(data, dict) and "sequence_number" in data:
            data["sequence_number"] = number
    return merged


def _joinable(name, data) -> bool:
    if name == "response.output_text.delta":
        return not data.get("logprobs")
    if name is not None or not isinstance(data, dict) or data.get("usage"):
        return False
    choices = data.get("choices") or []
    return len(choices) == 1 and choices[0].get("finish_reason") is None \
        and choices[0].get("logprobs") is None \
        and ("text" in choices[0] or (choices[0].get("delta") or {}).get("content"))


def _joined(first: dict, then: dict) -> dict:
    if "delta" in first and "choices" not in first:  # a Responses text delta
        return {**first, "delta": first["delta"] + then["delta"]}
    (a,), (b,) = first["choices"], then["choices"]
    if "text" in a:
        return {**first, "choices": [{**a, "text": a["text"] + b["text"]}]}
    delta = {**a["delta"], "content": a["delta"]["content"] + b["delta"]["content"]}
    return {**first, "choices": [{**a, "delta": delta}]}


def shape(value):
    """Keys and value types, recursively: the JSON's form without its contents."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [shape(v) for v in value]
    return type(value).__name__


def comparable(value):
    """The value with ids and clocks replaced by their type."""
    if isinstance(value, dict):
        return {k: type(v).__name__ if k in VOLATILE else comparable(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [comparable(v) for v in value]
    return value
