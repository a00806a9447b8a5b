"""One HYBRID decode step on the device, between the EAGLE draft and the verify forward.

Inputs: the EAGLE chain (tokens + per-step draft confidence) and the slot-indexed n-gram proposal buffers. Output:
the core's ``Decision``: the ``VerifyTree`` that ``verify_input.build_verify_input`` turns into SGLang's verify input,
at the verify width the host picked for this step, and the EAGLE depth and width bucket a later step should use.

    align n-gram proposals, prompt lookup for rows left without one (this module)
        -> sglang_hybrid.step.DecisionStep (calibrate, survivals, price, select)

The decision itself is the core's ``DecisionStep``, the same one the reference loop and the replay call; this
module only adds what is specific to the engine: the n-gram proposals arrive one step late and are aligned on the
device first, a row whose proposal did not align takes the device's prompt lookup over its committed tokens
(``context_lookup``; setting ``context_lookup``), and each request's online offsets on the EAGLE and n-gram sides'
calibrated acceptance (``request_bias``; settings ``model_bias_eta``, ``ngram_bias_eta``) live in slot-indexed
tables, tagged with the slot generation they were learned for, so a request that takes over a slot starts from the
calibration alone; the EAGLE calibration's per-depth temperatures are learned from every request's verify outcomes,
in place in the decision's tables (``online_calibration``; setting ``model_calibration_eta``). Kept apart
from the SGLang worker so it runs (and is tested) on CPU tensors with no SGLang objects. Static shapes, no host
sync: CUDA-graph and ``torch.compile`` safe.

Two paths compute the same step (setting ``decision_kernels``): the torch operators above (the reference, hundreds
of small launches a step) and ``sglang_hybrid.kernels``, which fuses alignment, prompt lookup, decision, counters and
the work after verify into Triton kernels whose outputs live in a ``Workspace`` reused from step to step (a step's
``Decision`` is valid until the next ``select``); ``auto`` takes the fused path wherever Triton runs.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from sglang_hybrid import kernels
from sglang_hybrid.calibration import ModelCalibration, NgramCalibration
from sglang_hybrid.cost import ContextCostModel, ContextCostTables, CostModel
from sglang_hybrid.online_calibration import OnlineTemperature
from sglang_hybrid.request_bias import chain_outcome, update_bias
from sglang_hybrid.selector import VerifyTree
from sglang_hybrid.step import Decision, DecisionStep, ModelDraft, NgramDraft
from sglang_hybrid.survival import chain_parents

from . import alignment, context_lookup
from .alternatives import FirstAlternatives, alternatives_outcome, step_alternatives, top_tokens
from .config import ENV_PREFIX, HybridConfigError, HybridSettings, resolved_ngram_bias_eta
from .metrics import HybridCounters

logger = logging.getLogger(__name__)


class HybridStep:
    """Per-worker device state (proposal buffers, calibration and cost tables) and the per-step selection."""

    def __init__(self, settings: HybridSettings, *, num_steps: int, pool_size: int, device,
                 counters: Optional[HybridCounters] = None, fixed_shapes: bool = False,
                 max_context_len: Optional[int] = None):
        self.settings = settings
        self.num_steps = num_steps
        self.k = settings.ngram_k
        #: EAGLE alternatives per chain position the worker hands ``select`` (setting ``eagle_alternatives``)
        self.alternatives = settings.eagle_alternatives
        #: position 0's alternatives per request slot, kept from the draft extend between steps
        #: (``alternatives.FirstAlternatives``); None when off
        self.first_alternatives = (FirstAlternatives(pool_size, self.alternatives, device) if self.alternatives
                                   else None)
        self.n_nodes = settings.resolved_n_nodes(num_steps)
        self.device = torch.device(device)
        #: verify widths the engine switches between (the last is the full width n_nodes + 1) and EAGLE draft depths
        #: (the last is num_steps); ``fixed_shapes``: one of each (DP attention: every DP rank must run the same shapes)
        self.depths, self.widths = settings.resolved_shapes(num_steps, fixed=fixed_shapes,
                                                            device_type=self.device.type)
        #: deepest draft path the configuration allows (model chain or n-gram chain; merge shares prefixes)
        self.max_depth = min(self.n_nodes, max(num_steps, self.k))
        #: tokens proposed and buffered per request: the host proposes one step late, and a step commits up to
        #: ``max_depth + 1`` tokens (accepted path + bonus), so ``k + max_depth + 1`` leaves a full ``k``-token chain
        #: after the shift even when the previous step accepted everything (see alignment.align)
        self.proposal_width = self.k + self.max_depth + 1
        model_cal = (ModelCalibration.load(settings.model_calibration) if settings.model_calibration
                     else ModelCalibration.identity())
        self.decide = DecisionStep(
            mode=settings.mode, n_nodes=self.n_nodes, model_calibration=model_cal.to(self.device),
            ngram_calibration=NgramCalibration.load(settings.ngram_calibration).to(self.device), widths=self.widths,
            depths=self.depths if len(self.depths) > 1 else None)
        #: the model calibration's per-depth temperatures learned online from every request's verify outcomes,
        #: deployment-wide, in place in the decision's tables (``online_calibration``; setting
        #: ``model_calibration_eta``; from a calibration file's temperatures where one is given, else 1), or None
        self.online_temperature = (OnlineTemperature(self.decide.model_cal, settings.model_calibration_eta)
                                   if settings.model_calibration_eta is not None else None)
        #: the same decision in three Triton kernels (setting ``decision_kernels``), or None: the torch operators;
        #: ``decision_fallback``: why "auto" took the torch operators (each such step a ``fallback_decision_torch``)
        self.fused, self.decision_fallback = _fused_decision(settings.decision_kernels, self.decide, self.device)
        if self.decision_fallback is not None:
            logger.warning("HYBRID fallback decision_torch: the decision runs on the torch operators (hundreds of "
                           "launches a step) although decision_kernels=auto asks for the fused Triton kernels: %s "
                           "(counted per step as fallback_decision_torch; %sDECISION_KERNELS=torch chooses it "
                           "explicitly)", self.decision_fallback, ENV_PREFIX)
        #: the fused step's outputs and scratch, kept across steps (``kernels.workspace``: no allocation per step once
        #: the largest batch has run; a step's decision is valid until the next ``select``)
        self.workspace = kernels.Workspace(self.device) if self.fused is not None else None
        #: the verify step-time table that prices slots (``set_cost``; None: no price), and its host copy
        self.cost = None
        self.cost_model = None
        #: the draft forward's step-time table that prices EAGLE depths (``set_draft_cost``; None: a fixed depth, or
        #: one still to be measured at start)
        self.draft_cost = None
        self.buffers = alignment.alloc_buffers(pool_size, self.proposal_width, max(2 * self.proposal_width, 16),
                                               self.device)
        #: committed tokens per slot for the device prompt lookup (``context_lookup``; needs the context length)
        self.context = (context_lookup.alloc_context(pool_size, max_context_len, self.device)
                        if settings.context_lookup and max_context_len else None)
        self.counters = counters if counters is not None else HybridCounters(self.device)
        if settings.cost_table:
            self.set_cost(CostModel.load(settings.cost_table), "file")
        if settings.draft_cost_table:
            self.set_draft_cost(CostModel.load(settings.draft_cost_table), "file")
        #: per slot: the online offset on the EAGLE side's calibrated logit (``request_bias``) and the slot generation
        #: it was learned for (-1: none yet); None when the setting ``model_bias_eta`` is off
        self.model_bias_eta = settings.model_bias_eta
        self._pool_size = pool_size
        self.model_bias, self.model_bias_gen = self._offset_buffers(self.model_bias_eta)
        #: the same for the n-gram side (setting ``ngram_bias_eta``): each request's offset on the n-gram table's
        #: calibrated logit, learned from how its n-gram chains fared. "auto" depends on the verify layout, which the
        #: worker decides later (``set_ngram_bias_eta``); until then, and outside the worker, off (the padded rule)
        self.set_ngram_bias_eta(resolved_ngram_bias_eta(settings.ngram_bias_eta, ragged=False))
        #: what ``after_verify`` counts and learns from, kept by ``select``: (slots, generations, model chain, offsets
        #: used or None, acceptances priced, the chain's draft probabilities or None without the online temperature)
        self._model_step: Optional[tuple] = None
        #: the n-gram side's: (chain tokens, length, offsets used or None, acceptances priced)
        self._ngram_step: Optional[tuple] = None
        #: the step's EAGLE chain, copied by ``select``: the draft's CUDA graph owns the tensor it hands over and
        #: overwrites it at its next replay (SGLang recycles graph outputs through a shared memory pool, and the
        #: draft-extend graph replays before ``after_verify`` reads the chain); static, so the copy is capturable
        self._chain = torch.zeros((pool_size, num_steps), dtype=torch.int64, device=self.device)

    def set_ngram_bias_eta(self, eta: Optional[float]) -> None:
        """Learn each request's n-gram offset at rate ``eta`` from now on (None: off), with the offsets at zero: the
        worker resolves ``ngram_bias_eta = "auto"`` once it knows whether verify runs ragged
        (``config.resolved_ngram_bias_eta``), before the first step and before the start-up memory check counts the
        offsets' buffers."""
        self.ngram_bias_eta = eta
        self.ngram_bias, self.ngram_bias_gen = self._offset_buffers(eta)

    def _offset_buffers(self, eta: Optional[float]) -> tuple:
        """One side's online offsets per request slot, zero, and the slot generation each was learned for (-1: none
        yet); ``(None, None)`` where that side's offset is off (``eta`` None)."""
        if eta is None:
            return None, None
        return (torch.zeros(self._pool_size, dtype=torch.float32, device=self.device),
                torch.full((self._pool_size,), -1, dtype=torch.int64, device=self.device))

    def restrict_widths(self, widths) -> None:
        """Decide among ``widths`` only from now on (a subset of ``self.widths`` that keeps the full width): the
        worker's start-up memory fit (``memory_budget.fit_widths_at_start``). Rebuilds the decision, whose bucket
        constants are fixed at construction; before the first step, so no decision in flight refers to the old
        buckets."""
        widths = tuple(sorted(set(int(w) for w in widths)))
        if not set(widths) <= set(self.widths) or widths[-1] != self.widths[-1]:
            raise ValueError(f"verify widths {widths} must be a subset of {self.widths} keeping the full width "
                             f"{self.widths[-1]}")
        if widths == self.widths:
            return
        self.widths = widths
        self.decide = self.decide.with_widths(widths)
        self.fused, self.decision_fallback = _fused_decision(self.settings.decision_kernels, self.decide,
                                                             self.device)

    def set_cost(self, table: CostModel, source: str) -> None:
        """Price verify slots with ``table`` from now on (``source``: "file", the setting ``cost_table``, or
        "measured" at start); the counters report which table it is."""
        self.cost = table.to(self.device)
        #: the same table on the host (start-up decisions read it: ``widths.paying_extras``; a ``ContextCostModel``
        #: as its table at the longer probe context)
        self.cost_model = table
        self.counters.cost_table = _table_summary(table, source)

    def set_draft_cost(self, table: CostModel, source: str) -> None:
        """Price EAGLE depths with ``table`` (one draft forward by batch size) from now on (``source`` as
        ``set_cost``); the counters report it as ``draft_cost_table``."""
        self.draft_cost = table.to(self.device)
        self.counters.draft_cost_table = _table_summary(table, source)

    def _follow_context(self, seq_lens: torch.Tensor) -> None:
        """Blend the tables measured at two contexts (``ContextCostTables``: the ones measured at start) at this
        batch's mean context, before the decision reads them: one launch on the fused path
        (``kernels.follow_context``), 23 operators a table on the torch path. Tables at one context (a user's)
        are left as they are."""
        cost = self.cost if isinstance(self.cost, ContextCostTables) else None
        draft = self.draft_cost if isinstance(self.draft_cost, ContextCostTables) else None
        if self.fused is not None:
            kernels.follow_context(seq_lens, cost, draft)
            return
        for table in (cost, draft):
            if table is not None:
                table.follow(seq_lens)

    def max_depth_at(self, width: int) -> int:
        """Deepest draft path a tree of ``width`` nodes (root included) can hold."""
        return min(self.max_depth, width - 1)

    def select(self, root_tokens: torch.Tensor, model_tokens: torch.Tensor, model_conf: torch.Tensor,
               slots: torch.Tensor, cur_gen: torch.Tensor, seq_lens: torch.Tensor,
               width: Optional[int] = None, lookup_span: Optional[int] = None,
               alt_tokens: Optional[torch.Tensor] = None, alt_conf: Optional[torch.Tensor] = None) -> Decision:
        """Decide the verify tree for a decode batch, between the EAGLE draft and the verify forward.

        Args:
            root_tokens: each request's last committed token (EAGLE's bonus token).
            model_tokens: the EAGLE chain, ``S`` tokens per request (``S`` one of ``depths``).
            model_conf: the draft softmax probability of each chain token.
            slots: each request's request-pool slot (the proposal buffers, the prompt lookup's table and the online
                offsets are slot-indexed).
            cur_gen: each slot's current generation: state tagged with another generation belongs to an earlier
                occupant of the slot and is not read.
            seq_lens: committed tokens in the KV cache (root excluded); the cost tables measured at start are
                blended at their mean first (``_follow_context``).
            width: this step's verify width, one of ``widths`` (default: the full width), decided on the host from
                an earlier step's ``Decision.next_width``.
            lookup_span: positions of each request's context the prompt lookup reads, from ``lookup_span`` on the
                host (a few static values; a row with more committed tokens gets no lookup proposal); None: the
                whole table.
            alt_tokens: setting ``eagle_alternatives``: the draft model's next ``M`` tokens at each chain position,
                distinct from each other and from the chain's token there (``ModelDraft.alt_tokens``); with
                ``alt_conf``, both or neither.
            alt_conf: their draft probabilities.

        Returns:
            The core's ``step.Decision``: ``tree`` is ``width`` wide, ``next_width`` / ``next_depth`` are the width
            bucket and EAGLE depth a later step should use. On the fused path its tensors live in the step's
            ``Workspace`` and are valid until the next ``select``.

        Shapes:
            root_tokens, slots, cur_gen, seq_lens: ``[B]``, integer.
            model_tokens: ``[B, S]``, integer; model_conf: ``[B, S]``, floating.
            alt_tokens / alt_conf: ``[B, S, M]``, integer / floating.
            Decision: as ``step.Decision``, with ``K = ngram_k`` n-gram columns and ``W = width``.

        Why here and not in the worker: the n-gram side arrives one step late and must be aligned on the device
        first (rows that did not align take the device prompt lookup, setting ``context_lookup``), and the online
        offsets live in slot-indexed tables; this method adds exactly that around the core ``DecisionStep`` (or its
        fused kernels, setting ``decision_kernels``), on plain tensors, so it runs and is tested on the CPU with no
        SGLang objects. Static shapes, no host sync.
        """
        b, s = model_tokens.shape
        dev = model_tokens.device
        k = self.k           # the aligned proposal is up to proposal_width long; the selector sees its first k
        self._follow_context(seq_lens)
        if self.fused is not None:
            ng, from_lookup, bias, ngram_bias = kernels.fused_proposals(
                self.buffers, self.context, slots, cur_gen, seq_lens, root_tokens, lookup_span, self.model_bias,
                self.model_bias_gen, self.ngram_bias, self.ngram_bias_gen, workspace=self.workspace)
            # chains only: the fused decision reads no parents, and clamps the length to the k columns it sees
            ngram = NgramDraft(ng.tokens[:, :k], None, ng.length, ng.match_len[:, :k], ng.count[:, :k],
                               ng.total[:, :k], ng.depth[:, :k], ng.source[:, :k])
            chain = self._chain[:b, :s]
            # the chain's probabilities, for the online temperature after verify: copied by the decision's kernel, as
            # the chain is (the draft's graph may overwrite its own)
            conf = (self.workspace.take("model_conf", (b, s), torch.float32) if self.online_temperature is not None
                    else None)
            d = self.fused(root_tokens, model_tokens, model_conf, ngram, cost=self.cost, width=width,
                           draft_cost=self.draft_cost, model_bias=bias, ngram_bias=ngram_bias, counters=self.counters,
                           from_lookup=from_lookup, chain_out=chain, workspace=self.workspace, alt_tokens=alt_tokens,
                           alt_conf=alt_conf, conf_out=conf)
            self.counters.on_select_host(d.tree.tokens.shape[1], depth=s, decision="fused")
        else:
            alignment.ring_write_root(self.buffers, slots, seq_lens, root_tokens)
            ng = alignment.align(self.buffers, slots, cur_gen, seq_lens)
            from_lookup = None
            if self.context is not None:
                ng, from_lookup = self._fill_from_context(ng, slots, cur_gen, seq_lens, root_tokens, lookup_span)
            model = ModelDraft(model_tokens, model_conf, torch.full((b,), s, dtype=torch.int64, device=dev),
                               alt_tokens, alt_conf)
            ngram = NgramDraft(ng.tokens[:, :k], chain_parents(b, k, dev), ng.length.clamp(max=k),
                               ng.match_len[:, :k], ng.count[:, :k], ng.total[:, :k], ng.depth[:, :k],
                               ng.source[:, :k])
            bias = _slot_offsets(self.model_bias, self.model_bias_gen, slots, cur_gen)
            ngram_bias = _slot_offsets(self.ngram_bias, self.ngram_bias_gen, slots, cur_gen)
            d = self.decide(root_tokens, model, ngram, cost=self.cost, check_values=False, width=width,
                            draft_cost=self.draft_cost, model_bias=bias, ngram_bias=ngram_bias)
            self.counters.on_select(d.tree, ngram.length, d.lam, d.b_star, depth=s, from_lookup=from_lookup,
                                    decision="torch")
            if self.decision_fallback is not None:
                self.counters.on_fallback("decision_torch", 1)
            chain = self._chain[:b, :s]
            chain.copy_(model_tokens)
            conf = (model_conf.to(torch.float32).clamp(0.0, 1.0) if self.online_temperature is not None else None)
        self._model_step = (slots, cur_gen, chain, bias, d.model_acceptance, conf)
        self._ngram_step = ((ngram.tokens, ngram.length, ngram_bias, d.ngram_acceptance)
                            if d.ngram_acceptance is not None else None)
        return d

    def lookup_span(self, longest_context: Optional[int]) -> Optional[int]:
        """Host side, before the step: the span ``select`` should give the prompt lookup for a batch whose committed
        tokens per request (root included, ``seq_lens + 1``) are at most ``longest_context`` (a host-known int; the
        worker's comes from SGLang's CPU sequence lengths), rounded up to a power of two
        (``context_lookup.context_span``: one static shape per power, so a compiled or captured step has a few
        variants, not one per length). None when unknown or without the lookup (the whole table)."""
        if self.context is None or longest_context is None:
            return None
        return context_lookup.context_span(longest_context, self.context.tokens.shape[1] - 1)

    def _fill_from_context(self, ng: alignment.AlignedProposals, slots, cur_gen, seq_lens, root_tokens,
                           span: Optional[int]):
        """Rows without an aligned proposal take the prompt lookup's (none where the host has not written the row for
        this slot generation; features in the host drafter's terms, ``context_lookup``). Returns the proposals and
        the rows the lookup supplied. With ``span`` the lookup reads the batch's real contexts, not the table's whole
        context length, every step."""
        ones = torch.ones_like(seq_lens, dtype=torch.int64)
        context_lookup.write_rows(self.context, slots, seq_lens, root_tokens.reshape(-1, 1), ones)
        got = context_lookup.lookup(self.context, slots, seq_lens, cur_gen, ng.tokens.shape[1], span=span)
        return context_lookup.fill_missing(ng, got)

    def keep_first_alternatives(self, slots: torch.Tensor, gens: torch.Tensor, extend_probs: Optional[torch.Tensor],
                                hot_token_id: Optional[torch.Tensor] = None) -> None:
        """Keep the next step's position-0 alternatives (setting ``eagle_alternatives``) per request slot, for the
        requests of generations ``gens``: the top tokens of the draft extend's next-token probabilities
        ``extend_probs [B, V]`` (through the draft's vocabulary map ``hot_token_id``). None: the extend's logits did
        not match the batch (the worker's placeholder fallback); the slots' kept ones are dropped instead, so a later
        step never reads another position's. Nothing when the setting is off."""
        first = self.first_alternatives
        if first is None:
            return
        if extend_probs is None:
            first.gen[slots.to(torch.int64)] = -1
            return
        probs, tokens = top_tokens(extend_probs, first.m, hot_token_id)
        if self.fused is not None:
            kernels.record_alternatives(first, slots, gens, probs, tokens)
        else:
            first.record(slots, gens, probs, tokens)

    def step_alternatives(self, slots: torch.Tensor, gens: torch.Tensor, recorded_p: Optional[torch.Tensor],
                          recorded_i: Optional[torch.Tensor], chain: torch.Tensor) -> tuple:
        """This step's ``(alt_tokens, alt_conf)`` ``[B, S, M]`` for ``select`` (``alternatives.step_alternatives``):
        position 0 from the kept table, later positions from the draft forwards' records ``recorded_p`` /
        ``recorded_i`` ``[B, >= S, M + 1]``; ``(None, None)`` when the setting is off."""
        if self.first_alternatives is None:
            return None, None
        if self.fused is not None:
            return kernels.step_alternatives(self.first_alternatives, slots, gens, recorded_p, recorded_i, chain,
                                             workspace=self.workspace)
        return step_alternatives(self.first_alternatives, slots, gens, recorded_p, recorded_i, chain)

    def after_verify(self, tree: VerifyTree, slots: torch.Tensor, seq_lens_before: torch.Tensor,
                     emitted: torch.Tensor, accept_lens: torch.Tensor) -> None:
        """Record emitted tokens (``emitted[b, :accept_lens[b]]``, bonus included) in the ring and the context table;
        count acceptance; see how each request's EAGLE chain and n-gram chain fared against them
        (``request_bias.chain_outcome``: known whatever tree was verified), count both, and learn the request's online
        model offset (``model_bias_eta``) and n-gram offset (``ngram_bias_eta``) from them, and from every request's
        EAGLE chain the model calibration's temperatures (``model_calibration_eta``, ``online_calibration``)."""
        model_step, self._model_step = self._model_step, None
        ngram_step, self._ngram_step = self._ngram_step, None
        if model_step is not None and model_step[0].shape != slots.shape:
            raise ValueError(f"after_verify got {slots.shape[0]} requests but the step selected for "
                             f"{model_step[0].shape[0]}: call it once per select, with the same batch")
        if self.alternatives and model_step is not None:
            if self.fused is not None:
                kernels.count_alternatives(self.counters, tree, model_step[2], emitted, accept_lens)
            else:
                self.counters.on_alternatives(*alternatives_outcome(tree, model_step[2], emitted, accept_lens))
        if self.fused is not None:
            kernels.fused_after_verify(self, tree, slots, seq_lens_before, emitted, accept_lens, model_step, ngram_step)
            return
        d = min(emitted.shape[1], self.max_depth + 1)
        alignment.ring_write_emitted(self.buffers, slots, seq_lens_before, emitted[:, :d], accept_lens)
        if self.context is not None:
            context_lookup.write_rows(self.context, slots, seq_lens_before.to(torch.int64) + 1, emitted[:, :d],
                                      accept_lens)
        self.counters.on_accept(tree, accept_lens)
        if model_step is not None:
            slots_m, gen, chain, bias, acceptance, conf = model_step
            gen = gen.to(torch.int64)
            length = torch.full_like(accept_lens, chain.shape[1], dtype=torch.int64)
            tested, hit = chain_outcome(chain, length, emitted, accept_lens.to(torch.int64))
            self.counters.on_chain_outcome("model", tested, hit, acceptance)
            if bias is not None:
                _learn_offsets(self.model_bias, self.model_bias_gen, slots_m, gen,
                               update_bias(bias, acceptance, tested, hit, self.model_bias_eta))
            if conf is not None:
                self.online_temperature.update(conf, tested, hit, acceptance)
            if ngram_step is not None:
                tokens, length, ngram_bias, ngram_acceptance = ngram_step
                tested, hit = chain_outcome(tokens, length.to(torch.int64).clamp(max=tokens.shape[1]), emitted,
                                            accept_lens.to(torch.int64))
                self.counters.on_chain_outcome("ngram", tested, hit, ngram_acceptance)
                if ngram_bias is not None:
                    _learn_offsets(self.ngram_bias, self.ngram_bias_gen, slots_m, gen,
                                   update_bias(ngram_bias, ngram_acceptance, tested, hit, self.ngram_bias_eta))


