"""A model's tokenizer and chat template (``Preprocessor``, loaded from the HF files of its model card).

Reads ``tokenizer.json`` (HF ``tokenizers``), ``tokenizer_config.json`` (``chat_template``, special
tokens), optionally ``chat_template.jinja``, ``generation_config.json`` (eos ids) and ``config.json``
(context length). Chat templates are rendered the way ``transformers`` renders them: a sandboxed jinja2
environment with ``trim_blocks``/``lstrip_blocks`` and loop controls, a ``tojson`` filter, the
``raise_exception`` and ``strftime_now`` globals, and ``messages``, ``add_generation_prompt`` and the
special tokens (``bos_token``, ``eos_token``, ...) as variables. The rendered chat is tokenized without
adding special tokens again (the template places them); a completions prompt is tokenized with them.
Long prompts are tokenized off the event loop (``encode_off_loop``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from dynamo_api.errors import DynamoError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.protocol import ServingFeatures

__all__ = [
    "THREAD_TOKENIZE_CHARS",
    "ModelFiles",
    "Preprocessor",
    "TemplateError",
    "encode_off_loop",
]

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
DEFAULT_CONTEXT_LENGTH = 8192
# Prompts at least this long (characters) are tokenized in a thread: a few milliseconds of tokenizing
# would otherwise stall every stream this frontend relays. Shorter ones cost less than the hop.
THREAD_TOKENIZE_CHARS = 4096


async def encode_off_loop(chars: int, encode: Callable[..., list[int]], *args: Any) -> list[int]:
    """``encode(*args)``, in a thread when the text is ``chars`` >= ``THREAD_TOKENIZE_CHARS`` long."""
    if chars < THREAD_TOKENIZE_CHARS:
        return encode(*args)
    return await asyncio.to_thread(encode, *args)


class TemplateError(DynamoError):
    """The chat template refused the messages (``raise_exception``) or failed to render."""


@dataclass(frozen=True)
class ModelFiles:
    """What the frontend knows about a model besides its tokenizer (card values win over files)."""

    context_length: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    features: ServingFeatures = field(default_factory=ServingFeatures)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    content = value.get("content") if isinstance(value, dict) else None
    return content if isinstance(content, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


class Preprocessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        chat_template: str | None,
        special_tokens: dict[str, str],
        eos_token_ids: Sequence[int],
        context_length: int,
        features: ServingFeatures | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.features = features or ServingFeatures()  # what the model serves (from its model card)
        self.special_tokens = special_tokens
        self.eos_token_ids = tuple(eos_token_ids)
        self.context_length = context_length
        self._template: jinja2.Template | None = None
        if chat_template:
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
            )
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = _strftime_now
            self._template = env.from_string(chat_template)

    @classmethod
    def from_dir(cls, model_dir: Path, card: ModelFiles | None = None) -> Preprocessor:
        model_dir = Path(model_dir)
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tok_config = _read_json(model_dir / "tokenizer_config.json")
        template = tok_config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = model_dir / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text()
        special = {k: v for k in _SPECIAL_KEYS if (v := _token_text(tok_config.get(k))) is not None}
        card = card or ModelFiles()
        eos = list(card.eos_token_ids)
        if not eos:
            gen_eos = _read_json(model_dir / "generation_config.json").get("eos_token_id")
            eos = gen_eos if isinstance(gen_eos, list) else [gen_eos] if isinstance(gen_eos, int) else []
        if not eos and "eos_token" in special:
            eos_id = tokenizer.token_to_id(special["eos_token"])
            eos = [eos_id] if eos_id is not None else []
        context = card.context_length or _read_json(model_dir / "config.json").get("max_position_embeddings")
        if not isinstance(context, int) or context <= 0:
            context = DEFAULT_CONTEXT_LENGTH
        return cls(
            tokenizer,
            chat_template=template,
            special_tokens=special,
            eos_token_ids=eos,
            context_length=context,
            features=card.features,
        )

    # --- prompts ------------------------------------------------------------------------------

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The chat as text. ``template_kwargs`` become template variables (``tools``,
        ``reasoning_effort``, a request's ``chat_template_kwargs``)."""
        if self._template is None:
            raise InvalidRequest(
                "This model has no chat template (tokenizer_config.json has no 'chat_template'); "
                "use /v1/completions with a plain prompt instead.",
                param="messages",
                code="no_chat_template",
            )
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                **({"tools": None, "documents": None} | self.special_tokens | (template_kwargs or {})),
            )
        except TemplateError as e:
            raise InvalidRequest(
                f"The model's chat template refused the messages: {e}",
                param="messages",
                code="chat_template_error",
            ) from None
        except jinja2.TemplateError as e:
            raise InvalidRequest(
                f"The model's chat template could not render the messages: {e}",
                param="messages",
                code="chat_template_error",
            ) from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            # a template reading a value the request sent in a shape it does not expect (a replayed
            # tool call's arguments, a chat_template_kwargs value)
            raise InvalidRequest(
                f"The model's chat template could not render the request ({type(e).__name__}: {e}); check "
                "the shape of the messages' tool calls and of chat_template_kwargs.",
                param="messages",
                code="chat_template_error",
            ) from None

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt, template_kwargs)
        return self._encode(text, add_special_tokens=False)

    def encode_prompt(self, prompt: str) -> list[int]:
        return self._encode(prompt, add_special_tokens=True)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # encode_batch_fast gives the same ids as encode but releases the GIL while it works, so a long
        # prompt tokenized in a thread leaves the event loop free; it keeps no offsets (only ids are
        # used), which is 40% of the time of a 12k-token prompt.
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def check_ids(self, ids: Sequence[int], param: str = "prompt") -> None:
        """Raise ``InvalidRequest`` naming ``param[i]`` for the first id outside the vocabulary."""
        vocab = self._vocab_size
        if not ids or max(ids) < vocab:  # the common case at C speed: a long prompt costs microseconds
            return
        for i, t in enumerate(ids):
            if t >= vocab:
                raise InvalidRequest(
                    f"Token id {t} is outside the model's vocabulary (size {vocab}).",
                    param=f"{param}[{i}]",
                    code="invalid_value",
                )

    # --- output -------------------------------------------------------------------------------

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)
