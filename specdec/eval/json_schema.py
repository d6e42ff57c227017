"""JSON answers against schemas in ``specdec eval``: the grammar that constrains generation, and the validity check.

A prompt with a ``schema`` (:attr:`specdec.prompts.Prompt.schema`, e.g. the ``json-schema`` set) is checked
after generation by :func:`check_output`: its new text must parse as JSON and validate against the schema.
With ``--json-schema`` (``EvalConfig.json_schema``) every method also generates under the schema:
:class:`SchemaConstraints` compiles each schema once with xgrammar, before anything is timed, and hands each
``generate`` call a fresh ``xgrammar.contrib.hf.LogitsProcessor`` (it keeps per-call state: one per call).

>>> constraints = SchemaConstraints.for_model(model, tokenizer)
>>> constraints.compile_all([p.schema for p in prompts])          # untimed; cached per schema
>>> model.generate(ids, **constraints.generate_kwargs([prompt.schema]))
>>> check_output('{"name": "Ada"}', prompt.schema)                 # None: valid; else why not, in one line
"""

from __future__ import annotations

import importlib.util
import json
import time
from typing import Any, Iterable, Mapping, Sequence

from specdec.errors import SpecdecError
from specdec.prompts.wording import plural

#: longest reason :func:`check_output` gives (records stay small)
_REASON_CHARS = 200


class SchemaError(SpecdecError, ValueError):
    """Prompts cannot be generated under their schemas: one has none, one is not a valid JSON schema, or xgrammar
    is not installed."""


def _validator(schema: Mapping[str, Any]) -> Any:
    """A jsonschema validator of the draft ``schema`` declares (the latest draft when it declares none)."""
    from jsonschema.validators import validator_for

    return validator_for(schema)(schema)


def require_schemas(prompts: Sequence[Any]) -> None:
    """Raise :class:`SchemaError` (one line) unless every prompt has a valid JSON schema and xgrammar is there to
    generate under it (``--json-schema``; checked before a model loads)."""
    from jsonschema.exceptions import SchemaError as InvalidSchema
    from jsonschema.validators import validator_for

    missing = [p.id for p in prompts if getattr(p, "schema", None) is None]
    if missing:
        ids = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise SchemaError(f"--json-schema needs a JSON schema per prompt ('schema' field), and {len(missing)} of "
                          f"{plural(len(prompts), 'prompt')} {'has' if len(missing) == 1 else 'have'} none (id {ids}); use --dataset json-schema or a set whose "
                          "rows have a 'schema' object")
    for p in prompts:
        try:
            validator_for(p.schema).check_schema(p.schema)
        except InvalidSchema as err:
            raise SchemaError(f"prompt {p.id}: its 'schema' is not a valid JSON schema ({err.message})") from None
    if importlib.util.find_spec("xgrammar") is None:
        raise SchemaError("--json-schema generates with xgrammar, which is not installed: "
                          "pip install 'specdec[grammar]'")


def check_output(text: str, schema: Mapping[str, Any]) -> str | None:
    """Why ``text`` (an answer's new text) is not a JSON value valid under ``schema``, in one line; ``None`` when it is.

    Formats (``"format": "date"``) are not checked: the grammar does not enforce them either.
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return f"not JSON: {err.msg} at character {err.pos}"[:_REASON_CHARS]
    from jsonschema.exceptions import best_match

    error = best_match(_validator(schema).iter_errors(value))  # the most relevant error, or None
    if error is None:
        return None
    where = "/".join(map(str, error.absolute_path)) or "(root)"
    return " ".join(f"{where}: {error.message}".split())[:_REASON_CHARS]


def is_valid(text: str, schema: Mapping[str, Any]) -> bool:
    """Whether ``text`` parses as JSON and validates against ``schema``."""
    return check_output(text, schema) is None


def validity(text: str, schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """A record's validity fields: ``valid`` (``None`` without a schema) and ``invalid_reason``."""
    if schema is None:
        return {"valid": None, "invalid_reason": None}
    reason = check_output(text, schema)
    return {"valid": reason is None, "invalid_reason": reason}


def _key(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True)


class SchemaConstraints:
    """Schemas compiled into xgrammar grammars for one tokenizer, and a fresh logits processor per ``generate`` call.

    Args:
        tokenizer: the model's Hugging Face tokenizer (ignored when ``tokenizer_info`` is given).
        vocab_size: the model's vocabulary size (the width of its logits, which may exceed the tokenizer's).
        tokenizer_info: an ``xgrammar.TokenizerInfo`` to use instead (tests: a tiny vocabulary).
    """

    def __init__(self, tokenizer: Any = None, vocab_size: int | None = None, tokenizer_info: Any = None) -> None:
        import xgrammar as xgr

        if tokenizer_info is None:
            tokenizer_info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(tokenizer_info)
        self._compiled: dict[str, Any] = {}
        #: seconds spent compiling grammars so far (never inside a timed generation)
        self.compile_seconds = 0.0

    @classmethod
    def for_model(cls, model: Any, tokenizer: Any) -> "SchemaConstraints":
        """Constraints for ``model``'s vocabulary (``config.vocab_size``) and ``tokenizer``."""
        return cls(tokenizer, vocab_size=model.config.vocab_size)

    def compile(self, schema: Mapping[str, Any]) -> Any:
        """The compiled grammar of ``schema`` (compiled on first use, then cached)."""
        key = _key(schema)
        if key not in self._compiled:
            start = time.perf_counter()
            # a fixed layout ({"key": value, ...}): what a program wants, and the grammar then forces every key
            self._compiled[key] = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            self.compile_seconds += time.perf_counter() - start
        return self._compiled[key]

    def compile_all(self, schemas: Iterable[Mapping[str, Any]]) -> float:
        """Compile every schema now (before timing); returns the seconds this took."""
        before = self.compile_seconds
        for schema in schemas:
            self.compile(schema)
        return self.compile_seconds - before

    def logits_processor(self, schemas: Sequence[Mapping[str, Any]]) -> Any:
        """A fresh ``LogitsProcessorList`` constraining each row of a batch to its schema (``schemas``, one per row)."""
        from transformers import LogitsProcessorList
        from xgrammar.contrib.hf import LogitsProcessor

        grammars = [self.compile(s) for s in schemas]
        return LogitsProcessorList([LogitsProcessor(grammars[0] if len(grammars) == 1 else grammars)])

    def generate_kwargs(self, schemas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The ``generate`` arguments of one call whose rows answer under ``schemas``."""
        return {"logits_processor": self.logits_processor(schemas)}
