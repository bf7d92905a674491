"""A fast Hugging Face tokenizer loaded from a local folder, with the model facts Cleave needs.

Always loads with local_files_only: serving processes must never reach for the
hub at run time, and a missing file should fail at startup, not mid-request.
"""

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from libs.tokenization.chat import ChatMessage, render_chat

log = structlog.get_logger(__name__)

_GENERATION_CONFIG_FILE = "generation_config.json"


@dataclass(frozen=True)
class TokenizerConfig:
    # Folder holding tokenizer.json / tokenizer_config.json (an HF model folder).
    path: Path
    # Overrides the model's own chat template (base models often ship none).
    chat_template: str | None = None


class Tokenizer:
    """Encodes, decodes and renders chats for one model."""

    def __init__(
        self,
        hf_tokenizer: PreTrainedTokenizerBase,
        *,
        eos_token_ids: Sequence[int],
        chat_template: str | None,
        source: str,
    ) -> None:
        # The detokenizer decodes a sliding window per streamed chunk; only the
        # Rust-backed tokenizer is fast enough for that.
        if not hf_tokenizer.is_fast:
            raise ValueError(f"tokenizer at {source} is not a fast (tokenizers-backed) tokenizer")
        self._hf = hf_tokenizer
        # transformers' decode is the Rust tokenizer's plus an optional clean-up of spaces;
        # without the clean-up, the Rust call alone (a third of the time per streamed token).
        cleans_up = getattr(hf_tokenizer, "clean_up_tokenization_spaces", False)
        self._backend = None if cleans_up else hf_tokenizer.backend_tokenizer
        self._eos_token_ids = tuple(dict.fromkeys(eos_token_ids))
        self._chat_template = chat_template
        self._source = source

    @classmethod
    def from_config(cls, config: TokenizerConfig) -> "Tokenizer":
        path = Path(config.path)
        if not path.is_dir():
            raise FileNotFoundError(f"tokenizer folder {path} does not exist")
        try:
            hf_tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot load a tokenizer from {path}: {error}") from error
        eos_ids = _eos_token_ids(hf_tokenizer, path)
        chat_template = config.chat_template or _own_chat_template(hf_tokenizer)
        tokenizer = cls(
            hf_tokenizer,
            eos_token_ids=eos_ids,
            chat_template=chat_template,
            source=str(path),
        )
        log.info(
            "tokenizer.loaded",
            path=str(path),
            vocab_size=tokenizer.vocab_size,
            eos_token_ids=list(tokenizer.eos_token_ids),
            bos_token_id=tokenizer.bos_token_id,
            has_chat_template=chat_template is not None,
        )
        return tokenizer

    def copy(self) -> "Tokenizer":
        """An independent tokenizer for another thread: one HF fast tokenizer must not be
        used from several threads at once ("Already borrowed" once a call changes its
        truncation or padding state)."""
        return Tokenizer(
            copy.deepcopy(self._hf),
            eos_token_ids=self._eos_token_ids,
            chat_template=self._chat_template,
            source=self._source,
        )

    @property
    def vocab_size(self) -> int:
        # len() counts added/special tokens too, unlike HF's vocab_size; it is
        # the bound every id we may encode or decode stays below. (The model's
        # embedding table can be larger, padded for kernels.)
        return len(self._hf)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The tokenizer's eos first, then any extra ids from generation_config.json."""
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        bos = self._hf.bos_token_id
        return bos if isinstance(bos, int) else None

    @property
    def hf_tokenizer(self) -> PreTrainedTokenizerBase:
        """The Hugging Face tokenizer, for vLLM's tool parsers (same thread rule as `copy`)."""
        return self._hf

    @property
    def has_chat_template(self) -> bool:
        return self._chat_template is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # Text from render_chat already holds the template's special tokens:
        # encode it with add_special_tokens=False or bos is doubled.
        ids = self._hf.encode(text, add_special_tokens=add_special_tokens)
        return [int(token_id) for token_id in ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        text = self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if not isinstance(text, str):
            raise TypeError(f"decode returned {type(text).__name__}, not str")
        return text

    def decoder_json(self) -> str | None:
        """This tokenizer's decoding as `tokenizers` JSON (libs/tokenization/decoder.py), or
        None when decoding needs transformers too (its clean-up of tokenization spaces)."""
        return None if self._backend is None else self._backend.to_str()

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool = True,
        *,
        continue_final_message: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """Renders messages with the model's chat template; raises ValueError on bad input."""
        return render_chat(
            self._hf,
            self._chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            template_kwargs=template_kwargs,
            source=self._source,
        )


def _own_chat_template(hf_tokenizer: PreTrainedTokenizerBase) -> str | None:
    template = hf_tokenizer.chat_template
    # Some models ship a dict of named templates; "default" is the chat one.
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def _eos_token_ids(hf_tokenizer: PreTrainedTokenizerBase, path: Path) -> list[int]:
    # Instruct models often end turns with a token that differs from the
    # tokenizer's eos (e.g. <|eot_id|> vs <|end_of_text|>); generation_config
    # lists all of them, and the engine must stop on any.
    ids: list[int] = []
    if isinstance(hf_tokenizer.eos_token_id, int):
        ids.append(hf_tokenizer.eos_token_id)
    if (path / _GENERATION_CONFIG_FILE).is_file():
        generation = GenerationConfig.from_pretrained(str(path), local_files_only=True)
        extra = generation.eos_token_id
        if isinstance(extra, int):
            ids.append(extra)
        elif isinstance(extra, list):
            ids.extend(int(token_id) for token_id in extra)
    return ids
