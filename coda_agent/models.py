"""Vision-language models behind one batched interface: a local `transformers` checkpoint or an
OpenAI-compatible HTTP endpoint (how vLLM and SGLang serve Qwen2.5-VL and UI-TARS).

A conversation is a list of chat messages in the OpenAI shape, with images given as arrays or PIL images:

    [{"role": "system", "content": "..."},
     {"role": "user", "content": [{"type": "image", "image": frame}, {"type": "text", "text": "..."}]},
     {"role": "assistant", "content": "Thought: ...\\nAction: "}]      # optional: a prefix to continue

When the last message is the assistant's, the model continues it (the executor's "thought as the start of
its answer"). `generate` takes a list of conversations and returns one `Generation` per conversation.
Nothing here downloads weights: a path must be a local directory, an endpoint must already be serving.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from .types import Conversation

# Qwen2.5-VL's image processor defaults: 14-px patches merged 2x2, so sizes are multiples of 28.
IMAGE_FACTOR = 28
VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 16384 * 28 * 28


class ModelError(RuntimeError):
    """A model could not be loaded or did not answer; the message says which and why."""


@dataclass
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy decoding
    top_p: float = 1.0
    seed: int | None = None
    logprobs: bool = False  # return the sampled tokens' log-probabilities (training)


@dataclass
class Generation:
    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_tokens: int | None = None
    seconds: float = 0.0


class VLM(Protocol):
    name: str
    min_pixels: int
    max_pixels: int

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams) -> list[Generation]: ...


@dataclass
class Attempt:
    """One try of `generate_until_parsed`: the generation, its 1-based number, and what `parse` made of it
    (`value`) or why it failed (`error`)."""

    number: int
    generation: Generation
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def generate_until_parsed(
    model: VLM,
    conversations: Sequence[Conversation],
    params: SamplingParams,
    parse: Callable[[str], Any],
    tries: int = 3,
    errors: tuple[type[BaseException], ...] = (ValueError,),
) -> list[list[Attempt]]:
    """Sample each conversation until `parse(text)` succeeds or `tries` are spent; the conversations whose
    answer failed to parse are re-sampled together, one batched `generate` per try. `parse` raising one of
    `errors` is a failed try (anything else propagates). Returns each conversation's attempts in order: the
    last is the one that counts (`ok` when it parsed). The one retry loop of the executor and UI-TARS."""
    out: list[list[Attempt]] = [[] for _ in conversations]
    todo = list(range(len(conversations)))
    for number in range(1, max(1, tries) + 1):
        if not todo:
            break
        gens = model.generate([conversations[i] for i in todo], params)
        failed = []
        for i, g in zip(todo, gens):
            try:
                out[i].append(Attempt(number, g, value=parse(g.text)))
            except errors as e:
                out[i].append(Attempt(number, g, error=str(e)))
                failed.append(i)
        todo = failed
    return out


def smart_resize(
    height: int,
    width: int,
    factor: int = IMAGE_FACTOR,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> tuple[int, int]:
    """The (height, width) Qwen2.5-VL resizes an image to: both multiples of `factor`, area within
    [min_pixels, max_pixels], aspect ratio kept as closely as that allows. UI-TARS-1.5 answers in pixel
    coordinates of this resized image."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio of {width}x{height} is over 200")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def model_image_size(model: VLM, screen: tuple[int, int]) -> tuple[int, int]:
    """(width, height) of the image the model sees for a screenshot of `screen` = (width, height)."""
    h, w = smart_resize(screen[1], screen[0], min_pixels=model.min_pixels, max_pixels=model.max_pixels)
    return w, h


def to_pil(image):
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ModelError(f"images must be (H, W, 3) uint8 arrays or PIL images, got {arr.dtype} {arr.shape}")
    return Image.fromarray(arr)


def _parts(content) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


