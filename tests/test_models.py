"""Model access: a tiny real Qwen2.5-VL through transformers, and the OpenAI-compatible HTTP client against a
local stand-in server (a stand-in: real vLLM/SGLang need a GPU and weights)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import ThreadingHTTPServer

import numpy as np
import pytest

from coda_agent.models import (
    DEFAULT_MAX_PIXELS,
    ModelError,
    OpenAIVLM,
    SamplingParams,
    load_model,
    model_image_size,
    smart_resize,
)

pytest.importorskip("torch")

from .conftest import JSONHandler


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory):
    from coda_agent.models import TransformersVLM
    from coda_agent.tiny import build_tiny_qwen2_5_vl

    path = build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny") / "qwen2_5_vl")
    return TransformersVLM(path)


def _screen(seed=0, shape=(800, 1280, 3)):
    return np.random.default_rng(seed).integers(0, 255, shape, dtype=np.uint8)


def test_tiny_model_batched_generation_with_prefill_and_logprobs(tiny_vlm):
    convs = [
        [{"role": "user", "content": [{"type": "image", "image": _screen(0)}, {"type": "text", "text": "hi"}]}],
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "image", "image": _screen(1)}, {"type": "text", "text": "go"}]},
            {"role": "assistant", "content": "Thought: open the console\nAction: "},
        ],
    ]
    gens = tiny_vlm.generate(convs, SamplingParams(max_new_tokens=12, temperature=1.0, logprobs=True, seed=3))
    assert len(gens) == 2
    for g in gens:
        assert isinstance(g.text, str) and 1 <= len(g.token_ids) <= 12
        assert len(g.logprobs) == len(g.token_ids) and all(lp <= 0.0 for lp in g.logprobs)
    # the prefilled turn is continued, not closed: the prompt ends with the prefix, no generation header after
    text, images = tiny_vlm._template(convs[1])
    assert text.endswith("Thought: open the console\nAction: ") and len(images) == 1
    assert text.count("<|im_start|>assistant") == 1
    # greedy decoding is deterministic
    a = tiny_vlm.generate(convs[:1], SamplingParams(max_new_tokens=8))
    b = tiny_vlm.generate(convs[:1], SamplingParams(max_new_tokens=8))
    assert a[0].token_ids == b[0].token_ids


def test_the_model_never_writes_vision_placeholders(tiny_vlm):
    """A sampled <|image_pad|> (or one typed into a task's text) would break the image-token count when the
    answer is shown again in the next prompt or scored by the trainer: generation suppresses them and the
    template strips them from text."""
    conv = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": _screen(2)},
                {"type": "text", "text": "say <|image_pad|><|vision_start|> now"},
            ],
        }
    ]
    text, _ = tiny_vlm._template(conv)
    assert text.count("<|image_pad|>") == 1 and text.count("<|vision_start|>") == 1  # only the real image's
    banned = set(tiny_vlm.banned_token_ids)
    assert len(banned) >= 4
    gens = tiny_vlm.generate([conv] * 8, SamplingParams(max_new_tokens=48, temperature=1.0, seed=0, logprobs=True))
    assert not banned & {t for g in gens for t in g.token_ids}
    # each answer goes back into a conversation as history and still encodes and runs
    conv2 = conv + [
        {"role": "assistant", "content": gens[0].text},
        {"role": "user", "content": [{"type": "image", "image": _screen(3)}]},
    ]
    enc = tiny_vlm.build_inputs([conv2], [gens[1].token_ids])
    enc.pop("completion_mask")
    assert tiny_vlm.model(**enc).logits.shape[1] == enc["input_ids"].shape[1]


def test_image_tokens_match_smart_resize(tiny_vlm):
    """The processor's patch grid is the image size the executor maps UI-TARS coordinates from."""
    conv = [{"role": "user", "content": [{"type": "image", "image": _screen()}, {"type": "text", "text": "x"}]}]
    enc = tiny_vlm.build_inputs([conv])
    t, gh, gw = enc["image_grid_thw"][0].tolist()
    w, h = model_image_size(tiny_vlm, (1280, 800))
    assert (gw * 14, gh * 14) == (w, h)
    pad = tiny_vlm.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((enc["input_ids"] == pad).sum()) == t * gh * gw // 4


def test_smart_resize_figures():
    assert smart_resize(800, 1280) == (812, 1288)
    assert smart_resize(1080, 1920) == (1092, 1932)
    h, w = smart_resize(10000, 10000)
    assert h * w <= DEFAULT_MAX_PIXELS and h % 28 == 0 and w % 28 == 0
    h, w = smart_resize(30, 40, min_pixels=100 * 28 * 28)
    assert h * w >= 100 * 28 * 28 and h % 28 == 0


def test_missing_path_says_so(tmp_path):
    with pytest.raises(ModelError, match="not a directory; coda never downloads"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ModelError, match="no config.json"):
        load_model(str(tmp_path))


# ------------------------------------------------------------------------------------------ HTTP stand-in
class _StandIn(JSONHandler):
    """Speaks the part of the OpenAI chat-completions protocol the client uses. Behaviour per model name:
    'ok' answers; 'flaky' fails twice with 503 then answers; 'slow' sleeps past the client timeout; 'bad'
    answers 400."""

    seen: list[dict] = []
    failures: dict[str, int] = {}

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "ok", "object": "model"}]})
        else:
            self._send(404, {"error": "no such route"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["_auth"] = self.headers.get("Authorization")
        _StandIn.seen.append(body)
        model = body["model"]
        if model == "bad":
            return self._send(400, {"error": {"message": "max_tokens too large"}})
        if model == "flaky" and _StandIn.failures.get("flaky", 0) < 2:
            _StandIn.failures["flaky"] = _StandIn.failures.get("flaky", 0) + 1
            return self._send(503, {"error": "warming up"})
        if model == "slow":
            time.sleep(1.0)
        last = body["messages"][-1]
        text = "Action: DONE" if last["role"] == "user" else "click(start_box='(10,20)')"
        self._send(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": {"content": [{"token": "a", "logprob": -0.5}]},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 42},
            },
        )


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # the 'slow' client hung up first: expected


@pytest.fixture
def stand_in():
    _StandIn.seen.clear()
    _StandIn.failures.clear()
    server = _Server(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _conv(prefill=False):
    c = [
        {"role": "user", "content": [{"type": "text", "text": "task"}, {"type": "image", "image": _screen()[:50, :80]}]}
    ]
    return c + [{"role": "assistant", "content": "Thought: t\nAction: "}] if prefill else c


def test_http_batch_images_prefill_and_model_discovery(stand_in, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    vlm = load_model(stand_in)  # no model name: asks GET /v1/models
    gens = vlm.generate([_conv(), _conv(prefill=True)], SamplingParams(max_new_tokens=5, logprobs=True))
    assert [g.text for g in gens] == ["Action: DONE", "click(start_box='(10,20)')"]
    assert gens[0].logprobs == [-0.5] and gens[0].prompt_tokens == 42 and vlm.name == "ok"
    by_prefill = {bool(b.get("continue_final_message")): b for b in _StandIn.seen}
    assert by_prefill[True]["add_generation_prompt"] is False
    img = by_prefill[False]["messages"][0]["content"][1]
    assert img["type"] == "image_url" and img["image_url"]["url"].startswith("data:image/png;base64,")
    assert all(b["_auth"] == "Bearer sk-test" and b["max_tokens"] == 5 for b in _StandIn.seen)


def test_http_retries_transient_errors(stand_in):
    vlm = OpenAIVLM(stand_in, model="flaky", retries=3, backoff=0.01)
    assert vlm.generate([_conv()], SamplingParams())[0].text == "Action: DONE"
    assert len(_StandIn.seen) == 3


def test_http_client_errors_are_clear(stand_in):
    with pytest.raises(ModelError, match="refused the request: HTTP 400.*max_tokens"):
        OpenAIVLM(stand_in, model="bad", backoff=0.01).generate([_conv()], SamplingParams())
    assert len(_StandIn.seen) == 1  # a 400 is not retried
    with pytest.raises(ModelError, match="did not answer after 2 tries: timed out"):
        OpenAIVLM(stand_in, model="slow", timeout=0.2, retries=1, backoff=0.01).generate([_conv()], SamplingParams())


def test_dead_endpoint_says_so():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    vlm = OpenAIVLM(f"http://127.0.0.1:{port}", model="m", retries=1, backoff=0.01)
    with pytest.raises(ModelError, match=r"did not answer after 2 tries.*is the vLLM/SGLang server running"):
        vlm.generate([_conv()], SamplingParams())
