"""What every generation backend is: the interface (:class:`Backend`), what it is asked to serve
(:class:`BackendJob`), the prepared samples (:class:`Item`) and the EOS ids every backend stops at. A backend is one
module of this package with one :class:`Backend` subclass, named in the registry (``backends.BACKENDS``)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Hashable, Sequence

if TYPE_CHECKING:
    from . import BackendSettings


@dataclass
class Item:
    """One prepared sample: its id and the prompt's token ids."""

    id: object
    input_ids: list[int]
    extra: dict = field(default_factory=dict)


OnDone = Callable[[Item, list[int]], None]


@dataclass(frozen=True)
class BackendJob:
    """What a backend is asked to serve: its settings, the model's config read once (``rope_scaling.load.ModelConfig``:
    the RoPE flags applied), the tokenizer, and the sizes of the run."""

    settings: BackendSettings
    cfg: Any  # rope_scaling.load.ModelConfig
    tokenizer: Any
    model: Any = None  # an already-loaded model (hf; tests, benchmarks)
    max_model_len: int | None = None  # what the run asks for (vllm)
    need_len: int | None = None  # the longest prompt + max new tokens (vllm)
    short_len: int | None = None  # the shortest prompt + max new tokens (vllm, longrope)
    log: Callable[[str], None] | None = None


class Backend(ABC):
    """What every generation backend is: a new backend is one subclass (its ``name`` and ``help``, :meth:`plan`,
    :meth:`describe`, :meth:`generate`) in a module of its own and its name in ``backends.BACKENDS``."""

    name: ClassVar[str]
    help: ClassVar[str]  # --backend's help for it

    @classmethod
    @abstractmethod
    def plan(cls, job: BackendJob) -> tuple[Hashable, Callable[[], "Backend"]]:
        """(what must be equal for a backend built for another job to serve this one, a function that builds it).
        A job the backend cannot run is refused here (InputError), before anything is written."""

    @abstractmethod
    def describe(self) -> dict:
        """What run.json records about the backend (``info.backend_info``)."""

    @abstractmethod
    def generate(self, items: Sequence[Item], max_new_tokens: int, min_new_tokens: int, on_done: OnDone) -> None:
        """Greedy continuations of every item; ``on_done(item, new token ids cut at the first EOS)`` as each
        finishes."""


def eos_ids_of(model_dir, config, tokenizer) -> list[int]:
    """EOS ids from the model's generation_config.json, else its config, else the tokenizer."""
    eos = None
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
    except (OSError, ValueError):
        eos = None
    return _as_list(eos) or _as_list(getattr(config, "eos_token_id", None)) or _as_list(tokenizer.eos_token_id)


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(v) for v in x] if isinstance(x, (list, tuple)) else [int(x)]