# ------------------------------------------------------------------------------------------ transformers
class TransformersVLM:
    """A Qwen2.5-VL-family checkpoint (Qwen2.5-VL-7B/32B, UI-TARS-1.5-7B, ...) from a local directory, on GPU
    when there is one. `build_inputs` is public: the trainer uses the same tensors to score log-probs."""

    def __init__(
        self,
        path: str | os.PathLike,
        device: str | None = None,
        dtype: str | None = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        name: str | None = None,
    ):
        path = Path(path).expanduser()
        if not path.is_dir():
            raise ModelError(
                f"model path {str(path)!r} is not a directory; coda never downloads weights: give "
                "a local checkpoint directory or an http(s):// OpenAI-compatible endpoint"
            )
        if not (path / "config.json").exists():
            raise ModelError(f"{str(path)!r} holds no config.json: not a transformers checkpoint")
        import torch
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = (
            getattr(torch, dtype) if dtype else (torch.bfloat16 if self.device.startswith("cuda") else torch.float32)
        )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self.image_processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
            self.model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot load the model in {str(path)!r}: {e}") from e
        self.model.to(self.device).eval()
        self.tokenizer.padding_side = "left"
        if not self.tokenizer.chat_template:
            for f in ("chat_template.jinja", "chat_template.json"):
                if (path / f).exists():
                    t = (path / f).read_text()
                    self.tokenizer.chat_template = json.loads(t)["chat_template"] if f.endswith("json") else t
                    break
            else:
                raise ModelError(f"{str(path)!r} has no chat template (tokenizer_config.json or chat_template.*)")
        ip = self.image_processor
        self.merge_size = getattr(ip, "merge_size", 2)
        # vision placeholders are the processor's to place, never the model's to write: a sampled
        # <|image_pad|> would break the image-token count when the answer is scored or shown again
        vocab = self.tokenizer.get_vocab()
        self.banned_token_ids = [vocab[t] for t in VISION_TOKENS if t in vocab]
        size = getattr(ip, "size", None) or {}
        self.min_pixels = min_pixels or size.get("shortest_edge") or getattr(ip, "min_pixels", DEFAULT_MIN_PIXELS)
        self.max_pixels = max_pixels or size.get("longest_edge") or getattr(ip, "max_pixels", DEFAULT_MAX_PIXELS)
        self.name = name or path.name
        self.path = path

    def _template(self, conv: Conversation) -> tuple[str, list]:
        msgs, images = [], []
        for m in conv:
            parts = []
            for p in _parts(m["content"]):
                if p["type"] == "image":
                    images.append(to_pil(p["image"]))
                    parts.append({"type": "image"})
                else:  # text (task files, earlier answers) cannot smuggle in placeholders
                    parts.append({"type": "text", "text": _strip_vision_tokens(p["text"])})
            msgs.append({"role": m["role"], "content": parts})
        prefill = conv[-1]["role"] == "assistant"
        text = self.tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=not prefill, continue_final_message=prefill
        )
        return text, images

    def build_inputs(
        self, conversations: Sequence[Conversation], completions: Sequence[str] | Sequence[Sequence[int]] | None = None
    ):
        """Tokenized, left-padded model inputs for a batch of conversations.

        With `completions` (texts or token ids), each is appended *as tokens* after its prompt's tokens, the
        way generation produced them: tokenizing prompt + completion as one string would merge tokens across
        the boundary (`Action: ` + `click` -> `Ġclick`) and score a sequence the model never sampled. Then
        `completion_mask` marks the completion tokens (for losses and log-probs)."""
        texts, images = [], []
        for conv in conversations:
            text, imgs = self._template(conv)
            texts.append(text)
            images.extend(imgs)
        comp_ids = None
        if completions is not None:
            comp_ids = [
                list(c) if not isinstance(c, str) else self.tokenizer(c, add_special_tokens=False)["input_ids"]
                for c in completions
            ]
        return self._encode(texts, images, comp_ids)

    def _encode(self, texts: list[str], images: list, completion_ids: list[list[int]] | None = None):
        """What Qwen2_5_VLProcessor does for text and images: each <|image_pad|> becomes as many pads as the
        image has merged patches. Done here because that processor cannot be built without torchvision
        (its video half), and the image and text halves are all an agent needs."""
        from transformers import BatchFeature

        torch = self.torch
        data: dict = {}
        if images:
            img = self.image_processor(images=images, return_tensors="pt")
            data.update(pixel_values=img["pixel_values"], image_grid_thw=img["image_grid_thw"])
            counts = iter((img["image_grid_thw"].prod(-1) // self.merge_size**2).tolist())
            pad, out = "<|image_pad|>", []
            for t in texts:
                pieces = t.split(pad)
                s = pieces[0]
                for p in pieces[1:]:
                    s += pad * next(counts) + p
                out.append(s)
            texts = out
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        comp = completion_ids or [[] for _ in ids]
        seqs = [a + list(b) for a, b in zip(ids, comp)]
        width = max(len(q) for q in seqs)
        input_ids = torch.full((len(seqs), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(seqs), width), dtype=torch.long)
        comp_mask = torch.zeros((len(seqs), width), dtype=torch.bool)
        for i, (q, c) in enumerate(zip(seqs, comp)):  # left padding, as generation wants
            input_ids[i, width - len(q) :] = torch.tensor(q, dtype=torch.long)
            attention[i, width - len(q) :] = 1
            if len(c):
                comp_mask[i, width - len(c) :] = True
        data.update(input_ids=input_ids, attention_mask=attention)
        if completion_ids is not None:
            data["completion_mask"] = comp_mask
        return BatchFeature(data).to(self.device)

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams) -> list[Generation]:
        if not conversations:
            return []
        torch = self.torch
        t0 = time.monotonic()
        inputs = self.build_inputs(conversations)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        sample = params.temperature > 0
        gen_kw = dict(
            max_new_tokens=params.max_new_tokens,
            do_sample=sample,
            return_dict_in_generate=True,
            output_scores=params.logprobs,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        if self.banned_token_ids:
            gen_kw["suppress_tokens"] = self.banned_token_ids
        if sample:
            gen_kw.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        else:
            gen_kw.update(temperature=None, top_p=None, top_k=None)
        with torch.no_grad():
            out = self.model.generate(**inputs, **gen_kw)
        n_prompt = inputs["input_ids"].shape[1]
        new = out.sequences[:, n_prompt:]
        lp = None
        if params.logprobs:
            lp = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        eos = set(_as_list(self.model.generation_config.eos_token_id)) | {self.tokenizer.pad_token_id}
        seconds = (time.monotonic() - t0) / len(conversations)
        gens = []
        for i in range(len(conversations)):
            ids = new[i].tolist()
            end = next((j + 1 for j, t in enumerate(ids) if t in eos), len(ids))
            ids = ids[:end]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            gens.append(
                Generation(
                    text=text,
                    token_ids=ids,
                    logprobs=lp[i, :end].float().tolist() if lp is not None else None,
                    prompt_tokens=int(inputs["attention_mask"][i].sum()),
                    seconds=seconds,
                )
            )
        return gens


def _strip_vision_tokens(text: str) -> str:
    for t in VISION_TOKENS:
        text = text.replace(t, "")
    return text


def _as_list(x) -> list:
    return [] if x is None else (list(x) if isinstance(x, (list, tuple)) else [x])


# ------------------------------------------------------------------------------------------ HTTP
class OpenAIVLM:
    """A model served over the OpenAI chat-completions protocol (vLLM, SGLang, ...). Conversations of a batch
    are sent concurrently. Transient failures (connection refused, timeouts, 429, 5xx) are retried with
    exponential backoff; anything else, or a last failure, raises ModelError naming the endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 1.0,
        concurrency: int = 16,
        min_pixels: int = DEFAULT_MIN_PIXELS,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ):
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.api_key = api_key or os.environ.get("CODA_API_KEY") or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.timeout, self.retries, self.backoff, self.concurrency = timeout, retries, backoff, concurrency
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self._model = model
        self.name = model or self.base_url

    @property
    def model(self) -> str:
        """The served model's name; asked of the endpoint (GET /models) when not given."""
        if self._model is None:
            data = self._request("GET", "/models")
            try:
                self._model = data["data"][0]["id"]
            except (KeyError, IndexError, TypeError) as e:
                raise ModelError(f"{self.base_url}/models lists no model; pass the model name") from e
            self.name = self._model
        return self._model

    def _request(self, method: str, route: str, body: dict | None = None) -> dict:
        url = self.base_url + route
        data = json.dumps(body).encode() if body is not None else None
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            req = urllib.request.Request(
                url,
                data=data,
                method=method,
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                detail = e.read()[:500].decode(errors="replace")
                last = f"HTTP {e.code}: {detail}"
                if e.code != 429 and e.code < 500:
                    raise ModelError(f"model endpoint {url} refused the request: {last}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                reason = getattr(e, "reason", e)
                last = (
                    f"timed out after {self.timeout}s"
                    if isinstance(reason, TimeoutError) or "timed out" in str(reason)
                    else f"{reason}"
                )
            except json.JSONDecodeError as e:
                raise ModelError(f"model endpoint {url} answered with something that is not JSON: {e}") from None
        raise ModelError(
            f"model endpoint {url} did not answer after {self.retries + 1} tries: {last} "
            "(is the vLLM/SGLang server running at that address?)"
        )

    @staticmethod
    def _message(m: dict) -> dict:
        if isinstance(m["content"], str):
            return {"role": m["role"], "content": m["content"]}
        parts = []
        for p in m["content"]:
            if p["type"] == "image":
                buf = io.BytesIO()
                to_pil(p["image"]).save(buf, format="PNG", compress_level=1)
                url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                parts.append({"type": "text", "text": p["text"]})
        return {"role": m["role"], "content": parts}

    def _one(self, conv: Conversation, params: SamplingParams) -> Generation:
        t0 = time.monotonic()
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [self._message(m) for m in conv],
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.logprobs:
            body["logprobs"] = True
        if conv[-1]["role"] == "assistant":
            # vLLM/SGLang extension: continue the final assistant message instead of starting a new one
            body.update(continue_final_message=True, add_generation_prompt=False)
        data = self._request("POST", "/chat/completions", body)
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as e:
            raise ModelError(
                f"{self.base_url}/chat/completions answered without choices[0].message.content: {str(data)[:300]}"
            ) from e
        lps = None
        if params.logprobs and choice.get("logprobs"):
            lps = [t["logprob"] for t in choice["logprobs"].get("content") or []]
        return Generation(
            text=text,
            logprobs=lps,
            seconds=time.monotonic() - t0,
            prompt_tokens=(data.get("usage") or {}).get("prompt_tokens"),
        )

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams) -> list[Generation]:
        if len(conversations) <= 1:
            return [self._one(c, params) for c in conversations]
        with ThreadPoolExecutor(min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(lambda c: self._one(c, params), conversations))


def load_model(spec: str, model_name: str | None = None, **options) -> VLM:
    """`spec` is an http(s):// base URL of an OpenAI-compatible server, or a local checkpoint directory. Options
    that only a local model takes (device, dtype) are dropped for an endpoint."""
    if spec.startswith(("http://", "https://")):
        options = {k: v for k, v in options.items() if k not in ("device", "dtype")}
        return OpenAIVLM(spec, model=model_name, **options)
    return TransformersVLM(spec, name=model_name, **options)