def _slot_offsets(table: Optional[torch.Tensor], gens: Optional[torch.Tensor], slots: torch.Tensor,
                  cur_gen: torch.Tensor) -> Optional[torch.Tensor]:
    """Each row's online offset from a slot-indexed ``table`` (one side's), 0 where the slot's offset was learned for
    another generation (a new request in the slot); None when that side learns none (``table`` None)."""
    if table is None:
        return None
    return torch.where(gens[slots] == cur_gen.to(torch.int64), table[slots], 0.0)


def _learn_offsets(table: torch.Tensor, gens: torch.Tensor, slots: torch.Tensor, gen: torch.Tensor,
                   updated: torch.Tensor) -> None:
    """Store one side's ``updated`` offsets in its slot-indexed ``table``, tagged with the generation ``gen`` of the
    request each slot holds."""
    table.index_copy_(0, slots, updated)
    gens.index_copy_(0, slots, gen)


def _table_summary(table: CostModel, source: str) -> dict:
    """What the counters report of a step-time table: where it came from and its entries (a ``ContextCostModel``'s
    at both probe contexts)."""
    out = {"source": source, "sizes": table.sizes.tolist(), "seconds": table.seconds.tolist(), "meta": dict(table.meta)}
    if isinstance(table, ContextCostModel):
        out.update(short_context=table.short_context, long_context=table.long_context,
                   short_seconds=table.short_seconds.tolist())
    return out


def _fused_decision(choice: str, decide: DecisionStep, device: torch.device):
    """The fused decision for setting ``decision_kernels`` = ``choice`` and, where "auto" falls back to the torch
    operators, why (``kernels.unavailable_reason``): "torch" -> (None, None); "auto" -> (fused, None) where Triton runs
    on ``device``, else (None, why); "fused" -> fused, or an error naming the setting where Triton cannot run."""
    if choice == "torch":
        return None, None
    why = kernels.unavailable_reason(device)
    if why is None:
        return kernels.FusedDecisionStep(decide, device), None
    if choice == "fused":
        raise HybridConfigError(
            f"HYBRID setting 'decision_kernels' = 'fused' but Triton cannot run on {device}: {why}; or set "
            f"{ENV_PREFIX}DECISION_KERNELS=auto or torch")
    return None, why
