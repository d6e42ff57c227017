"""What an evaluation run is asked to do: :class:`EvalConfig`, the one argument of :func:`specdec.eval.run_eval`
besides the model, the tokenizer and the prompts."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from specdec.eval.methods import (
    DEFAULT_BASELINES,
    DEFAULT_DRAFT,
    DEFAULT_PROMPT_LOOKUP_TOKENS,
    HF,
    SPECDEC,
    MethodSpec,
    batchable,
    plan_methods,
)

#: how specdec's sampled eval calls are seeded (``EvalConfig.seeding``)
SEEDING = ("generator", "global")


@dataclass(frozen=True)
class EvalConfig:
    """Settings of one :func:`~specdec.eval.run_eval` run (``specdec eval`` builds one from its flags).

    Attributes:
        out_dir: where records and reports go; a rerun with the same directory resumes, and one with
            settings that change a measurement (``eval_config.json``: model, data set, dtype, device,
            generation and batch settings, compile settings, warm-up) or other text under a recorded
            prompt id is refused with a :class:`~specdec.eval.ResumeError` naming what differs.
        methods: :class:`~specdec.eval.MethodSpec` objects or their names (``"hf"``,
            ``"hf-assisted[self:int8]"``, ``"specdec[self:int8,k=4]"``); default: :func:`plan_methods`
            of ``baselines``, ``draft``, ``num_draft_tokens`` and ``adaptive``. ``hf`` is always run:
            speedups and identity are measured against it.
        draft: one drafter name or several, of any kind in the registry (:func:`specdec.draft_spec.forms` lists
            them: the built-ins and any added with :func:`specdec.drafters.register_drafter`), or a local model path.
        num_draft_tokens: one k or several.
        baselines: among ``hf``, ``hf-compiled``, ``hf-assisted``, ``hf-assisted-heuristic``,
            ``hf-prompt-lookup``, ``hf-mtp`` and any added with :func:`~specdec.eval.baselines.register_baseline`.
            ``hf-compiled`` compiles before timing (even with ``warmup=False``); ``summary.json`` reports its
            ``compile_seconds``, and every method's ``speedup_vs_hf_compiled``.
        tree: ``none`` or a tree mode (``static`` / ``dynamic`` / ``auto``, :data:`specdec.trees.modes.TREE_MODES`),
            or several: each specdec method is run with each
            (``none``: chains); summary entries add ``tree`` and ``mean_tree_tokens``.
        adaptive: also run each specdec method with adaptive draft length (up to its k); each record and
            summary entry has ``mean_draft_length`` (draft tokens proposed per verifier pass).
        max_new_tokens, do_sample, temperature, top_p, seed: generation settings for every method
            (greedy by default; each prompt gets seed ``seed + index`` when sampling).
        seeding: how specdec's sampled calls take that seed (:data:`SEEDING`): ``"generator"`` (a seeded
            ``torch.Generator`` per call: reproducible; ``tree="auto"`` and adaptive ``k`` then size from their cost
            models, each call afresh) or ``"global"`` (``torch.manual_seed`` and no generator, the call most users
            make: they learn from the clock and carry what they learnt across calls).
        chat: feed prompts through the tokenizer's chat template.
        prompt_lookup_num_tokens: ``prompt_lookup_num_tokens`` of ``hf-prompt-lookup``.
        batch_size: prompts per ``generate`` call, left padded into one batch (consecutive prompts).
            With more than one, throughput is the batch's (all new tokens over its wall time; each
            record gets a token-proportional share of its batch's seconds), identity is against HF
            ``generate`` on the same batch, and the HF speculative baselines (single-row only in
            transformers) are left out with a warning.
        compile_drafter: run specdec's model drafters through ``torch.compile`` (compiled in the warm-up).
        compile_verifier: specdec's verify passes through ``torch.compile`` (``SpeculativeModel(compile_verifier=True)``),
            every graph compiled before timing (warm-up or not); ``"both"`` runs each specdec method eagerly and
            compiled (``specdec[...,compiled]``), to compare them in one run. ``summary.json`` gives each specdec
            method's ``compile_verifier`` and ``verifier_compile_seconds``.
        json_schema: generate every prompt under its JSON schema (``Prompt.schema``; each method's ``generate``
            gets a fresh xgrammar logits processor, the grammars compiled before timing); every prompt must have one
            (:class:`~specdec.eval.json_schema.SchemaError` otherwise). Prompts with a schema get a ``valid`` record
            and a validity rate in the summary with or without it.
        warmup: one short untimed generation per method before the first timed one.
        progress: tqdm bar on stderr.
        plots: write PNG plots.
        overwrite: discard the results already in ``out_dir`` instead of resuming.
        model_name, dataset: recorded in ``summary.json``; they also guard resumes against mixing
            configurations.
        summary_config: more entries for ``summary.json``'s ``config`` (``specdec eval`` records its
            ``per_group``, drafters, draft lengths, baselines and command line there).
        draft_tokenizer: a local tokenizer directory for drafters whose vocabulary differs from the verifier's and
            that have none beside them (a tokenizer beside a drafter's model is found without it).
    """

    out_dir: str | os.PathLike
    methods: Sequence[MethodSpec | str] | None = None
    draft: str | Sequence[str] = DEFAULT_DRAFT
    num_draft_tokens: int | Sequence[int] = 4
    baselines: Sequence[str] = DEFAULT_BASELINES
    adaptive: bool = False
    tree: str | None | Sequence[str | None] = None
    verify: str | Sequence[str] = "token"
    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float | None = None
    top_p: float | None = None
    seed: int = 0
    seeding: str = "generator"
    chat: bool = True
    prompt_lookup_num_tokens: int = DEFAULT_PROMPT_LOOKUP_TOKENS
    batch_size: int = 1
    compile_drafter: bool = False
    compile_verifier: bool | str = False
    json_schema: bool = False
    warmup: bool = True
    progress: bool = True
    plots: bool = True
    overwrite: bool = False
    model_name: str | None = None
    dataset: str | None = None
    summary_config: Mapping[str, Any] | None = None
    draft_tokenizer: str | None = None

    def load_draft_tokenizer(self) -> Any:
        """The tokenizer ``draft_tokenizer`` names (a local directory), or None."""
        if self.draft_tokenizer is None:
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.draft_tokenizer, local_files_only=True)

    def check(self) -> None:
        """Raise ``ValueError`` for settings no run can use (checked by ``run_eval`` before any work)."""
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if self.seeding not in SEEDING:
            raise ValueError(f"seeding must be one of {SEEDING}, got {self.seeding!r}")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.compile_verifier not in (False, True, "both"):
            raise ValueError(f"compile_verifier must be False, True or 'both', got {self.compile_verifier!r}")

    def plan(self) -> list[MethodSpec]:
        """The methods of the run: ``methods`` (with ``hf`` first) or those planned from ``baselines``,
        ``draft`` and ``num_draft_tokens``; with ``batch_size`` > 1, without the single-row HF methods."""
        if self.methods is None:
            drafts = [self.draft] if isinstance(self.draft, str) else list(self.draft)
            ks = [self.num_draft_tokens] if isinstance(self.num_draft_tokens, int) else list(self.num_draft_tokens)
            trees = [self.tree] if self.tree is None or isinstance(self.tree, str) else list(self.tree)
            rules = [self.verify] if isinstance(self.verify, str) else list(self.verify)
            methods = plan_methods(self.baselines, drafts, ks, adaptive=self.adaptive, trees=trees,
                                   compiled=self.verifier_modes, verify=rules)
        else:
            parsed = [m if isinstance(m, MethodSpec) else MethodSpec.parse(m) for m in self.methods]
            parsed = [replace(m, compiled=c) if m.kind == SPECDEC and self.compile_verifier else m
                      for m in parsed for c in (self.verifier_modes if m.kind == SPECDEC else (m.compiled,))]
            methods = list(dict.fromkeys([MethodSpec(HF), *parsed]))
        return batchable(methods) if self.batch_size > 1 else methods

    @property
    def verifier_modes(self) -> tuple[bool, ...]:
        """Whether specdec methods run with eager and/or compiled verify passes (``compile_verifier``)."""
        return {False: (False,), True: (True,), "both": (False, True)}[self.compile_verifier]

    def generate_kwargs(self, tokenizer: Any) -> dict[str, Any]:
        """The ``generate`` arguments every method gets."""
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        kwargs: dict[str, Any] = dict(max_new_tokens=self.max_new_tokens, do_sample=self.do_sample, pad_token_id=pad)
        if self.do_sample:
            given = (("temperature", self.temperature), ("top_p", self.top_p))
            kwargs.update({k: v for k, v in given if v is not None})
        return kwargs
