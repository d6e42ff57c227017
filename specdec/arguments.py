"""Turn ``model.generate``-style arguments into what the speculative loop needs.

We reuse transformers' own preparation (generation config merging, special tokens, max/min length,
logits processors, stopping criteria) so that the processed scores and the stop rules are exactly
those of ``model.generate``. These are private ``GenerationMixin`` helpers; they are pinned by the
``transformers>=5,<6`` requirement and covered by the exactness tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.configuration_utils import GenerationMode

from specdec.processing import RowProcessors, build_row_processors

# Arguments of model.generate that change *what* is generated in ways the speculative loop does not
# reproduce yet. Each raises instead of being silently ignored.
_UNSUPPORTED_KWARGS = {
    "assistant_model": "specdec replaces assisted generation; pass the drafter to specdec instead",
    "negative_prompt_ids": "classifier-free guidance runs the model inside a logits processor",
    "negative_prompt_attention_mask": "classifier-free guidance runs the model inside a logits processor",
    "inputs_embeds": "pass input_ids (the drafter needs token ids)",
    "past_key_values": "specdec manages its own preallocated cache",
    "cache": "specdec manages its own preallocated cache",  # past_key_values' name in newer transformers
    "synced_gpus": "multi-GPU synced generation is not supported",
    "custom_generate": "custom decoding loops cannot be combined with speculation",
    "prompt_lookup_num_tokens": "use specdec's drafters instead of transformers' prompt lookup",
    "assistant_tokenizer": "universal assisted decoding across tokenizers is not supported",
}
_UNSUPPORTED_CONFIG = {
    "num_beams": (1, "beam search"),
    "num_return_sequences": (1, "several return sequences"),
    "output_attentions": (False, "returning attentions"),
    "output_hidden_states": (False, "returning hidden states"),
    "guidance_scale": (None, "classifier-free guidance"),
    "token_healing": (False, "token healing"),
    "dola_layers": (None, "DoLa decoding"),
    "penalty_alpha": (None, "contrastive search"),
}


@dataclass
class GenerationSetup:
    """Everything the loop needs, prepared once per call."""

    config: GenerationConfig
    input_ids: torch.LongTensor
    attention_mask: torch.LongTensor | None
    processors: RowProcessors  # transformers' processors, the batch's and each row's
    stopping: StoppingCriteriaList
    pad_token_id: int | None
    has_eos_criteria: bool

    @property
    def do_sample(self) -> bool:
        return bool(self.config.do_sample)

    @property
    def max_length(self) -> int:
        return int(self.config.max_length)


def prepare_generation(
    model: Any,
    inputs: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    prefix_allowed_tokens_fn: Callable | None = None,
    tokenizer: Any = None,
    **kwargs: Any,
) -> GenerationSetup:
    """Validate ``generate`` arguments and build the processors and stopping criteria transformers would."""
    for name, why in _UNSUPPORTED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"specdec does not support `{name}`: {why}.")
    input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
    kwargs.pop("input_ids", None)
    if input_ids is None:
        raise ValueError("generate needs `input_ids` (a [batch, length] tensor of token ids); got none.")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.long, torch.int, torch.int32):
        raise TypeError(f"`input_ids` must be an integer tensor, got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.shape[1] == 0 or input_ids.shape[0] == 0:
        raise ValueError(
            f"`input_ids` must be a non-empty [batch, length] tensor, got shape {tuple(input_ids.shape)}: "
            "an empty prompt gives the model nothing to condition on."
        )
    input_ids = input_ids.long()

    has_default_max_length = (
        kwargs.get("max_length") is None
        and (generation_config is None or generation_config.max_length is None)
        and model.generation_config.max_length is None
    )
    has_default_min_length = (
        kwargs.get("min_length") is None
        and (generation_config is None or generation_config.min_length is None)
        and model.generation_config.min_length is None
    )
    config, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    for name, (default, what) in _UNSUPPORTED_CONFIG.items():
        value = getattr(config, name, default)
        if value is not None and value != default and not (name == "guidance_scale" and value == 1):
            raise NotImplementedError(f"specdec does not support {what} yet (`{name}={value}`).")
    mode = config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        raise NotImplementedError(f"specdec supports greedy search and sampling, not {mode.value}.")
    _validate_sampling(config)

    attention_mask = model_kwargs.pop("attention_mask", None)
    model_kwargs.pop("use_cache", None)
    unknown = sorted(k for k, v in model_kwargs.items() if v is not None)
    if unknown:
        raise NotImplementedError(f"specdec does not support these generate arguments: {', '.join(unknown)}.")

    batch_size, device = input_ids.shape[0], input_ids.device
    model._prepare_special_tokens(config, attention_mask is not None, device=device, batch_size=batch_size)
    if attention_mask is None:
        attention_mask = model._prepare_attention_mask_for_generation(input_ids, config, {})
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"`attention_mask` shape {tuple(attention_mask.shape)} does not match `input_ids` {tuple(input_ids.shape)}."
        )
    attention_mask = attention_mask.to(device).long()
    if (attention_mask.sum(dim=1) == 0).any():
        raise ValueError("a row of `attention_mask` is all zeros: that prompt is empty.")
    if (attention_mask[:, -1] == 0).any():
        raise ValueError("right padding detected: decoder-only generation needs left padding (tokenizer.padding_side='left').")

    length = input_ids.shape[1]
    config = model._prepare_generated_length(
        generation_config=config,
        has_default_max_length=has_default_max_length,
        has_default_min_length=has_default_min_length,
        model_input_name="input_ids",
        input_ids_length=length,
        inputs_tensor=input_ids,
    )
    model._validate_generated_length(config, length, has_default_max_length)
    if config.max_length <= length:
        raise ValueError(
            f"nothing to generate: max_length={config.max_length} but the prompt already has {length} tokens; "
            "set max_new_tokens."
        )
    processors = build_row_processors(
        model, config, input_ids, attention_mask,
        logits_processor if logits_processor is not None else LogitsProcessorList(), prefix_allowed_tokens_fn,
    )
    stopping = model._get_stopping_criteria(
        generation_config=config,
        stopping_criteria=stopping_criteria if stopping_criteria is not None else StoppingCriteriaList(),
        tokenizer=tokenizer,
    )
    pad = config._pad_token_tensor
    return GenerationSetup(
        config=config,
        input_ids=input_ids,
        attention_mask=None if bool((attention_mask == 1).all()) else attention_mask,
        processors=processors,
        stopping=stopping,
        pad_token_id=None if pad is None else int(pad),
        has_eos_criteria=any(hasattr(c, "eos_token_id") for c in stopping),
    )


def _validate_sampling(config: GenerationConfig) -> None:
    """Reject sampling arguments transformers would accept silently but that make no sense."""
    if config.temperature is not None and config.do_sample and config.temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {config.temperature}; use do_sample=False for greedy.")
    if config.top_p is not None and not 0 < config.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {config.top_p}.")
    if config.top_k is not None and config.top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {config.top_k}.")
    if config.repetition_penalty is not None and config.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {config.repetition_penalty}.")
