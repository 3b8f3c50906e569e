"""Drives an ilb data plane with the official openai SDK: every call must behave as it does
against OpenAI itself (chat, legacy completions, the Responses API, errors). Usage:
check_openai.py BASE_URL MODEL [CA_FILE]. With CA_FILE (an https BASE_URL), the SDK trusts that
CA, and a client that does not must fail to connect. Exits non-zero on any mismatch."""
import ssl
import sys

import openai
from openai import OpenAI

base, model = sys.argv[1], sys.argv[2]
ca = sys.argv[3] if len(sys.argv) > 3 else None
http_client = None
if ca:
    http_client = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca))
    untrusting = OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0, timeout=30)
    try:
        untrusting.models.list()
        raise AssertionError("a client without the CA connected")
    except openai.APIConnectionError:
        pass
client = OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0, timeout=30, http_client=http_client)

ids = [m.id for m in client.models.list().data]
assert model in ids, f"{model} not in {ids}"
retrieved = client.models.retrieve(model)
assert retrieved.id == model and retrieved.object == "model", retrieved
assert retrieved.model_extra.get("max_model_len"), f"the engine's fields are kept: {retrieved}"
try:
    client.models.retrieve("no-such-model")
    raise AssertionError("an unknown model was retrieved")
except openai.NotFoundError:
    pass
try:
    client.responses.retrieve("resp_never_stored")
    raise AssertionError("an unknown response was retrieved")
except openai.NotFoundError:
    pass

messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
reply = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
assert reply.object == "chat.completion", reply
assert reply.choices[0].message.role == "assistant"
assert reply.choices[0].message.content, reply
assert reply.choices[0].finish_reason == "length", reply.choices[0].finish_reason
assert reply.usage.completion_tokens == 8, reply.usage
assert reply.usage.prompt_tokens > 0, reply.usage

stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=6, stream=True, stream_options={"include_usage": True}
)
text, usage, finish = "", None, None
for chunk in stream:
    assert chunk.object == "chat.completion.chunk", chunk
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
assert text, "streamed no content"
assert finish == "length", finish
assert usage is not None and usage.completion_tokens == 6, usage

legacy = client.completions.create(model=model, prompt="Once upon a time", max_tokens=5, stream=True)
legacy_text = "".join(choice.text for chunk in legacy for choice in chunk.choices)
assert legacy_text, "legacy completion streamed no text"

# The Responses API: a stored response, a follow-up naming it (only the engine that stored it
# can answer), and the streamed event sequence.
first = client.responses.create(model=model, input="Say hello.", instructions="Be brief.", max_output_tokens=6)
assert first.object == "response", first
assert first.id.startswith("resp_"), first.id
assert first.output_text, first
assert first.usage.output_tokens == 6, first.usage
for turn in range(4):
    follow = client.responses.create(
        model=model, input=f"And again, turn {turn}.", previous_response_id=first.id, max_output_tokens=4
    )
    assert follow.output_text, follow
    first = follow
events = list(
    client.responses.create(model=model, input="Stream it.", max_output_tokens=5, stream=True, previous_response_id=first.id)
)
kinds = [event.type for event in events]
assert kinds[0] == "response.created", kinds
assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
assert deltas and kinds.count("response.output_text.delta") == 5, kinds
assert events[-1].response.output_text == deltas, (events[-1].response.output_text, deltas)

try:
    client.responses.create(model="no-such-model", input="hi")
    raise AssertionError("unknown model did not raise")
except openai.NotFoundError as e:
    assert "no-such-model" in str(e), e

try:
    client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
    raise AssertionError("unknown model did not raise")
except openai.NotFoundError as e:
    assert "no-such-model" in str(e), e

try:
    client.chat.completions.create(model=model, messages=messages, max_tokens=4, n=2)
    raise AssertionError("n=2 did not raise")
except openai.BadRequestError:
    pass

print("openai sdk checks passed")
