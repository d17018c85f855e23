"""Combining the contrastive loss with the reconstruction loss: none | dual | constraint.

    none        loss = L_con                                   (L_rec, if given, is only reported)
    dual        loss = L_con + β · L_rec
    constraint  loss = L_con + λ · (L_rec / η − 1)
    replay      loss = L_con + λ_t · (L_rec / η − 1), λ_t read from a given schedule (no ascent)

``replay`` is a control for ``constraint``: it applies the multipliers a constraint run logged, step
by step, as a fixed schedule, so the model sees the same (large, growing) weights λ_t/η on L_rec
without the feedback that made them. Both modes record the λ they applied at every step
(:attr:`LossCombiner.lambda_trace`), which rides along in the state dict so that a resumed run
keeps a complete trace; :mod:`.lambda_trace` writes it next to the run.

``constraint`` is the LTD paper's choice: instead of a fixed weight β, it asks for
``L_rec <= η`` and lets a Lagrange multiplier λ ≥ 0 find the weight. The Lagrangian is
minimised over the model and *maximised* over λ, whose gradient is the constraint gap
``g = L_rec/η − 1``: λ grows while the bound is violated (g > 0) and shrinks towards 0 once it
holds (g < 0), so the model stops paying for reconstruction it no longer needs.

How λ is updated (and why it is not part of the model's backward pass):

* The model's loss uses ``λ.detach()``: to the model λ is a constant weight.
* :meth:`LossCombiner.update` (called by the loop *after* the model's optimizer step) computes
  the gap from the *detached* L_rec, writes it as λ's gradient and steps λ's own optimizer,
  ``SGD(lr=5e-3, momentum=0.9, dampening=0.9, maximize=True)`` (gradient ascent). With
  dampening 0.9 the momentum buffer is an exponential moving average of the gap (buffer ←
  0.9·buffer + 0.1·g; PyTorch seeds it with the first g), the smoothing of Rezende & Viola's
  "Taming VAEs" that the paper's code reproduces.
* After every step λ is **projected in place** into ``[0, λ_max]`` (``clamp_`` on the stored
  parameter). The paper's code instead clamps in the forward pass with a straight-through
  gradient; then the stored value can run far outside the range ("wind-up") and λ stays stuck at
  the bound for as many steps as it took to wind up. Projection keeps the stored value in range,
  so λ moves as soon as the sign of the gap flips (after the EMA buffer turns, ~tens of steps).
* AMP: if the loop uses a ``GradScaler`` for the model, λ must not see scaled gradients or be
  skipped/unscaled with the model's optimizer. Because λ is detached from the loss, the scaled
  backward never writes ``λ.grad``; ``update`` builds λ's gradient itself from the unscaled,
  detached L_rec in float32, so it is independent of the loss scale. Do **not** pass λ's
  optimizer to ``scaler.step``. A non-finite L_rec (an overflowed half-precision step) is
  skipped with a warning, so λ never becomes NaN.
* With gradient accumulation call ``update`` once per optimizer step with the mean L_rec of the
  accumulated micro-batches.

``state_dict()`` includes λ and, via ``get_extra_state``, λ's optimizer state (the momentum
buffer), so a resumed run continues the exact λ trajectory. It works nested inside a parent
module too (the extra state is stored under ``<prefix>_extra_state``).
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from training import choices

logger = logging.getLogger(__name__)

COMBINE_MODES = choices.names(choices.CombineMode)


@dataclass(frozen=True)
class LambdaSettings:
    """How ``constraint`` mode's λ starts, moves and is bounded (the ``loss.lambda_*`` settings): its
    initial value, the learning rate, momentum and dampening of its SGD ascent, and the bound of its
    projection into ``[0, lambda_max]``."""

    lambda_init: float = 1.0
    lambda_lr: float = 5e-3
    lambda_momentum: float = 0.9
    lambda_dampening: float = 0.9
    lambda_max: float = 100.0


class LossCombiner(nn.Module):
    """Combine L_con and L_rec; in ``constraint`` mode owns λ and its optimizer.

    Loop usage::

        out = combiner(con["loss"], rec["loss"])      # dict: loss, l_con, l_rec[, lambda, gap]
        out["loss"].backward(); optimizer.step()      # (or the GradScaler equivalents)
        combiner.update(rec["loss"])                  # λ ascent step + projection (no-op otherwise)

    Keep the combiner out of the model's optimizer: λ has its own (``lambda_optimizer``), and a
    model optimizer with weight decay must never touch it. Checkpoint it separately
    (``combiner.state_dict()``, the checkpoint's ``constraint`` entry).
    """

    def __init__(
        self,
        mode: str,
        beta: float = 1.0,
        eta: float = 0.2,
        lam: LambdaSettings | None = None,
        schedule: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        """``lam``: λ's settings (None: the defaults of :class:`LambdaSettings`); ``schedule``: the λ of
        every step, for ``replay``."""
        super().__init__()
        lam = lam if lam is not None else LambdaSettings()
        lambda_init, lambda_lr, lambda_max = lam.lambda_init, lam.lambda_lr, lam.lambda_max
        lambda_momentum, lambda_dampening = lam.lambda_momentum, lam.lambda_dampening
        if mode not in COMBINE_MODES:
            raise ValueError(f"mode must be one of {COMBINE_MODES}, got {mode!r}")
        if not beta >= 0:
            raise ValueError(f"beta (weight of L_rec in 'dual' mode) must be >= 0, got {beta}")
        if not eta > 0:
            raise ValueError(f"eta (reconstruction bound in 'constraint' mode) must be > 0, got {eta}")
        if not lambda_max > 0:
            raise ValueError(f"lambda_max (upper bound of the multiplier) must be > 0, got {lambda_max}")
        if not 0 <= lambda_init <= lambda_max:
            raise ValueError(
                f"lambda_init must be in [0, lambda_max={lambda_max}], got {lambda_init}"
            )
        if not lambda_lr > 0:
            raise ValueError(f"lambda_lr must be > 0, got {lambda_lr}")
        if not 0 <= lambda_momentum < 1:
            raise ValueError(f"lambda_momentum must be in [0, 1), got {lambda_momentum}")
        if not 0 <= lambda_dampening <= 1:
            raise ValueError(f"lambda_dampening must be in [0, 1], got {lambda_dampening}")

        self.mode = mode
        self.beta = float(beta)
        self.eta = float(eta)
        self.lambda_max = float(lambda_max)
        self.lambda_optimizer: torch.optim.SGD | None = None
        self.schedule: Tensor | None = None
        self._trace: list[float] = []  # λ applied at each step (constraint and replay)
        if mode == "replay":
            if schedule is None or len(schedule) == 0:
                raise ValueError("mode='replay' needs a non-empty schedule of λ values, one per step")
            sched = torch.as_tensor(np.asarray(schedule, dtype=np.float32))
            if sched.dim() != 1 or not bool(torch.isfinite(sched).all()) or bool((sched < 0).any()):
                raise ValueError("the λ schedule must be a 1-D sequence of finite values >= 0")
            self.schedule = sched
        if mode == "constraint":
            # float32 whatever the model's dtype: λ's update must not lose precision.
            self.multiplier = nn.Parameter(torch.tensor(float(lambda_init), dtype=torch.float32))
            self.lambda_optimizer = torch.optim.SGD(
                [self.multiplier],
                lr=lambda_lr,
                momentum=lambda_momentum,
                dampening=lambda_dampening,
                maximize=True,  # gradient ASCENT on the Lagrangian
            )
        else:
            self.register_parameter("multiplier", None)

    # -- forward: the model's loss ---------------------------------------------------------
    def forward(self, l_con: Tensor, l_rec: Tensor | None = None) -> dict[str, Tensor]:
        """Return ``loss`` plus detached ``l_con``, ``l_rec`` (when given) and, in constraint
        mode, ``lambda`` (the value used) and ``gap`` (L_rec/η − 1)."""
        out: dict[str, Tensor] = {}
        if self.mode == "none":
            out["loss"] = l_con
        elif l_rec is None:
            raise ValueError(f"mode={self.mode!r} needs l_rec (only 'none' works without it)")
        elif self.mode == "dual":
            out["loss"] = l_con + self.beta * l_rec
        else:
            gap = l_rec.float() / self.eta - 1.0
            lam = self._applied_lambda().to(gap.device)  # a constant for the model's gradient
            out["loss"] = l_con + lam * gap
            out["lambda"] = lam
            out["gap"] = gap.detach()
        out["l_con"] = l_con.detach()
        if l_rec is not None:
            out["l_rec"] = l_rec.detach()
        return out

    def _applied_lambda(self) -> Tensor:
        """The λ of the current step: the multiplier (constraint) or the schedule's entry (replay)."""
        if self.schedule is None:
            return self.multiplier.detach().clone()
        t = len(self._trace)
        if t >= len(self.schedule):
            raise RuntimeError(f"the replayed λ schedule has {len(self.schedule)} steps; step {t + 1} needs more "
                               "(the source run was shorter than this one)")
        return self.schedule[t].clone()

    # -- update: the multiplier's ascent step ----------------------------------------------
    def update(self, l_rec: Tensor | float) -> None:
        """Record the λ this step applied; in ``constraint`` mode then take one gradient-ascent step
        on λ with gradient L_rec/η − 1 and project into [0, λ_max].

        No-op for ``none``/``dual``. Call once per optimizer step, after the model's step.
        """
        if self.mode in ("constraint", "replay"):
            self._trace.append(float(self._applied_lambda()))
        if self.lambda_optimizer is None:
            return
        value = l_rec.detach() if isinstance(l_rec, Tensor) else torch.tensor(l_rec)
        if value.numel() != 1:
            raise ValueError(f"l_rec must be a scalar, got shape {tuple(value.shape)}")
        gap = value.to(device=self.multiplier.device, dtype=torch.float32).reshape(()) / self.eta - 1.0
        if not torch.isfinite(gap):
            logger.warning("skipping lambda update: non-finite L_rec %s", value.item())
            return
        self.lambda_optimizer.zero_grad(set_to_none=True)
        self.multiplier.grad = gap.clone()
        self.lambda_optimizer.step()
        self.multiplier.grad = None
        with torch.no_grad():
            self.multiplier.clamp_(0.0, self.lambda_max)  # projection, in place: no wind-up

    @property
    def lambda_trace(self) -> np.ndarray:
        """float32 (steps,): the λ applied at every step so far (empty for ``none``/``dual``)."""
        return np.asarray(self._trace, dtype=np.float32)

    # -- checkpointing: λ's optimizer state rides along in state_dict() --------------------
    def get_extra_state(self) -> dict[str, Any]:
        # Deep copy: SGD updates its momentum buffer in place, and a snapshot must not change.
        opt_state = (
            None if self.lambda_optimizer is None else copy.deepcopy(self.lambda_optimizer.state_dict())
        )
        return {"mode": self.mode, "lambda_optimizer": opt_state,
                "lambda_trace": torch.tensor(self._trace, dtype=torch.float32)}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if state.get("mode") != self.mode:
            raise ValueError(
                f"state_dict was saved with mode={state.get('mode')!r}, this LossCombiner has "
                f"mode={self.mode!r}"
            )
        if self.lambda_optimizer is not None and state.get("lambda_optimizer") is not None:
            self.lambda_optimizer.load_state_dict(copy.deepcopy(state["lambda_optimizer"]))
        trace = state.get("lambda_trace")
        self._trace = [] if trace is None else [float(v) for v in torch.as_tensor(trace).reshape(-1)]

    def extra_repr(self) -> str:
        if self.mode == "dual":
            return f"mode='dual', beta={self.beta}"
        if self.mode == "constraint":
            return f"mode='constraint', eta={self.eta}, lambda_max={self.lambda_max}"
        if self.mode == "replay":
            return f"mode='replay', eta={self.eta}, steps={len(self.schedule)}"
        return "mode='none'"
