"""A draft head's configuration, read from and written to the public EAGLE / EAGLE-3 ``config.json``.

EAGLE-1/2 heads (``kind="eagle"``): ``fc [H, 2H]`` over ``cat(embed(next token), feature)`` where the
feature is the verifier's final, normed hidden state, then ``num_hidden_layers`` Llama decoder layers
(the first without ``input_layernorm``), no final norm, the verifier's own ``lm_head``.

EAGLE-3 heads (``kind="eagle3"``): ``fc [H, 3 * target_hidden]`` over the hidden states entering the
verifier's decoder layers ``aux_layers`` (default ``2, L // 2, L - 3``), one ``midlayer`` whose attention
reads ``cat(input_layernorm(embed), hidden_norm(h))`` (q/k/v of width 2H), a final ``norm`` and an
``lm_head [draft_vocab, H]`` with ``d2t`` offsets to the verifier's ids.
"""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("eagle", "eagle3")


def _positive_int(name: str, value: Any) -> None:
    # bool is an int to Python, but `"vocab_size": true` is a broken config, not a vocabulary of one
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _is_index(value: Any) -> bool:
    """An integer layer number (numpy and torch integers too), not a bool, float or string."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def aux_layer_ids(data: dict[str, Any]) -> tuple[Any, ...] | None:
    """The verifier layers a config.json names for an EAGLE-3 head (``eagle_config.eagle_aux_hidden_state_layer_ids``
    or the same key at the top level), or ``None`` when it names none; a ``ValueError`` when the entry is not a
    list. An empty list is returned as ``()`` (not taken for a missing entry), so :class:`HeadConfig` refuses it."""
    eagle = data.get("eagle_config") or {}
    if not isinstance(eagle, dict):
        raise ValueError(f"eagle_config must be an object, got {eagle!r}")
    key = "eagle_aux_hidden_state_layer_ids"
    ids = eagle[key] if eagle.get(key) is not None else data.get(key)
    if ids is None:
        return None
    if not isinstance(ids, list):
        raise ValueError(f"eagle_aux_hidden_state_layer_ids must be a list of layer numbers, got {ids!r}")
    return tuple(ids)


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's layers (2, L//2, L-3) as in vLLM and SGLang, clamped into ``[1, L - 1]`` for very shallow models."""
    return tuple(min(max(i, 1), max(num_layers - 1, 1)) for i in (2, num_layers // 2, num_layers - 3))


@dataclass
class HeadConfig:
    """Shapes and settings of a draft head (see the module docstring)."""

    kind: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the verifier's vocabulary
    head_dim: int | None = None
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 8192
    hidden_act: str = "silu"
    draft_vocab_size: int | None = None  # EAGLE-3: rows of its lm_head (None: the full vocabulary)
    target_hidden_size: int | None = None  # the verifier's hidden size, when it differs from the head's
    aux_layers: tuple[int, ...] = ()  # EAGLE-3: verifier hidden states the fc reads
    norm_before_residual: bool = False  # EAGLE-3 variant (speculators): residual taken after hidden_norm
    extra: dict[str, Any] = field(default_factory=dict)  # other config.json keys, written back unchanged

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"head kind must be one of {KINDS}, got {self.kind!r}")
        self.validate()
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        self.target_hidden_size = self.target_hidden_size or self.hidden_size
        self.draft_vocab_size = self.draft_vocab_size or self.vocab_size
        self.aux_layers = tuple(operator.index(i) for i in self.aux_layers)

    def validate(self) -> None:
        """Refuse values no head can be built from (a ``ValueError`` naming the field), so a bad config.json
        fails here, in one line, rather than inside torch or transformers' config validation."""
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                     "num_hidden_layers", "max_position_embeddings"):
            _positive_int(name, getattr(self, name))
        for name in ("head_dim", "draft_vocab_size", "target_hidden_size"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
                    or (name == "rope_theta" and value == 0):
                raise ValueError(f"{name} must be a {'positive' if name == 'rope_theta' else 'non-negative'} number, "
                                 f"got {value!r}")
        from transformers.activations import ACT2FN

        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACT2FN:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not an activation transformers knows")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ValueError(f"rope_scaling must be an object, got {self.rope_scaling!r}")
        if not isinstance(self.norm_before_residual, bool):
            raise ValueError(f"norm_before_residual must be true or false, got {self.norm_before_residual!r}")
        if not isinstance(self.aux_layers, (list, tuple)) or any(not _is_index(i) for i in self.aux_layers):
            raise ValueError(f"eagle_aux_hidden_state_layer_ids must be a list of layer numbers, "
                             f"got {self.aux_layers!r}")
        if self.kind == "eagle3" and not self.aux_layers:
            raise ValueError("eagle_aux_hidden_state_layer_ids is empty: an EAGLE-3 head reads at least one layer")
        # transformers' Llama layer (norms, MLP, rotary) requires it, head_dim given or not
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} does not divide hidden_size "
                             f"{self.hidden_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads {self.num_key_value_heads} does not divide num_attention_heads "
                             f"{self.num_attention_heads} (grouped-query attention shares each key head evenly)")
        head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        if head_dim % 2:
            raise ValueError(f"head_dim {head_dim} is odd: rotary embeddings rotate pairs of channels")

    @classmethod
    def for_verifier(cls, verifier_config: Any, kind: str = "eagle3", draft_vocab_size: int | None = None) -> "HeadConfig":
        """A head shaped like one decoder layer of ``verifier_config`` (a transformers config)."""
        c = verifier_config.get_text_config() if hasattr(verifier_config, "get_text_config") else verifier_config
        layers = c.num_hidden_layers
        rope = dict(getattr(c, "rope_parameters", None) or {})  # transformers 5 keeps rope settings here
        theta = float(rope.pop("rope_theta", getattr(c, "rope_theta", 10000.0)))
        scaling = rope if rope.get("rope_type", "default") != "default" else None
        return cls(
            kind=kind, hidden_size=c.hidden_size,
            intermediate_size=getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * c.hidden_size,
            num_attention_heads=c.num_attention_heads,
            num_key_value_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
            head_dim=getattr(c, "head_dim", None), vocab_size=c.vocab_size,
            rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=getattr(c, "max_position_embeddings", 8192),
            hidden_act=getattr(c, "hidden_act", "silu"), draft_vocab_size=draft_vocab_size if kind == "eagle3" else None,
            aux_layers=default_aux_layers(layers) if kind == "eagle3" else (),
        )

    @property
    def feature_size(self) -> int:
        """Width of the verifier features the fc reads: ``3 * target_hidden`` (EAGLE-3) or ``H`` (EAGLE)."""
        return len(self.aux_layers) * self.target_hidden_size if self.kind == "eagle3" else self.target_hidden_size

    @property
    def fc_in_features(self) -> int:
        """Width of the fc's input: the features, plus the token embedding for EAGLE-1/2 heads."""
        return self.feature_size + (self.hidden_size if self.kind == "eagle" else 0)

    def to_json(self) -> dict[str, Any]:
        """The public config.json layout (EAGLE-3's ``LlamaForCausalLMEagle3``, EAGLE's ``LlamaForCausalLM``)."""
        out = dict(self.extra)
        d = asdict(self)
        for key in ("kind", "aux_layers", "extra"):
            d.pop(key)
        out.update(d)
        out["model_type"] = "llama"
        out["tie_word_embeddings"] = False
        if self.kind == "eagle3":
            out["architectures"] = ["LlamaForCausalLMEagle3"]
            out["eagle_config"] = {**out.get("eagle_config", {}), "eagle_aux_hidden_state_layer_ids": list(self.aux_layers)}
        else:
            out["architectures"] = ["LlamaForCausalLM"]
            out.pop("draft_vocab_size")
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], kind: str, num_verifier_layers: int) -> "HeadConfig":
        """Read a config.json; ``kind`` comes from the state dict (configs are not reliable about it)."""
        known = {"hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                 "head_dim", "num_hidden_layers", "rms_norm_eps", "rope_theta", "rope_scaling",
                 "max_position_embeddings", "hidden_act", "draft_vocab_size", "target_hidden_size",
                 "norm_before_residual"}
        if not isinstance(data, dict):
            raise ValueError(f"must hold a JSON object, not {type(data).__name__}")
        missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in data]
        if missing:
            raise ValueError(f"lacks {', '.join(missing)}")
        kwargs = {k: data[k] for k in known if data.get(k) is not None}
        kwargs.setdefault("num_key_value_heads", kwargs["num_attention_heads"])  # Llama's default: no grouping
        rope = data.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise ValueError(f"rope_parameters must be an object, got {rope!r}")
        if "rope_theta" not in kwargs and "rope_theta" in rope:
            kwargs["rope_theta"] = rope["rope_theta"]
        aux = aux_layer_ids(data)
        if kind == "eagle3":
            kwargs["aux_layers"] = aux if aux is not None else default_aux_layers(num_verifier_layers)
        extra = {k: v for k, v in data.items() if k not in known and k not in ("architectures", "model_type")}
        return cls(kind=kind, extra=extra, **kwargs)
